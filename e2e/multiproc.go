package e2e

import (
	"bufio"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/lib/pq"

	"github.com/grasp-sync/grasp-sync/pkg/store"
	"github.com/grasp-sync/grasp-sync/pkg/testkit"
)

// The multi-process mode of the architecture (one process per service, one
// NATS or a 3-node NATS cluster, a shared PostgreSQL store), run from a
// test: the real binaries, built from this workspace, as child processes.
// Nothing here is in-process, so a kill -9 of any one of them is the real
// thing.

// binaryPackages are the binaries a Deployment runs, by file name.
var binaryPackages = map[string]string{
	"relay":       "github.com/grasp-sync/grasp-sync/services/relay/cmd/relay",
	"discovery":   "github.com/grasp-sync/grasp-sync/services/discovery/cmd/discovery",
	"planner":     "github.com/grasp-sync/grasp-sync/services/planner/cmd/planner",
	"fetcher":     "github.com/grasp-sync/grasp-sync/services/fetcher/cmd/fetcher",
	"ingester":    "github.com/grasp-sync/grasp-sync/services/ingester/cmd/ingester",
	"graspctl":    "github.com/grasp-sync/grasp-sync/services/graspctl/cmd/graspctl",
	"nats-server": "github.com/nats-io/nats-server/v2", // the module the workspace pins
}

var (
	buildOnce sync.Once
	buildDir  string
	buildErr  error
)

// BuildBinaries builds the service binaries and nats-server once per
// process (the first caller pays, about 10 s with a warm build cache) and
// returns their directory. It must run inside the workspace (go test runs
// in the package directory). RemoveBinaries deletes them.
func BuildBinaries() (string, error) {
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "grasp-e2e-bin-")
		if err != nil {
			buildErr = fmt.Errorf("build dir: %w", err)
			return
		}
		args := []string{"build", "-o", dir + string(os.PathSeparator)}
		for _, pkg := range binaryPackages {
			args = append(args, pkg)
		}
		out, err := exec.Command("go", args...).CombinedOutput()
		if err != nil {
			_ = os.RemoveAll(dir)
			buildErr = fmt.Errorf("go %s: %w\n%s", strings.Join(args, " "), err, out)
			return
		}
		buildDir = dir
	})
	return buildDir, buildErr
}

// RemoveBinaries deletes what BuildBinaries built (TestMain calls it).
func RemoveBinaries() {
	if buildDir != "" {
		_ = os.RemoveAll(buildDir)
	}
}

// FreePort returns a TCP port free on 127.0.0.1 now (testkit.FreePort).
// Processes that must keep their address across restarts (the relay, which
// announcements name; NATS nodes, which routes name) get theirs up front
// this way.
func FreePort() (int, error) { return testkit.FreePort() }

// Proc is one child process of a Deployment: a binary with its arguments
// and environment that can be killed (SIGKILL) and started again with the
// same ones. Its stdout and stderr go to Log, appended across restarts.
type Proc struct {
	// Name identifies the process in logs and reports (planner, fetcher-1, nats-2).
	Name string
	// Log is the path of its log file.
	Log string
	// HealthURL answers 200 once the process is ready (/readyz of a
	// service, /healthz of a NATS node's monitor).
	HealthURL string
	// MetricsAddr serves /metrics; empty for NATS nodes.
	MetricsAddr string

	bin  string
	args []string
	env  []string

	mu  sync.Mutex
	cur *procRun
}

// procRun is one run of a Proc: the child and its exit.
type procRun struct {
	cmd    *exec.Cmd
	exited chan struct{} // closed once cmd.Wait returned
	err    error         // cmd.Wait's result, set before exited closes
}

