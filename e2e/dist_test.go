package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nbd-wtf/go-nostr"

	"github.com/grasp-sync/grasp-sync/deploy/validate"
	"github.com/grasp-sync/grasp-sync/pkg/testkit"
	"github.com/grasp-sync/grasp-sync/pkg/testkit/testrelay"
	"github.com/grasp-sync/grasp-sync/services/graspd"
	"github.com/grasp-sync/grasp-sync/services/graspd/configdoc"
)

// The release package (`make dist`, docs/deploy.md "On one host"), tested
// by `make test-dist`: GRASP_DIST_DEB names the .deb of this machine's
// architecture, GRASP_DIST_OLD_GRASPD the graspd binary of the previous
// version for the upgrade test. Without them these tests skip.

func distDeb(t *testing.T) string {
	t.Helper()
	deb := os.Getenv("GRASP_DIST_DEB")
	if deb == "" {
		t.Skip("SKIP: GRASP_DIST_DEB names no package; run `make test-dist`")
	}
	return deb
}

// unpackDeb extracts the package's files into a throwaway root, as dpkg
// would install them (dpkg-deb -x).
func unpackDeb(t *testing.T, deb string) string {
	t.Helper()
	root := t.TempDir()
	if out, err := exec.Command("dpkg-deb", "-x", deb, root).CombinedOutput(); err != nil {
		t.Fatalf("dpkg-deb -x: %v\n%s", err, out)
	}
	return root
}

func run(t *testing.T, name string, args ...string) string {
	t.Helper()
	out, err := exec.Command(name, args...).Output()
	if err != nil {
		var stderr []byte
		if ee, ok := errors.AsType[*exec.ExitError](err); ok {
			stderr = ee.Stderr
		}
		t.Fatalf("%s %s: %v\n%s%s", name, strings.Join(args, " "), err, out, stderr)
	}
	return string(out)
}

// The package holds the binaries, the unit, the env file (a conffile, not
// world-readable) and the docs with the expected modes, owned by root, and
// the maintainer scripts; its graspd names its commit and verifier.
func TestPackageContents(t *testing.T) {
	deb := distDeb(t)
	want := map[string]string{
		"./usr/bin/graspd":                            "-rwxr-xr-x",
		"./usr/bin/graspctl":                          "-rwxr-xr-x",
		"./lib/systemd/system/graspd.service":         "-rw-r--r--",
		"./etc/grasp-sync/graspd.env":                 "-rw-r-----",
		"./usr/share/doc/grasp-sync/README.md":        "-rw-r--r--",
		"./usr/share/doc/grasp-sync/deploy.md":        "-rw-r--r--",
		"./usr/share/doc/grasp-sync/configuration.md": "-rw-r--r--",
	}
	for _, s := range []string{"relay", "discovery", "planner", "fetcher", "ingester"} {
		want["./usr/libexec/grasp-sync/"+s] = "-rwxr-xr-x"
	}
	got := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(run(t, "dpkg-deb", "-c", deb)), "\n") {
		// -rwxr-xr-x root/root  123 2026-12-04 14:57 ./usr/bin/graspd
		f := strings.Fields(line)
		if len(f) < 6 {
			t.Fatalf("dpkg-deb -c line %q", line)
		}
		if f[1] != "root/root" {
			t.Errorf("%s owned by %s", f[len(f)-1], f[1])
		}
		got[f[len(f)-1]] = f[0]
	}
	for p, mode := range want {
		if got[p] != mode {
			t.Errorf("%s: mode %q, want %q", p, got[p], mode)
		}
	}
	info := run(t, "dpkg-deb", "-I", deb)
	for _, s := range []string{"postinst", "prerm", "postrm", "conffiles", "Package: grasp-sync"} {
		if !strings.Contains(info, s) {
			t.Errorf("dpkg-deb -I lacks %q:\n%s", s, info)
		}
	}
	ctrl := t.TempDir()
	run(t, "dpkg-deb", "-e", deb, ctrl)
	if b, _ := os.ReadFile(filepath.Join(ctrl, "conffiles")); strings.TrimSpace(string(b)) != "/etc/grasp-sync/graspd.env" {
		t.Errorf("conffiles %q", b)
	}
	root := unpackDeb(t, deb)
	v := run(t, filepath.Join(root, "usr/bin/graspd"), "--version")
	if !strings.HasPrefix(v, "graspd ") || !strings.Contains(v, "(commit ") || !strings.Contains(v, ", verifier ") || strings.Contains(v, "commit unknown") {
		t.Errorf("graspd --version = %q, want the stamped commit and the verifier", v)
	}
	t.Logf("packaged %s", strings.TrimSpace(v))
}

