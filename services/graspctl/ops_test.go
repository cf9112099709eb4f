package graspctl_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nbd-wtf/go-nostr"

	"github.com/grasp-sync/grasp-sync/pkg/bus"
	"github.com/grasp-sync/grasp-sync/pkg/syncstatus"
	"github.com/grasp-sync/grasp-sync/pkg/testkit"
	"github.com/grasp-sync/grasp-sync/pkg/testkit/testrelay"
	"github.com/grasp-sync/grasp-sync/services/graspctl"
	"github.com/grasp-sync/grasp-sync/services/graspd"
	"github.com/grasp-sync/grasp-sync/services/graspd/graspdtest"
)

// repoRoot is the repository root (deploy/ and docs/ live there).
const repoRoot = "../.."

// refusedURL is listed by the skeleton's announcement and refused by
// discovery (credentials in a relay URL).
const refusedURL = "wss://user:secret@relay.example"

// skeleton is graspd running the walking-skeleton scenario (docs/sync.md,
// "The pipeline"): one announcement listing two remote relays, a patch on the first, an
// issue and its comment on the second, all synced.
type skeleton struct {
	app              *graspd.App
	bus              *bus.Bus
	remote1, remote2 *testrelay.Relay
	owner, contrib   testkit.Key
	repo             string
}