// Start starts the process (it must not be running).
func (p *Proc) Start() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cur != nil {
		select {
		case <-p.cur.exited:
		default:
			return fmt.Errorf("start %s: already running (pid %d)", p.Name, p.cur.cmd.Process.Pid)
		}
	}
	f, err := os.OpenFile(p.Log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("start %s: log: %w", p.Name, err)
	}
	cmd := exec.Command(p.bin, p.args...)
	cmd.Env = p.env
	cmd.Stdout, cmd.Stderr = f, f
	// The child dies with the test process even when the test binary is
	// killed before its cleanups run: no leftovers.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	fmt.Fprintf(f, "=== e2e: start %s at %s\n", p.Name, time.Now().Format(time.RFC3339Nano))
	if err := cmd.Start(); err != nil {
		_ = f.Close()
		return fmt.Errorf("start %s: %w", p.Name, err)
	}
	r := &procRun{cmd: cmd, exited: make(chan struct{})}
	p.cur = r
	// The waiter is owned by the run: it ends when the child does, which
	// Kill (and the deployment's cleanup) guarantees.
	go func() {
		r.err = cmd.Wait()
		_ = f.Close()
		close(r.exited)
	}()
	return nil
}

// Running reports whether the process is started and has not exited.
func (p *Proc) Running() bool {
	p.mu.Lock()
	r := p.cur
	p.mu.Unlock()
	if r == nil {
		return false
	}
	select {
	case <-r.exited:
		return false
	default:
		return true
	}
}

// Pid is the current run's process id (0 when not started).
func (p *Proc) Pid() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cur == nil {
		return 0
	}
	return p.cur.cmd.Process.Pid
}

// Kill sends SIGKILL (no drain, no goodbye: kill -9) and waits for the
// process to be gone. Killing a process that is not running is a no-op.
func (p *Proc) Kill() error {
	p.mu.Lock()
	r := p.cur
	p.mu.Unlock()
	if r == nil {
		return nil
	}
	select {
	case <-r.exited:
		return nil
	default:
	}
	if err := r.cmd.Process.Signal(syscall.SIGKILL); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("kill %s: %w", p.Name, err)
	}
	select {
	case <-r.exited:
	case <-time.After(10 * time.Second):
		return fmt.Errorf("kill %s: still running 10s after SIGKILL", p.Name)
	}
	if f, err := os.OpenFile(p.Log, os.O_WRONLY|os.O_APPEND, 0o644); err == nil {
		fmt.Fprintf(f, "=== e2e: killed %s (SIGKILL) at %s\n", p.Name, time.Now().Format(time.RFC3339Nano))
		_ = f.Close()
	}
	return nil
}

// WaitReady polls HealthURL until it answers 200, the process exits (an
// error quoting the end of its log) or ctx ends.
func (p *Proc) WaitReady(ctx context.Context) error {
	for {
		p.mu.Lock()
		r := p.cur
		p.mu.Unlock()
		if r == nil {
			return fmt.Errorf("%s: not started", p.Name)
		}
		select {
		case <-r.exited:
			return fmt.Errorf("%s exited during start (%v); log ends:\n%s", p.Name, r.err, Tail(p.Log, 20))
		default:
		}
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, p.HealthURL, nil)
		if err != nil {
			return err
		}
		if resp, err := http.DefaultClient.Do(req); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s not ready at %s: %w; log ends:\n%s", p.Name, p.HealthURL, ctx.Err(), Tail(p.Log, 20))
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// Restart starts the process again (after Kill) and waits until it is
// ready, for at most a minute.
func (p *Proc) Restart() error {
	if err := p.Start(); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	return p.WaitReady(ctx)
}

// Tail returns the last n lines of the file at path (or why it cannot).
func Tail(path string, n int) string {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Sprintf("(%v)", err)
	}
	defer f.Close()
	var lines []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 4<<20)
	for sc.Scan() {
		lines = append(lines, sc.Text())
		if len(lines) > n {
			lines = lines[1:]
		}
	}
	return strings.Join(lines, "\n")
}