// envFile reads a systemd EnvironmentFile: assigned holds the VAR=value
// lines, commented the #VAR=value lines (the defaults).
func envFile(t *testing.T, path string) (assigned, commented map[string]string) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	assigned, commented = map[string]string{}, map[string]string{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		m, isComment := assigned, false
		if rest, ok := strings.CutPrefix(line, "#"); ok {
			line, m, isComment = rest, commented, true
		}
		name, val, ok := strings.Cut(line, "=")
		if !ok || strings.ContainsAny(name, " \t") || name == "" {
			if !isComment && line != "" {
				t.Errorf("env file line %q is neither a comment nor VAR=value", line)
			}
			continue
		}
		if _, dup := assigned[name]; dup {
			t.Errorf("%s appears twice", name)
		}
		if _, dup := commented[name]; dup {
			t.Errorf("%s appears twice", name)
		}
		m[name] = strings.Trim(val, `"`)
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return assigned, commented
}

// graspdVariables is every variable graspd reads, found by reflection over
// its configuration structs (deploy/validate), independently of the
// generator of the env file.
func graspdVariables(t *testing.T) map[string]bool {
	specs, err := validate.ServiceConfig("graspd")
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]bool{}
	for _, s := range specs {
		for _, n := range validate.EnvNames(s) {
			out[n] = true
		}
	}
	return out
}

// The packaged env file lists the settings of configdoc.EnvGroups (the
// ones an operator sets; graspd's tuning is on docs/configuration.md only),
// each a variable graspd reads; only the data directory is set, to the unit's state directory;
// every default in it loads; and graspctl's default NATS URL is the
// embedded NATS's default listen address, so graspctl needs no flags.
func TestPackagedEnvFile(t *testing.T) {
	root := unpackDeb(t, distDeb(t))
	assigned, commented := envFile(t, filepath.Join(root, "etc/grasp-sync/graspd.env"))
	real := graspdVariables(t)
	for _, g := range configdoc.EnvGroups {
		for _, name := range g.Names {
			if _, a := assigned[name]; a {
				continue
			}
			if _, c := commented[name]; !c {
				t.Errorf("the env file lacks %s", name)
			}
		}
	}
	for _, m := range []map[string]string{assigned, commented} {
		for name := range m {
			if !real[name] {
				t.Errorf("the env file names %s, which graspd does not read", name)
			}
		}
	}
	unit, err := os.ReadFile(filepath.Join(root, "lib/systemd/system/graspd.service"))
	if err != nil {
		t.Fatal(err)
	}
	if len(assigned) != 1 || assigned["GRASP_DATA_DIR"] != "/var/lib/grasp-sync" ||
		!strings.Contains(string(unit), "\nStateDirectory=grasp-sync\n") {
		t.Errorf("assigned %v: want only GRASP_DATA_DIR=/var/lib/grasp-sync, the unit's StateDirectory", assigned)
	}
	// Uncommented, every default loads.
	for name, val := range commented {
		if val != "" {
			t.Setenv(name, val)
		}
	}
	if _, err := graspd.LoadConfigs(); err != nil {
		t.Errorf("the env file's defaults do not load: %v", err)
	}
	help, _ := exec.Command(filepath.Join(root, "usr/bin/graspctl"), "--help").CombinedOutput()
	if listen := commented["GRASP_NATS_LISTEN"]; listen == "" || !strings.Contains(string(help), "nats://"+listen) {
		t.Errorf("graspctl --help does not default to the embedded NATS at %q:\n%s", listen, help)
	}
}

// daemon is a packaged graspd run the way systemd runs the unit: the env
// file's assignments, then the test's overrides, stopped with SIGTERM.
type daemon struct {
	cmd     *exec.Cmd
	log     string
	exited  chan struct{}
	relay   string // ws://
	nats    string // nats://
	metrics string
}

