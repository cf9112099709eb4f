package e2e

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/grasp-sync/grasp-sync/pkg/store"
	"github.com/grasp-sync/grasp-sync/pkg/testkit"
	"github.com/grasp-sync/grasp-sync/pkg/testkit/delayproxy"
)

// The multi-process mode of the architecture (one process per service, one
// NATS or a 3-node NATS cluster, a shared PostgreSQL store), run from a
// test: the real binaries, built from this workspace, as child processes.
// Nothing here is in-process, so a kill -9 of any one of them is the real
// thing.
//
// Its parts: build.go (the binaries), proc.go (one child process),
// natscluster.go and natsauth.go (the NATS nodes, with or without the
// manifests' users) and postgres.go (the deployment's fresh database).

// FreePort returns a TCP port free on 127.0.0.1 now (testkit.FreePort).
// Processes that must keep their address across restarts (the relay, which
// announcements name; NATS nodes, which routes name) get theirs up front
// this way.
func FreePort() (int, error) { return testkit.FreePort() }

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
	// Auth runs every NATS node with the manifests' configuration
	// (k8s/base/nats, with the generated auth.conf; a cluster with the
	// production overlay's cluster block) and connects every service as
	// its own NATS user, as in Kubernetes (natsauth.go).
	Auth bool
	// RelayNATSProxy puts a proxy (Deployment.RelayNATS) between the relay
	// and the first NATS node, so that a test can cut the relay's NATS
	// connection alone.
	RelayNATSProxy bool
	// Profile serves every process's Go profiles: the NATS nodes on a
	// prof_port of their own, the services on their metrics address
	// (GRASP_PPROF); Proc.ProfAddr says where.
	Profile bool
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
	// RelayNATS is the relay's way to NATS with RelayNATSProxy, else nil.
	RelayNATS *delayproxy.Proxy
	// Dir holds the logs and the NATS stores.
	Dir string

	relayAddr string
	store     *store.Store
	binDir    string
	natsURL   string    // client URL list, without credentials
	profile   bool      // DeploymentOptions.Profile
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
	if o.PostgresURL == "" {
		t.Fatal("StartDeployment: DeploymentOptions.PostgresURL is required (multi-process services share a PostgreSQL store)")
	}
	d := &Deployment{Dir: t.TempDir(), binDir: bin, profile: o.Profile}
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
		for k, v := range extra {
			e[k] = v
		}
		if d.auth != nil {
			// Each binary is its own NATS user, named after it.
			url := natsURL
			if u, ok := extra["GRASP_NATS_URL"]; ok {
				url = u
			}
			u, err := d.auth.userURL(url, binary)
			if err != nil {
				t.Fatal(err)
			}
			e["GRASP_NATS_URL"] = u
		}
		addr := "127.0.0.1:" + strconv.Itoa(port)
		p := &Proc{Name: name, Log: filepath.Join(d.Dir, name+".log"), HealthURL: "http://" + addr + "/readyz",
			MetricsAddr: addr, bin: filepath.Join(bin, binary)}
		if o.Profile {
			e["GRASP_PPROF"] = "true"
			p.ProfAddr = addr
		}
		p.env = processEnv(env, e)
		return p
	}
	// Start order follows the data flow's dependencies: the relay before
	// discovery (which subscribes to it), consumers before producers.
	var relayEnv Env
	if o.RelayNATSProxy {
		first, _, _ := strings.Cut(natsURL, ",")
		d.RelayNATS = delayproxy.Start(t, strings.TrimPrefix(first, "nats://"))
		relayEnv = Env{"GRASP_NATS_URL": "nats://" + d.RelayNATS.Addr}
	}
	d.Relay = svc("relay", "relay", relayEnv)
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

// Kill kills every process (services first), as the test's end does, for
// a caller done with the deployment before then; the end still checks the
// logs for NATS refusals and drops the database.
func (d *Deployment) Kill() {
	procs := d.Procs()
	for i := len(procs) - 1; i >= 0; i-- {
		if procs[i] != nil {
			_ = procs[i].Kill()
		}
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

func mustPort(t testing.TB) int {
	t.Helper()
	p, err := FreePort()
	if err != nil {
		t.Fatal(err)
	}
	return p
}