func startSkeleton(t *testing.T) *skeleton {
	t.Helper()
	t.Setenv("GRASP_DATA_DIR", t.TempDir())
	t.Setenv("GRASP_NATS_LISTEN", "127.0.0.1:0") // graspctl connects over TCP like an operator
	t.Setenv("GRASP_RELAY_ADDR", "127.0.0.1:0")
	t.Setenv("GRASP_METRICS_ADDR", "127.0.0.1:0")
	t.Setenv("GRASP_RELAY_ALLOWLIST", "127.0.0.1")
	t.Setenv("GRASP_DISCOVERY_BATCH_WINDOW", "300ms")
	t.Setenv("GRASP_SHARDS", "4")
	app, _ := graspdtest.Start(t, nil)

	s := &skeleton{app: app, remote1: testrelay.Start(t, testrelay.Options{}),
		remote2: testrelay.Start(t, testrelay.Options{Negentropy: true}),
		owner:   testkit.NewKey(), contrib: testkit.NewKey()}
	ann := s.owner.Announcement("skeleton",
		[]string{testkit.GraspCloneURL(app.PublicURL(), s.owner.PubKey, "skeleton")},
		[]string{app.PublicURL(), s.remote1.URL, s.remote2.URL, refusedURL}, nil)
	s.repo = testkit.RepoRef(s.owner.PubKey, "skeleton")
	patch := s.contrib.Patch(s.repo)
	issue := s.contrib.Issue(s.repo, "it breaks")
	comment := s.owner.Comment(issue, issue, "thanks, looking")
	// An issue that expired (NIP-40) before we fetch it: the ingester refuses
	// it, so the refusal series the alerts use exist.
	expired := s.contrib.Issue(s.repo, "old news", testkit.WithTags(nostr.Tag{"expiration",
		strconv.FormatInt(time.Now().Add(-time.Hour).Unix(), 10)}))
	s.remote1.Add(t, patch)
	s.remote2.Add(t, issue, comment, expired)

	b, err := bus.Connect(context.Background(), app.NATSURL(), "graspctl-test", bus.DefaultNames(), bus.Security{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.Close)
	s.bus = b

	pctx, pcancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer pcancel()
	if err := testrelay.Publish(pctx, app.RelayURL(), ann); err != nil {
		t.Fatalf("publish announcement: %v", err)
	}
	// A note about nothing we host: our relay refuses it (GRASP-01).
	if err := testrelay.Publish(pctx, app.RelayURL(), testkit.NewKey().Note("hello")); err == nil {
		t.Error("our relay accepted an unrelated note")
	}
	waitStored(t, app, 20*time.Second, patch, issue, comment)
	// Events stored is not yet "Connected with the repo confirmed": the
	// planner records that when the batches' reports arrive.
	s.waitSnapshot(t, 20*time.Second, "both remotes Connected with the repository confirmed", func(snap *syncstatus.Snapshot) bool {
		for _, u := range []string{s.remote1.URL, s.remote2.URL} {
			r, ok := snap.Relay(u)
			if !ok || r.Status != "Connected" || r.ConfirmedRepos != 1 || r.ListedRepos != 1 {
				return false
			}
		}
		return true
	})
	return s
}

// waitSnapshot polls the sync status until cond holds.
func (s *skeleton) waitSnapshot(t *testing.T, wait time.Duration, what string, cond func(*syncstatus.Snapshot) bool) *syncstatus.Snapshot {
	t.Helper()
	deadline := time.Now().Add(wait)
	for {
		snap, err := syncstatus.Read(context.Background(), s.bus.JS, s.bus.Names)
		if err == nil && cond(snap) {
			return snap
		}
		if time.Now().After(deadline) {
			js, _ := json.MarshalIndent(snap, "", "  ")
			t.Fatalf("not within %s: %s (err %v); last snapshot:\n%s", wait, what, err, js)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func waitStored(t *testing.T, app *graspd.App, wait time.Duration, evts ...*nostr.Event) {
	t.Helper()
	deadline := time.Now().Add(wait)
	for {
		n := 0
		for _, e := range evts {
			if ok, err := app.Store().Has(context.Background(), e.ID); err != nil {
				t.Fatal(err)
			} else if ok {
				n++
			}
		}
		if n == len(evts) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d events stored within %s", n, len(evts), wait)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestOperatorViews runs graspd with the walking skeleton once and checks
// every operator view against it: graspctl status, explain, repos and tap,
// the metrics the dashboard and alerts use, and the HTML status page (over
// HTTP and in headless Chromium).
func TestOperatorViews(t *testing.T) {
	s := startSkeleton(t)
	ctx := context.Background()

	t.Run("status", func(t *testing.T) {
		var out bytes.Buffer
		if err := graspctl.Status(ctx, s.bus, graspctl.StatusOptions{}, &out); err != nil {
			t.Fatal(err)
		}
		t.Logf("graspctl status:\n%s", out.String())
		for _, u := range []string{s.remote1.URL, s.remote2.URL} {
			row := lineWith(out.String(), u)
			// RELAY STATUS HEALTH REPOS CONFIRMED PENDING ...
			f := strings.Fields(row)
			if len(f) < 6 || f[1] != "Connected" || f[3] != "1" || f[4] != "1" || f[5] != "0" {
				t.Errorf("status row of %s = %q, want Connected with 1 repo listed, 1 confirmed, 0 pending", u, row)
			}
		}
		if !strings.Contains(out.String(), "planner: ") || strings.Contains(out.String(), "NO LEADER") {
			t.Errorf("status does not name both leaders:\n%s", out.String())
		}
		out.Reset()
		if err := graspctl.Status(ctx, s.bus, graspctl.StatusOptions{JSON: true}, &out); err != nil {
			t.Fatal(err)
		}
		var snap syncstatus.Snapshot
		if err := json.Unmarshal(out.Bytes(), &snap); err != nil || len(snap.Relays) != 2 {
			t.Errorf("status --json = %s (err %v), want two relays", out.String(), err)
		}
		// The progress line's events-stored figure comes from graspd's
		// /metrics: the three synced events at least.
		if n, err := graspctl.StoredEvents(ctx, "http://"+s.app.MetricsAddr()+"/metrics"); err != nil || n < 3 {
			t.Errorf("StoredEvents = %v, %v; want at least 3", n, err)
		}
		// --watch redraws in place until cancelled.
		wctx, cancel := context.WithCancel(ctx)
		var watched testkit.LogBuffer
		done := make(chan error, 1)
		go func() {
			done <- graspctl.Status(wctx, s.bus, graspctl.StatusOptions{Watch: true, Interval: 10 * time.Millisecond}, &watched)
		}()
		for deadline := time.Now().Add(10 * time.Second); strings.Count(watched.String(), "\x1b[2J") < 3; {
			if time.Now().After(deadline) {
				cancel()
				t.Fatalf("status --watch drew %d times in 10s", strings.Count(watched.String(), "\x1b[2J"))
			}
			time.Sleep(5 * time.Millisecond)
		}
		cancel()
		if err := <-done; err != nil {
			t.Errorf("status --watch: %v", err)
		}
		if strings.Count(watched.String(), s.remote1.URL) < 3 {
			t.Errorf("status --watch did not redraw the table")
		}
	})

	t.Run("explain and repos", func(t *testing.T) {
		var out bytes.Buffer
		if err := graspctl.Explain(ctx, s.bus, s.repo, graspctl.ExplainOptions{RelayURL: s.app.RelayURL(), ServiceURL: s.app.PublicURL()}, &out); err != nil {
			t.Fatal(err)
		}
		t.Logf("graspctl explain:\n%s", out.String())
		for _, u := range []string{s.remote1.URL, s.remote2.URL} {
			if row := lineWith(out.String(), u); !strings.Contains(row, "Connected") || !strings.Contains(row, "confirmed") || !strings.Contains(row, "relays tag") {
				t.Errorf("explain row of %s = %q, want Connected, confirmed, listed by the relays tag", u, row)
			}
		}
		for url, verdict := range map[string]string{s.app.PublicURL(): "this service", refusedURL: "refused: relayurl: credentials", s.remote1.URL: "synced"} {
			found := false
			for _, l := range strings.Split(out.String(), "\n") {
				f := strings.Fields(l)
				found = found || len(f) >= 3 && f[0] == "relays" && f[1] == url && strings.HasPrefix(strings.Join(f[2:], " "), verdict)
			}
			if !found {
				t.Errorf("explain does not say %s for the announcement's %s", verdict, url)
			}
		}
		err := graspctl.Explain(ctx, s.bus, testkit.RepoRef(s.owner.PubKey, "nope"), graspctl.ExplainOptions{}, io.Discard)
		if !errors.Is(err, syncstatus.ErrUnknownRepo) {
			t.Errorf("explain of an unknown repo: %v, want ErrUnknownRepo", err)
		}
		out.Reset()
		if err := graspctl.Repos(ctx, s.bus, s.remote1.URL, false, &out); err != nil || !strings.Contains(out.String(), s.repo) {
			t.Errorf("repos --relay remote1 = %q (err %v), want the repository", out.String(), err)
		}
		out.Reset()
		if err := graspctl.Repos(ctx, s.bus, "ws://127.0.0.1:1", false, &out); err != nil || strings.Contains(out.String(), s.repo) {
			t.Errorf("repos --relay elsewhere = %q (err %v), want no repository", out.String(), err)
		}
	})

	t.Run("tap --from-start replays reports", func(t *testing.T) {
		tctx, cancel := context.WithCancel(ctx)
		var out, warnings testkit.LogBuffer
		done := make(chan error, 1)
		go func() {
			done <- graspctl.Tap(tctx, s.bus, graspctl.TapOptions{FromStart: true, Errors: &warnings,
				Filter: graspctl.TapFilter{Relay: s.remote1.URL}}, &out)
		}()
		deadline := time.Now().Add(10 * time.Second)
		for !strings.Contains(out.String(), `"type":"grasp.v1.FetchReport"`) && time.Now().Before(deadline) {
			time.Sleep(20 * time.Millisecond)
		}
		cancel()
		if err := <-done; err != nil {
			t.Fatalf("tap: %v", err)
		}
		if !strings.Contains(out.String(), `"type":"grasp.v1.FetchReport"`) {
			t.Fatalf("tap --from-start replayed no report of %s (warnings: %s):\n%s", s.remote1.URL, warnings.String(), out.String())
		}
		for _, l := range strings.Split(strings.TrimSpace(out.String()), "\n") {
			if !strings.Contains(l, s.remote1.URL) {
				t.Errorf("--relay %s let through %s", s.remote1.URL, l)
			}
		}
		t.Logf("replay warnings: %s", warnings.String())
	})

	t.Run("metrics of dashboards and alerts exist", func(t *testing.T) {
		exposed := scrape(t, "http://"+s.app.MetricsAddr()+"/metrics")
		documented := documentedMetrics(t)
		refs := referencedMetrics(t)
		if len(refs) < 10 {
			t.Fatalf("only %d metric references found in deploy/grafana and deploy/prometheus", len(refs))
		}
		for _, name := range refs {
			if !documented[name] {
				t.Errorf("%s is referenced by a dashboard or alert but not documented in docs/metrics.md", name)
			}
			if !exposed[name] {
				t.Errorf("%s is referenced by a dashboard or alert but not exposed by graspd's /metrics", name)
			}
		}
		for name := range exposed {
			if strings.HasPrefix(name, "grasp_") && !documented[name] {
				t.Errorf("%s is exposed but not documented in docs/metrics.md", name)
			}
		}
	})

	t.Run("every stage on the way to the store is observed", func(t *testing.T) {
		// The events synced above went relay → fetcher → stream → ingester →
		// store in graspd's own processes; each hop must have been timed,
		// fetch included (the fetcher's Grasp-Read-At header).
		counts := stageCounts(t, "http://"+s.app.MetricsAddr()+"/metrics")
		for _, stage := range []string{"fetch", "queue", "verify", "handoff", "decide", "store"} {
			if counts[stage] < 1 {
				t.Errorf("grasp_ingester_stage_seconds{stage=%q} observed %v times, want at least once (all: %v)", stage, counts[stage], counts)
			}
		}
	})

	pageURL := "http" + strings.TrimPrefix(s.app.RelayURL(), "ws") + "/"
	t.Run("status page over HTTP", func(t *testing.T) {
		req, _ := http.NewRequest("GET", pageURL, nil)
		req.Header.Set("Accept", "text/html,application/xhtml+xml")
		body := get(t, req, "text/html")
		checkRelayTable(t, body, s.remote1.URL, s.remote2.URL)
		if !strings.Contains(body, s.repo) || !strings.Contains(body, `http-equiv="refresh"`) {
			t.Errorf("status page lacks the repository or the refresh:\n%s", body)
		}
		if strings.Contains(body, "<script src") || strings.Contains(body, `<link rel="stylesheet"`) {
			t.Errorf("status page loads external assets")
		}
		req, _ = http.NewRequest("GET", pageURL, nil)
		req.Header.Set("Accept", "application/nostr+json")
		if nip11 := get(t, req, "application/nostr+json"); !strings.Contains(nip11, `"supported_grasps"`) {
			t.Errorf("NIP-11 = %s", nip11)
		}
	})

	t.Run("status page in headless Chromium", func(t *testing.T) {
		chromium := findChromium(t)
		cctx, cancel := context.WithTimeout(ctx, 60*time.Second)
		defer cancel()
		cmd := exec.CommandContext(cctx, chromium, "--headless", "--no-sandbox", "--disable-gpu",
			"--disable-background-networking", "--no-first-run", "--disable-dev-shm-usage",
			"--user-data-dir="+t.TempDir(), "--dump-dom", pageURL)
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		dom, err := cmd.Output()
		if err != nil {
			t.Fatalf("chromium: %v\n%s", err, stderr.String())
		}
		checkRelayTable(t, string(dom), s.remote1.URL, s.remote2.URL)
	})

	t.Run("tap follows a new issue", func(t *testing.T) {
		tctx, cancel := context.WithCancel(ctx)
		var out testkit.LogBuffer
		done := make(chan error, 1)
		ready := make(chan struct{})
		go func() {
			done <- graspctl.Tap(tctx, s.bus, graspctl.TapOptions{Ready: func() { close(ready) }}, &out)
		}()
		defer func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("tap: %v", err)
			}
		}()
		select {
		case <-ready:
		case err := <-done:
			t.Fatalf("tap ended before subscribing: %v", err)
		}
		issue := s.contrib.Issue(s.repo, "second problem")
		s.remote2.Add(t, issue)
		waitStored(t, s.app, 15*time.Second, issue)
		deadline := time.Now().Add(10 * time.Second)
		var have map[string]bool
		for {
			have = tapKinds(out.String(), issue.ID)
			if have["event"] && have["command"] && have["report"] || time.Now().After(deadline) {
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
		if !have["event"] || !have["command"] || !have["report"] {
			t.Fatalf("tap saw %v of the new issue's sync (want event, command, report); output:\n%s", have, out.String())
		}
	})
}

// lineWith returns the first line of text containing s.
func lineWith(text, s string) string {
	for _, l := range strings.Split(text, "\n") {
		if strings.Contains(l, s) {
			return l
		}
	}
	return ""
}

// tapKinds classifies tap lines about the issue: the event itself, and the
// control messages that follow it (any command or report after the event
// appeared, as the planner reacts to the new root).
func tapKinds(out, id string) map[string]bool {
	have := map[string]bool{}
	seenEvent := false
	for _, l := range strings.Split(out, "\n") {
		var tl graspctl.TapLine
		if json.Unmarshal([]byte(l), &tl) != nil {
			continue
		}
		switch {
		case tl.Event != nil && strings.Contains(string(tl.Event), id):
			have["event"], seenEvent = true, true
		case tl.Type == "grasp.v1.FetchCommand" && (seenEvent || strings.Contains(string(tl.Message), id)):
			have["command"] = true
		case tl.Type == "grasp.v1.FetchReport" && (seenEvent || strings.Contains(string(tl.Message), id)):
			have["report"] = true
		}
	}
	return have
}

var relayRow = regexp.MustCompile(`(?s)<tr data-relay="([^"]+)">(.*?)</tr>`)
var cell = regexp.MustCompile(`(?s)<td class="([^"]*)">(.*?)</td>`)

// checkRelayTable checks the page's relay table: each remote Connected with
// one repository listed and confirmed, none pending.
func checkRelayTable(t *testing.T, html string, urls ...string) {
	t.Helper()
	rows := map[string]map[string]string{}
	for _, m := range relayRow.FindAllStringSubmatch(html, -1) {
		cells := map[string]string{}
		for _, c := range cell.FindAllStringSubmatch(m[2], -1) {
			cells[strings.Fields(c[1] + " x")[0]] = strings.TrimSpace(c[2])
		}
		rows[m[1]] = cells
	}
	if len(rows) != len(urls) {
		t.Errorf("relay table has %d rows, want %d:\n%s", len(rows), len(urls), html)
	}
	for _, u := range urls {
		c, ok := rows[u]
		if !ok {
			t.Errorf("relay table lacks %s", u)
			continue
		}
		if c["status"] != "Connected" || c["listed"] != "1" || c["confirmed-repos"] != "1" || c["pending-repos"] != "0" {
			t.Errorf("relay row %s = %v, want Connected, 1 listed, 1 confirmed, 0 pending", u, c)
		}
	}
}

func get(t *testing.T, req *http.Request, wantType string) string {
	t.Helper()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 || !strings.HasPrefix(resp.Header.Get("Content-Type"), wantType) {
		t.Fatalf("GET %s (Accept %s) = %d %s, want 200 %s", req.URL, req.Header.Get("Accept"), resp.StatusCode, resp.Header.Get("Content-Type"), wantType)
	}
	return string(body)
}

// findChromium returns Debian's chromium, installing it when missing and
// running as root; otherwise the test is skipped, loudly.
func findChromium(t *testing.T) string {
	t.Helper()
	if p, err := exec.LookPath("chromium"); err == nil {
		return p
	}
	if os.Geteuid() == 0 {
		if _, err := exec.LookPath("apt-get"); err == nil {
			t.Log("chromium missing: apt-get install -y chromium")
			out, err := exec.Command("apt-get", "install", "-y", "chromium").CombinedOutput()
			if err != nil {
				t.Logf("apt-get install chromium: %v\n%s", err, out)
			}
			if p, err := exec.LookPath("chromium"); err == nil {
				return p
			}
		}
	}
	t.Skip("SKIP: chromium is not installed and could not be installed (apt-get install -y chromium as root); the HTTP-level status page test still ran")
	return ""
}

var metricName = regexp.MustCompile(`\bgrasp_[a-z0-9_]+`)

// baseName strips the series suffixes of histograms and summaries.
func baseName(n string) string {
	for _, suf := range []string{"_bucket", "_sum", "_count"} {
		if strings.HasSuffix(n, suf) {
			return strings.TrimSuffix(n, suf)
		}
	}
	return n
}

// referencedMetrics is every metric name the dashboards' and alert rules'
// expressions use.
func referencedMetrics(t *testing.T) []string {
	t.Helper()
	set := map[string]bool{}
	var files []string
	for _, g := range []string{"deploy/grafana/*.json", "deploy/prometheus/*.yaml", "deploy/prometheus/*.yml"} {
		m, _ := filepath.Glob(filepath.Join(repoRoot, g))
		files = append(files, m...)
	}
	if len(files) == 0 {
		t.Fatal("no dashboards or rules found under deploy/grafana and deploy/prometheus")
	}
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if strings.HasSuffix(f, ".json") && !json.Valid(data) {
			t.Errorf("%s is not valid JSON", f)
		}
		for _, n := range metricName.FindAllString(string(data), -1) {
			set[baseName(n)] = true
		}
	}
	out := make([]string, 0, len(set))
	for n := range set {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

// documentedMetrics is every metric named in a table row of docs/metrics.md.
func documentedMetrics(t *testing.T) map[string]bool {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(repoRoot, "docs/metrics.md"))
	if err != nil {
		t.Fatal(err)
	}
	set := map[string]bool{}
	for _, l := range strings.Split(string(data), "\n") {
		if strings.HasPrefix(l, "| `grasp_") {
			set[strings.Trim(strings.Fields(l)[1], "`")] = true
		}
	}
	return set
}

// stageCounts reads grasp_ingester_stage_seconds_count by stage off a
// /metrics page.
func stageCounts(t *testing.T, url string) map[string]float64 {
	t.Helper()
	counts := map[string]float64{}
	for _, l := range metricsLines(t, url) {
		rest, ok := strings.CutPrefix(l, `grasp_ingester_stage_seconds_count{stage="`)
		if !ok {
			continue
		}
		stage, value, ok := strings.Cut(rest, `"} `)
		if !ok {
			continue
		}
		n, err := strconv.ParseFloat(strings.TrimSpace(value), 64)
		if err != nil {
			t.Fatalf("%s: %v", l, err)
		}
		counts[stage] = n
	}
	return counts
}

// metricsLines returns the lines of a /metrics page.
func metricsLines(t *testing.T, url string) []string {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return strings.Split(string(body), "\n")
}

// scrape returns the metric family names of a /metrics page.
func scrape(t *testing.T, url string) map[string]bool {
	t.Helper()
	set := map[string]bool{}
	for _, l := range metricsLines(t, url) {
		if strings.HasPrefix(l, "# TYPE ") {
			set[strings.Fields(l)[2]] = true
		}
	}
	return set
}