func startDaemon(t *testing.T, bin string, env Env) *daemon {
	t.Helper()
	d := &daemon{log: filepath.Join(t.TempDir(), "graspd.log"), exited: make(chan struct{}),
		relay: "ws://" + env["GRASP_RELAY_ADDR"], nats: "nats://" + env["GRASP_NATS_LISTEN"], metrics: env["GRASP_METRICS_ADDR"]}
	f, err := os.Create(d.log)
	if err != nil {
		t.Fatal(err)
	}
	d.cmd = exec.Command(bin)
	d.cmd.Env = processEnv(env, nil)
	d.cmd.Stdout, d.cmd.Stderr = f, f
	d.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := d.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { _ = d.cmd.Wait(); f.Close(); close(d.exited) }()
	t.Cleanup(func() {
		_ = d.cmd.Process.Kill()
		<-d.exited
	})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for {
		resp, err := http.Get("http://" + d.metrics + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return d
			}
		}
		select {
		case <-d.exited:
			t.Fatalf("graspd exited during start; log ends:\n%s", Tail(d.log, 20))
		case <-ctx.Done():
			t.Fatalf("graspd not ready; log ends:\n%s", Tail(d.log, 20))
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// stop sends SIGTERM (systemctl stop) and returns how long graspd took to
// exit, failing past the unit's TimeoutStopSec.
func (d *daemon) stop(t *testing.T) time.Duration {
	t.Helper()
	began := time.Now()
	if err := d.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-d.exited:
	case <-time.After(90 * time.Second):
		t.Fatalf("graspd did not stop within the unit's TimeoutStopSec (90 s); log ends:\n%s", Tail(d.log, 20))
	}
	if code := d.cmd.ProcessState.ExitCode(); code != 0 {
		t.Errorf("graspd exited %d after SIGTERM; log ends:\n%s", code, Tail(d.log, 20))
	}
	return time.Since(began)
}

// packagedEnv is the env file's assignments with the data directory and
// every port redirected for a test, the test relays allowlisted and the
// scenario timings shortened (BaseEnv).
func packagedEnv(t *testing.T, root, dataDir string) Env {
	assigned, _ := envFile(t, filepath.Join(root, "etc/grasp-sync/graspd.env"))
	env := Env{}
	for k, v := range assigned {
		env[k] = v
	}
	for k, v := range BaseEnv(dataDir) {
		env[k] = v
	}
	env["GRASP_RELAY_ADDR"], env["GRASP_NATS_LISTEN"], env["GRASP_METRICS_ADDR"] = freeAddr(t), freeAddr(t), freeAddr(t)
	return env
}

// skeleton is the walking-skeleton scenario of services/graspd's
// TestWalkingSkeleton: an announcement listing us and two remotes, a patch
// on one, an issue and its comment on the other, and an announcement that
// does not list us.
type skeleton struct {
	remote1, remote2 *testrelay.Relay
	ann, notOurs     *nostr.Event
	want             []*nostr.Event
	repo             string
}

func newSkeleton(t *testing.T, publicURL string) *skeleton {
	s := &skeleton{remote1: testrelay.Start(t, testrelay.Options{}), remote2: testrelay.Start(t, testrelay.Options{Negentropy: true})}
	owner, contributor, stranger := testkit.NewKey(), testkit.NewKey(), testkit.NewKey()
	s.ann = owner.Announcement("skeleton", []string{testkit.GraspCloneURL(publicURL, owner.PubKey, "skeleton")},
		[]string{publicURL, s.remote1.URL, s.remote2.URL}, nil)
	s.repo = testkit.RepoRef(owner.PubKey, "skeleton")
	patch := contributor.Patch(s.repo)
	issue := contributor.Issue(s.repo, "it breaks")
	comment := owner.Comment(issue, issue, "thanks, looking")
	s.notOurs = stranger.Announcement("elsewhere", []string{"https://git.example.org/" + stranger.PubKey + "/elsewhere.git"},
		[]string{s.remote1.URL}, nil)
	s.remote1.Add(t, patch, s.notOurs)
	s.remote2.Add(t, issue, comment)
	s.want = []*nostr.Event{patch, issue, comment}
	return s
}

// synced waits until our relay serves every event of the scenario and
// checks the foreign announcement is not there. (testrelay.QueryAll, not
// waitAllOnRelay: go-nostr's Relay.Close races its connection goroutine
// under -race.)
func (s *skeleton) synced(t *testing.T, d *daemon) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	ids := IDs(s.want...)
	for {
		got, err := testrelay.QueryAll(ctx, d.relay, nostr.Filter{IDs: ids})
		if err == nil && len(got) == len(ids) {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatalf("walking skeleton: %d of %d events on our relay (%v); log ends:\n%s", len(got), len(ids), err, Tail(d.log, 20))
		case <-time.After(200 * time.Millisecond):
		}
	}
	got, err := testrelay.QueryAll(ctx, d.relay, nostr.Filter{IDs: []string{s.notOurs.ID}})
	if err != nil || len(got) != 0 {
		t.Errorf("the announcement that does not list us: %d stored (%v)", len(got), err)
	}
}

// graspctl runs the packaged graspctl against the daemon's NATS.
func graspctl(t *testing.T, root string, d *daemon, args ...string) (string, int) {
	cmd := exec.Command(filepath.Join(root, "usr/bin/graspctl"), append(args, "--nats", d.nats)...)
	out, err := cmd.CombinedOutput()
	code := 0
	if ee, ok := errors.AsType[*exec.ExitError](err); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return string(out), code
}