// DeploymentOptions shape a multi-process deployment.
type DeploymentOptions struct {
	// PostgresURL is the PostgreSQL server; the deployment creates a fresh
	// database on it and drops it at the end, so deployments never see each
	// other's events.
	PostgresURL string
	// Env overrides GRASP_* variables of every service (on top of the
	// shortened timings of BaseEnv).
	Env Env
	// Fetchers and Ingesters are the replica counts (default 1 each).
	Fetchers, Ingesters int
	// NATSNodes is 1 (default) or 3 (a JetStream cluster with R3 streams
	// and buckets).
	NATSNodes int
	// Auth runs the single NATS node with the manifests' configuration
	// (k8s/base/nats, with the generated auth.conf) and connects every
	// service as its own NATS user, as in Kubernetes (natsauth.go).
	Auth bool
}

// Deployment is grasp-sync in multi-process mode: NATS (one node or a
// 3-node cluster) and relay, discovery, planner, fetcher and ingester
// processes over a fresh PostgreSQL database. It is a Target. Every process
// is killed when the test ends; on failure the end of every log is printed.
type Deployment struct {
	// NATS are the NATS nodes; Relay … Ingesters the services.
	NATS      []*Proc
	Relay     *Proc
	Discovery *Proc
	Planner   *Proc
	Fetchers  []*Proc
	Ingesters []*Proc
	// StoreURL is the PostgreSQL database of this deployment.
	StoreURL string
	// Dir holds the logs and the NATS stores.
	Dir string

	relayAddr string
	store     *store.Store
	binDir    string
	natsURL   string    // client URL list, without credentials
	auth      *natsAuth // users and passwords with Auth, else nil
}

