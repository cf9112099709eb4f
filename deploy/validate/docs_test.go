package validate

// The docs checked against the code, where a program can: every GRASP_
// variable a doc names is one something reads (or a documented former
// name), every decision record cited exists and the index lists each with
// its status, every package is in docs/architecture.md's table, every
// section a doc or comment cites by its heading is there, and every
// relative link in a doc leads to a file. Each failure names the file and
// the line.

import (
	"bufio"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/grasp-sync/grasp-sync/pkg/bus"
)

// skipDirs are never read: build output, dependencies, data, and
// docs/measurements, whose files record what was true when each run was
// made (settings and sections named there may be gone since).
var skipDirs = map[string]bool{
	".git": true, "node_modules": true, "bin": true, "data": true, "testdata": true,
	filepath.Join("docs", "measurements"): true,
}

// repoFile is one text file of the repository, by its path from the root.
type repoFile struct {
	path  string
	lines []string
}

// repoFiles reads every file under the repository root whose name keep
// accepts.
func repoFiles(t *testing.T, keep func(rel string) bool) []repoFile {
	t.Helper()
	var out []repoFile
	err := filepath.WalkDir(repoRoot, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(repoRoot, p)
		if d.IsDir() {
			if rel != "." && (skipDirs[rel] || skipDirs[d.Name()] || strings.HasPrefix(d.Name(), ".") && d.Name() != ".ci") {
				return filepath.SkipDir
			}
			return nil
		}
		if !keep(rel) {
			return nil
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		out = append(out, repoFile{path: filepath.ToSlash(rel), lines: strings.Split(string(b), "\n")})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func isDoc(rel string) bool { return strings.HasSuffix(rel, ".md") }

// isSource is every file a comment or a build step may cite a doc from.
func isSource(rel string) bool {
	base := filepath.Base(rel)
	switch {
	case base == "Makefile" || base == "Dockerfile" || strings.HasPrefix(base, "Dockerfile."):
		return true
	case strings.HasPrefix(rel, ".ci"+string(filepath.Separator)):
		return true
	}
	switch filepath.Ext(rel) {
	case ".go", ".proto", ".md", ".sh", ".yaml", ".yml", ".mjs", ".js", ".ts", ".service", ".env":
		return true
	}
	return false
}

var (
	envVarRE = regexp.MustCompile(`GRASP_[A-Z0-9_]*[A-Z0-9](_\*)?`)
	// A variable in the generated page: its table rows and its list of
	// former names.
	configRowRE = regexp.MustCompile("`(GRASP_[A-Z0-9_]+)`")
	// A name a program reads or sets: a string literal in Go or a shell
	// or Makefile assignment (benchmarks' and tests' switches).
	literalRE = regexp.MustCompile(`"(GRASP_[A-Z0-9_]+)["=]|\b(GRASP_[A-Z0-9_]+)=|\$\{?(GRASP_[A-Z0-9_]+)`)
)

// knownVars is every GRASP_ variable something reads: docs/configuration.md
// (generated from the configuration structs, current by configdoc's test,
// former names included) and the names tests, benchmarks, tools and the
// Makefile read.
func knownVars(t *testing.T) map[string]bool {
	t.Helper()
	known := map[string]bool{}
	cfg, err := os.ReadFile(filepath.Join(repoRoot, "docs", "configuration.md"))
	if err != nil {
		t.Fatal(err)
	}
	// Every name on the page: its rows, the former names their meanings
	// give, the variables no longer read.
	for _, m := range configRowRE.FindAllStringSubmatch(string(cfg), -1) {
		known[m[1]] = true
	}
	for _, name := range envVarRE.FindAllString(string(cfg), -1) {
		if !strings.HasSuffix(name, "_*") {
			known[name] = true
		}
	}
	// NATS stream names share the prefix in upper case (GRASP_EVENTS).
	names := reflect.ValueOf(bus.DefaultNames())
	for i := range names.NumMethod() {
		m := names.Method(i)
		if m.Type().NumIn() == 0 && m.Type().NumOut() == 1 && m.Type().Out(0).Kind() == reflect.String {
			if v := m.Call(nil)[0].String(); strings.HasPrefix(v, "GRASP_") {
				known[v] = true
			}
		}
	}
	if len(known) < 50 {
		t.Fatalf("docs/configuration.md names only %d variables: is it generated (make docs)?", len(known))
	}
	for _, f := range repoFiles(t, func(rel string) bool {
		ext := filepath.Ext(rel)
		return (ext == ".go" || ext == ".sh" || ext == ".mjs" || ext == ".js" || filepath.Base(rel) == "Makefile") &&
			!strings.HasSuffix(rel, ".md")
	}) {
		for _, l := range f.lines {
			for _, m := range literalRE.FindAllStringSubmatch(l, -1) {
				for _, g := range m[1:] {
					if g != "" {
						known[g] = true
					}
				}
			}
		}
	}
	return known
}

// TestDocsNameOnlyRealVariables: a doc naming a GRASP_ variable nothing
// reads sends an operator to set something that does nothing.
func TestDocsNameOnlyRealVariables(t *testing.T) {
	known := knownVars(t)
	for _, f := range repoFiles(t, isDoc) {
		if f.path == "docs/configuration.md" {
			continue
		}
		for i, l := range f.lines {
			for _, name := range envVarRE.FindAllString(l, -1) {
				if prefix, ok := strings.CutSuffix(name, "_*"); ok {
					if !slices.ContainsFunc(sortedKeys(known), func(k string) bool { return strings.HasPrefix(k, prefix+"_") }) {
						t.Errorf("%s:%d: names %s, but no variable starts with %s_ (docs/configuration.md, `make docs`)", f.path, i+1, name, prefix)
					}
					continue
				}
				if !known[name] {
					t.Errorf("%s:%d: names %s, which nothing reads: not in docs/configuration.md (generated from the configuration structs, former names included) nor read by a test or tool", f.path, i+1, name)
				}
			}
		}
	}
}

var (
	decisionPathRE = regexp.MustCompile(`decisions/(\d{4})-[a-z0-9-]+\.md`)
	decisionNumRE  = regexp.MustCompile(`\b[Dd]ecisions? (\d{4})\b`)
	decisionOldRE  = regexp.MustCompile(`docs/decisions\.md|\(decisions\.md\)`)
	recordNameRE   = regexp.MustCompile(`^(\d{4})-[a-z0-9-]+\.md$`)
)

// decisionRecords maps each record's number to its file name.
func decisionRecords(t *testing.T) map[string]string {
	t.Helper()
	entries, err := os.ReadDir(filepath.Join(repoRoot, "docs", "decisions"))
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, e := range entries {
		if e.Name() == "README.md" {
			continue
		}
		m := recordNameRE.FindStringSubmatch(e.Name())
		if m == nil {
			t.Errorf("docs/decisions/%s: a record is named NNNN-short-title.md", e.Name())
			continue
		}
		if prev, dup := out[m[1]]; dup {
			t.Errorf("docs/decisions/%s: number %s is also %s", e.Name(), m[1], prev)
		}
		out[m[1]] = e.Name()
	}
	return out
}

// TestDecisionCitationsExist: every record a comment or doc cites, by path
// or by number, exists; the retired single file is cited nowhere.
func TestDecisionCitationsExist(t *testing.T) {
	recs := decisionRecords(t)
	for _, f := range repoFiles(t, isSource) {
		for i, l := range f.lines {
			if decisionOldRE.MatchString(l) {
				t.Errorf("%s:%d: cites the single decisions file, which is now one record per decision: cite docs/decisions/NNNN-….md (index: docs/decisions/README.md)", f.path, i+1)
			}
			for _, m := range decisionPathRE.FindAllStringSubmatch(l, -1) {
				if recs[m[1]] != strings.TrimPrefix(m[0], "decisions/") {
					want := recs[m[1]]
					if want == "" {
						want = "no record has that number"
					} else {
						want = "record " + m[1] + " is " + want
					}
					t.Errorf("%s:%d: cites %s, which does not exist (%s)", f.path, i+1, m[0], want)
				}
			}
			for _, m := range decisionNumRE.FindAllStringSubmatch(l, -1) {
				if recs[m[1]] == "" {
					t.Errorf("%s:%d: cites decision %s, which does not exist (docs/decisions/README.md)", f.path, i+1, m[1])
				}
			}
		}
	}
}

var statusRE = regexp.MustCompile(`^- Status: (Accepted|Superseded)`)

// TestDecisionIndex: every record has a status and the index lists it
// with that status; numbers run without gaps.
func TestDecisionIndex(t *testing.T) {
	recs := decisionRecords(t)
	idx, err := os.ReadFile(filepath.Join(repoRoot, "docs", "decisions", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	nums := sortedKeys(recs)
	for i, n := range nums {
		if want := fmt.Sprintf("%04d", i+1); n != want {
			t.Errorf("docs/decisions: record %s follows %d records; numbers run 0001, 0002, … without gaps", recs[n], i)
			break
		}
	}
	for _, n := range nums {
		name := recs[n]
		b, err := os.ReadFile(filepath.Join(repoRoot, "docs", "decisions", name))
		if err != nil {
			t.Fatal(err)
		}
		var status string
		sc := bufio.NewScanner(strings.NewReader(string(b)))
		for sc.Scan() {
			if statusRE.MatchString(sc.Text()) {
				status = strings.TrimPrefix(sc.Text(), "- Status: ")
				break
			}
		}
		if status == "" {
			t.Errorf("docs/decisions/%s: no \"- Status: Accepted…\" or \"- Status: Superseded…\" line", name)
			continue
		}
		row := ""
		for _, l := range strings.Split(string(idx), "\n") {
			if strings.HasPrefix(l, "| "+n+" |") {
				row = l
			}
		}
		switch {
		case row == "":
			t.Errorf("docs/decisions/README.md: no row for %s", name)
		case !strings.Contains(row, "("+name+")"):
			t.Errorf("docs/decisions/README.md: the row of %s does not link %s", n, name)
		case !strings.Contains(row, statusHead(status)):
			t.Errorf("docs/decisions/README.md: the row of %s does not give its status %q", n, statusHead(status))
		}
	}
}

// TestEveryPackageInArchitecture: docs/architecture.md's package table
// names every package of the repository (binaries' package main under a
// cmd/ directory excepted: each service's is services/<name>/cmd/<name>).
func TestEveryPackageInArchitecture(t *testing.T) {
	arch, err := os.ReadFile(filepath.Join(repoRoot, "docs", "architecture.md"))
	if err != nil {
		t.Fatal(err)
	}
	table := string(arch)
	if i := strings.Index(table, "\n## Packages"); i >= 0 {
		table = table[i:]
		if j := strings.Index(table[1:], "\n## "); j >= 0 {
			table = table[:j+1]
		}
	} else {
		t.Fatal("docs/architecture.md: no \"## Packages\" section")
	}
	dirs := map[string]bool{}
	for _, f := range repoFiles(t, func(rel string) bool {
		return strings.HasSuffix(rel, ".go") && !strings.HasSuffix(rel, "_test.go")
	}) {
		d := filepath.ToSlash(filepath.Dir(f.path))
		if d == "." || strings.Contains("/"+d+"/", "/cmd/") || strings.HasPrefix(d, "interop") {
			continue
		}
		dirs[d] = true
	}
	for _, d := range sortedKeys(dirs) {
		if !strings.Contains(table, "`"+d+"`") {
			t.Errorf("docs/architecture.md: the package table (## Packages) has no row naming `%s`", d)
		}
	}
}

var (
	// A doc cited with the heading of one of its sections, on one line:
	// docs/sync.md, "Batches" or docs/sync.md ("Batches").
	sectionCiteRE = regexp.MustCompile(`((?:docs/)?[a-z-]+\.md),? \(?"([^"]+)"`)
	mdLinkRE      = regexp.MustCompile(`\]\(([^)#\s]+)(#[^)]*)?\)`)
)

// TestSectionCitationsExist: a doc cited by a section's heading has that
// section: a heading containing the words cited ("Secrets" finds
// "2. Secrets", "Publish rate" finds "Fit the publish rate to your relay").
func TestSectionCitationsExist(t *testing.T) {
	headings := map[string][]string{}
	headingsOf := func(doc string) []string {
		if h, ok := headings[doc]; ok {
			return h
		}
		b, err := os.ReadFile(filepath.Join(repoRoot, filepath.FromSlash(doc)))
		if err != nil {
			headings[doc] = nil
			return nil
		}
		var h []string
		for _, l := range strings.Split(string(b), "\n") {
			if strings.HasPrefix(l, "#") {
				h = append(h, normHeading(strings.TrimLeft(l, "# ")))
			}
		}
		headings[doc] = h
		return h
	}
	for _, f := range repoFiles(t, isSource) {
		for i, l := range f.lines {
			for _, m := range sectionCiteRE.FindAllStringSubmatch(l, -1) {
				doc := m[1]
				if !strings.HasPrefix(doc, "docs/") {
					if !strings.HasPrefix(f.path, "docs/") || strings.Count(f.path, "/") != 1 {
						continue // a name relative to somewhere else
					}
					doc = "docs/" + doc
				}
				hs := headingsOf(doc)
				if hs == nil {
					t.Errorf("%s:%d: cites %s, which does not exist", f.path, i+1, m[1])
					continue
				}
				want := normHeading(m[2])
				if !slices.ContainsFunc(hs, func(h string) bool { return strings.Contains(h, want) }) {
					t.Errorf("%s:%d: cites %s, %q: no heading of %s says so", f.path, i+1, m[1], m[2], doc)
				}
			}
		}
	}
}

// TestDocLinksResolve: every relative link in a doc leads to a file or
// directory of the repository.
func TestDocLinksResolve(t *testing.T) {
	for _, f := range repoFiles(t, isDoc) {
		for i, l := range f.lines {
			for _, m := range mdLinkRE.FindAllStringSubmatch(l, -1) {
				target := m[1]
				if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
					continue
				}
				p := filepath.Join(repoRoot, filepath.FromSlash(filepath.Dir(f.path)), filepath.FromSlash(target))
				if _, err := os.Stat(p); err != nil {
					t.Errorf("%s:%d: links %s, which does not exist", f.path, i+1, target)
				}
			}
		}
	}
}

// statusHead is a status up to its first explanation: "Accepted",
// "Superseded by [0021](…)", "Accepted, amended by …".
func statusHead(s string) string {
	if i := strings.IndexAny(s, ";:"); i >= 0 {
		s = s[:i]
	}
	return strings.TrimSuffix(strings.TrimSpace(s), ".")
}

var headingNumberRE = regexp.MustCompile(`^\d+\. `)

func normHeading(s string) string {
	s = strings.ReplaceAll(s, "`", "")
	s = strings.Join(strings.Fields(s), " ")
	return headingNumberRE.ReplaceAllString(strings.ToLower(strings.TrimSpace(s)), "")
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