// The packaged graspd, started with the packaged env file (data directory
// and ports redirected), serves NIP-11, syncs the walking skeleton, answers
// the packaged graspctl, and stops on SIGTERM within the unit's timeout.
func TestPackagedGraspdSyncs(t *testing.T) {
	root := unpackDeb(t, distDeb(t))
	env := packagedEnv(t, root, filepath.Join(t.TempDir(), "state"))
	public := "ws://" + env["GRASP_RELAY_ADDR"]
	s := newSkeleton(t, public)
	d := startDaemon(t, filepath.Join(root, "usr/bin/graspd"), env)

	req, _ := http.NewRequest(http.MethodGet, "http://"+env["GRASP_RELAY_ADDR"], nil)
	req.Header.Set("Accept", "application/nostr+json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var nip11 struct {
		Name          string `json:"name"`
		SupportedNIPs []any  `json:"supported_nips"`
	}
	err = json.NewDecoder(resp.Body).Decode(&nip11)
	resp.Body.Close()
	if err != nil || nip11.Name == "" || len(nip11.SupportedNIPs) == 0 {
		t.Fatalf("NIP-11: %+v, %v", nip11, err)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := testrelay.Publish(ctx, d.relay, s.ann); err != nil {
		t.Fatalf("publish announcement: %v", err)
	}
	s.synced(t, d)
	if out, code := graspctl(t, root, d, "status"); code != 0 || !strings.Contains(out, s.remote1.URL[len("ws://"):]) {
		t.Errorf("graspctl status: exit %d:\n%s", code, out)
	}
	took := d.stop(t)
	t.Logf("NIP-11 name %q; skeleton synced; graspd stopped %s after SIGTERM", nip11.Name, took.Round(time.Millisecond))
	if _, err := os.Stat(filepath.Join(env["GRASP_DATA_DIR"])); err != nil {
		t.Errorf("data directory: %v", err)
	}
}

// An upgrade keeps the data: what the previous version's graspd stored and
// indexed (GRASP_DIST_OLD_GRASPD) is served by the packaged one started on
// the same data directory, with the remote relays gone, so nothing can have
// been fetched again: the events from the store, the repository from the
// NATS index bucket.
func TestUpgradeKeepsData(t *testing.T) {
	root := unpackDeb(t, distDeb(t))
	old := os.Getenv("GRASP_DIST_OLD_GRASPD")
	if old == "" {
		t.Skip("SKIP: GRASP_DIST_OLD_GRASPD names no previous graspd; run `make test-dist`")
	}
	oldVersion := run(t, old, "--version")
	newVersion := run(t, filepath.Join(root, "usr/bin/graspd"), "--version")
	if oldVersion == newVersion {
		t.Fatalf("old and new graspd are the same build: %s", oldVersion)
	}
	data := filepath.Join(t.TempDir(), "state")
	env := packagedEnv(t, root, data)
	public := "ws://" + env["GRASP_RELAY_ADDR"]
	s := newSkeleton(t, public)

	d := startDaemon(t, old, env)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := testrelay.Publish(ctx, d.relay, s.ann); err != nil {
		t.Fatalf("publish announcement: %v", err)
	}
	s.synced(t, d)
	if out, code := graspctl(t, root, d, "explain", s.repo); code != 0 {
		t.Fatalf("old graspd: graspctl explain %s: exit %d\n%s", s.repo, code, out)
	}
	d.stop(t)
	s.remote1.Close()
	s.remote2.Close()

	d = startDaemon(t, filepath.Join(root, "usr/bin/graspd"), env)
	ids := append(IDs(s.want...), s.ann.ID)
	got, err := testrelay.QueryAll(ctx, d.relay, nostr.Filter{IDs: ids})
	if err != nil {
		t.Fatal(err)
	}
	var gotIDs []string
	for _, e := range got {
		gotIDs = append(gotIDs, e.ID)
	}
	for _, id := range ids {
		if !slices.Contains(gotIDs, id) {
			t.Errorf("event %s written by the old graspd is not served by the new one", id)
		}
	}
	out, code := graspctl(t, root, d, "explain", s.repo)
	if code != 0 || !strings.Contains(out, s.remote1.URL[len("ws://"):]) {
		t.Errorf("new graspd: the NATS index lost %s: graspctl explain exit %d\n%s", s.repo, code, out)
	}
	d.stop(t)
	t.Logf("upgrade %s → %s: %d events and the index entry kept", strings.TrimSpace(oldVersion), strings.TrimSpace(newVersion), len(got))
}