// StartDeployment starts a deployment and waits until every process is
// ready. It fails the test when anything does not start.
func StartDeployment(t testing.TB, o DeploymentOptions) *Deployment {
	t.Helper()
	bin, err := BuildBinaries()
	if err != nil {
		t.Fatalf("build binaries: %v", err)
	}
	if o.Fetchers <= 0 {
		o.Fetchers = 1
	}
	if o.Ingesters <= 0 {
		o.Ingesters = 1
	}
	if o.NATSNodes != 3 {
		o.NATSNodes = 1
	}
	if o.Auth && o.NATSNodes != 1 {
		t.Fatal("StartDeployment: Auth runs the manifests' single-node NATS configuration; a cluster with users is not supported")
	}
	if o.PostgresURL == "" {
		t.Fatal("StartDeployment: DeploymentOptions.PostgresURL is required (multi-process services share a PostgreSQL store)")
	}
	d := &Deployment{Dir: t.TempDir(), binDir: bin}
	d.StoreURL = FreshDatabase(t, o.PostgresURL)
	// Registered after the database's drop, so it runs before it: nothing
	// is connected when the database goes.
	t.Cleanup(func() { d.stopAll(t) })

	natsURL := d.addNATS(t, bin, o.NATSNodes, o.Auth)
	d.natsURL = natsURL
	relayPort := mustPort(t)
	d.relayAddr = "127.0.0.1:" + strconv.Itoa(relayPort)
	replicas := strconv.Itoa(o.NATSNodes)
	env := Env{}
	for k, v := range BaseEnv("") {
		env[k] = v
	}
	for _, k := range []string{"GRASP_DATA_DIR", "GRASP_NATS_LISTEN", "GRASP_METRICS_ADDR"} {
		delete(env, k)
	}
	for k, v := range (Env{
		"GRASP_NATS_URL":         natsURL,
		"GRASP_NATS_REPLICAS":    replicas,
		"GRASP_PARKING_REPLICAS": replicas,
		"GRASP_RELAY_ADDR":       d.relayAddr,
		"GRASP_PUBLIC_URL":       d.PublicURL(),
		"GRASP_STORE_URL":        d.StoreURL,
		"GRASP_LOG_LEVEL":        "info",
	}) {
		env[k] = v
	}
	if os.Getenv("GRASP_E2E_LOG") != "" {
		env["GRASP_LOG_LEVEL"] = "debug"
	}
	for k, v := range o.Env {
		env[k] = v
	}
	svc := func(name, binary string, extra Env) *Proc {
		port := mustPort(t)
		e := Env{"GRASP_METRICS_ADDR": "127.0.0.1:" + strconv.Itoa(port)}
		if d.auth != nil {
			// Each binary is its own NATS user, named after it.
			u, err := d.auth.userURL(natsURL, binary)
			if err != nil {
				t.Fatal(err)
			}
			e["GRASP_NATS_URL"] = u
		}
		for k, v := range extra {
			e[k] = v
		}
		addr := "127.0.0.1:" + strconv.Itoa(port)
		return &Proc{Name: name, Log: filepath.Join(d.Dir, name+".log"), HealthURL: "http://" + addr + "/readyz",
			MetricsAddr: addr, bin: filepath.Join(bin, binary), env: processEnv(env, e)}
	}
	// Start order follows the data flow's dependencies: the relay before
	// discovery (which subscribes to it), consumers before producers.
	d.Relay = svc("relay", "relay", nil)
	for i := range o.Ingesters {
		d.Ingesters = append(d.Ingesters, svc(fmt.Sprintf("ingester-%d", i), "ingester", nil))
	}
	for i := range o.Fetchers {
		// Stable replica names, as the StatefulSet gives them (k8s/base/fetcher.yaml).
		id := fmt.Sprintf("fetcher-%d", i)
		d.Fetchers = append(d.Fetchers, svc(id, "fetcher", Env{"GRASP_FETCHER_ID": id}))
	}
	d.Planner = svc("planner", "planner", Env{"GRASP_PLANNER_ID": "planner-0"})
	d.Discovery = svc("discovery", "discovery", Env{"GRASP_DISCOVERY_ID": "discovery-0"})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, p := range d.Services() {
		if err := p.Start(); err != nil {
			t.Fatal(err)
		}
		if err := p.WaitReady(ctx); err != nil {
			t.Fatal(err)
		}
	}
	// Ready is not enough: a service may fail right after /readyz first
	// answers (its run function's own setup comes after the NATS
	// connection that readiness checks).
	time.Sleep(time.Second)
	if err := d.CheckRunning(); err != nil {
		t.Fatal(err)
	}
	st, err := store.Open(d.StoreURL)
	if err != nil {
		t.Fatalf("open the deployment's store: %v", err)
	}
	d.store = st
	t.Cleanup(st.Close)
	return d
}

// addNATS starts n NATS nodes (a cluster when n > 1) and returns the
// client URL list the services get. With auth, the single node runs the
// manifests' configuration (manifestNATSConfig).
func (d *Deployment) addNATS(t testing.TB, bin string, n int, auth bool) string {
	t.Helper()
	type ports struct{ client, cluster, monitor int }
	ps := make([]ports, n)
	var routes, clients []string
	for i := range ps {
		ps[i] = ports{mustPort(t), mustPort(t), mustPort(t)}
		routes = append(routes, fmt.Sprintf("nats://127.0.0.1:%d", ps[i].cluster))
		clients = append(clients, fmt.Sprintf("nats://127.0.0.1:%d", ps[i].client))
	}
	for i, p := range ps {
		name := fmt.Sprintf("nats-%d", i)
		storeDir := filepath.Join(d.Dir, name)
		args := []string{"-a", "127.0.0.1", "-p", strconv.Itoa(p.client), "-m", strconv.Itoa(p.monitor),
			"-js", "-sd", storeDir, "-n", name}
		var env Env
		if auth {
			a, err := manifestNATSConfig(d.Dir, storeDir, p.client, p.monitor)
			if err != nil {
				t.Fatal(err)
			}
			d.auth, env = a, a.env
			args = []string{"-c", a.confPath}
		}
		if n > 1 {
			args = append(args, "--cluster_name", "grasp-e2e",
				"--cluster", routes[i], "--routes", strings.Join(routes, ","))
		}
		d.NATS = append(d.NATS, &Proc{Name: name, Log: filepath.Join(d.Dir, name+".log"),
			HealthURL: fmt.Sprintf("http://127.0.0.1:%d/healthz", p.monitor),
			bin:       natsServerBinary(bin), args: args, env: processEnv(env, nil)})
	}
	for _, p := range d.NATS {
		if err := p.Start(); err != nil {
			t.Fatal(err)
		}
	}
	// A cluster's nodes are healthy only once they see each other and
	// agree on a JetStream meta leader, so they start together first.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, p := range d.NATS {
		if err := p.WaitReady(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if n > 1 {
		monitors := make([]int, n)
		for i, p := range ps {
			monitors[i] = p.monitor
		}
		if err := waitRoutesSettled(ctx, monitors, n-1); err != nil {
			t.Fatal(err)
		}
	}
	return strings.Join(clients, ",")
}

// waitRoutesSettled waits until every node reports at least want routes
// and no node's route count changed for two seconds. A cluster answers
// /healthz before its pooled routes settle; the duplicate routes it then
// closes can drop JetStream API replies in flight, so services would start
// into a cluster still rearranging itself, which a long-running cluster
// never is. (See the report: the ingester does not survive that today.)
func waitRoutesSettled(ctx context.Context, monitors []int, want int) error {
	last := make([]int, len(monitors))
	var stable time.Time
	for {
		ok := true
		for i, port := range monitors {
			n, err := numRoutes(ctx, port)
			if err != nil || n < want {
				ok = false
			}
			if n != last[i] {
				last[i] = n
				ok = false
			}
		}
		switch {
		case !ok:
			stable = time.Time{}
		case stable.IsZero():
			stable = time.Now()
		case time.Since(stable) >= 2*time.Second:
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("NATS routes did not settle (last counts %v): %w", last, ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// numRoutes reads num_routes from a NATS node's /routez.
func numRoutes(ctx context.Context, monitorPort int) (int, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, fmt.Sprintf("http://127.0.0.1:%d/routez", monitorPort), nil)
	if err != nil {
		return 0, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	var rz struct {
		NumRoutes int `json:"num_routes"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&rz); err != nil {
		return 0, fmt.Errorf("routez: %w", err)
	}
	return rz.NumRoutes, nil
}

// Services are the service processes in start order.
func (d *Deployment) Services() []*Proc {
	out := []*Proc{d.Relay}
	out = append(out, d.Ingesters...)
	out = append(out, d.Fetchers...)
	return append(out, d.Planner, d.Discovery)
}

// Procs are every process: NATS nodes, then services.
func (d *Deployment) Procs() []*Proc {
	return append(append([]*Proc(nil), d.NATS...), d.Services()...)
}

// stopAll kills every process (services first, so they do not log NATS
// errors into the tails) and, if the test failed, prints each log's end.
func (d *Deployment) stopAll(t testing.TB) {
	procs := d.Procs()
	for i := len(procs) - 1; i >= 0; i-- {
		if procs[i] == nil {
			continue
		}
		if err := procs[i].Kill(); err != nil {
			t.Error(err)
		}
	}
	// Under the shipped permissions, anything NATS refused is a defect:
	// the code does something its generated permissions do not allow.
	if d.auth != nil {
		if denials := d.PermissionDenials(); len(denials) > 0 {
			t.Errorf("NATS refused %d operations under the shipped permissions (k8s/base/nats/auth.conf, regenerate with deploy/validate):\n%s",
				len(denials), strings.Join(firstN(denials, 20), "\n"))
		}
	}
	if !t.Failed() {
		return
	}
	for _, p := range procs {
		if p != nil {
			t.Logf("--- end of %s (%s):\n%s", p.Name, p.Log, Tail(p.Log, 30))
		}
	}
	// The logs live in t.TempDir, which goes with the test; keep them
	// where the developer asked.
	if keep := os.Getenv("GRASP_E2E_KEEP_LOGS"); keep != "" {
		dst := filepath.Join(keep, strings.NewReplacer("/", "_", " ", "_").Replace(t.Name()))
		if err := os.MkdirAll(dst, 0o755); err != nil {
			t.Logf("keep logs: %v", err)
			return
		}
		for _, p := range procs {
			if b, err := os.ReadFile(p.Log); err == nil {
				_ = os.WriteFile(filepath.Join(dst, filepath.Base(p.Log)), b, 0o644)
			}
		}
		t.Logf("logs kept in %s", dst)
	}
}

// CheckRunning returns an error naming every process that exited on its
// own (not killed by Kill), with the end of its log.
func (d *Deployment) CheckRunning() error {
	var errs []error
	for _, p := range d.Procs() {
		if !p.Running() {
			errs = append(errs, fmt.Errorf("%s is not running; log ends:\n%s", p.Name, Tail(p.Log, 10)))
		}
	}
	return errors.Join(errs...)
}

// RelayURL is the own relay's websocket URL.
func (d *Deployment) RelayURL() string { return "ws://" + d.relayAddr }

// PublicURL is the URL announcements list (the relay's own here).
func (d *Deployment) PublicURL() string { return "ws://" + d.relayAddr }

// Store is this test's own connection to the deployment's PostgreSQL store.
func (d *Deployment) Store() *store.Store { return d.store }

// Metrics scrapes every running service and sums samples with the same
// key (two fetchers' gauges add up). A service that is not running is left
// out; one that runs but does not answer is an error, so callers retry.
func (d *Deployment) Metrics(ctx context.Context) (map[string]float64, error) {
	out := map[string]float64{}
	for _, p := range d.Services() {
		if !p.Running() {
			continue
		}
		if err := scrapeInto(ctx, p.MetricsAddr, out); err != nil {
			return nil, fmt.Errorf("%s: %w", p.Name, err)
		}
	}
	return out, nil
}

// processEnv is the environment of a child: this process's, without any
// GRASP_* variable (the test's own settings must not leak in), plus env
// and extra.
func processEnv(env, extra Env) []string {
	var out []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "GRASP_") {
			out = append(out, kv)
		}
	}
	for _, m := range []Env{env, extra} {
		for k, v := range m {
			out = append(out, k+"="+v)
		}
	}
	return out
}

func mustPort(t testing.TB) int {
	t.Helper()
	p, err := FreePort()
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// FreshDatabase creates an empty database on the PostgreSQL server at
// serverURL, drops it when the test ends (after everything registered
// later, so after the processes that use it are gone), and returns its URL.
func FreshDatabase(t testing.TB, serverURL string) string {
	t.Helper()
	u, err := url.Parse(serverURL)
	if err != nil {
		t.Fatalf("PostgreSQL URL: %v", err)
	}
	db, err := sql.Open("postgres", serverURL)
	if err != nil {
		t.Fatalf("PostgreSQL %s: %v", store.Redact(serverURL), err)
	}
	defer db.Close()
	name := fmt.Sprintf("grasp_e2e_%d_%d", os.Getpid(), time.Now().UnixNano())
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := db.ExecContext(ctx, `CREATE DATABASE `+pq.QuoteIdentifier(name)); err != nil {
		t.Fatalf("create database %s on %s: %v", name, store.Redact(serverURL), err)
	}
	t.Cleanup(func() {
		db, err := sql.Open("postgres", serverURL)
		if err != nil {
			t.Errorf("drop database %s: %v", name, err)
			return
		}
		defer db.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if _, err := db.ExecContext(ctx, `DROP DATABASE IF EXISTS `+pq.QuoteIdentifier(name)+` WITH (FORCE)`); err != nil {
			t.Errorf("drop database %s: %v", name, err)
		}
	})
	u.Path = "/" + name
	return u.String()
}
