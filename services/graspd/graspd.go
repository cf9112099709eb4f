// Package graspd is the all-in-one GRASP sync server: an embedded NATS
// JetStream server, the own relay on the embedded store, and discovery,
// planner, fetcher and ingester in one process, talking through the same
// NATS subjects they use when they run as separate processes.
package graspd

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nbd-wtf/go-nostr"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sync/errgroup"

	"github.com/grasp-sync/grasp-sync/pkg/bus"
	"github.com/grasp-sync/grasp-sync/pkg/clock"
	"github.com/grasp-sync/grasp-sync/pkg/config"
	"github.com/grasp-sync/grasp-sync/pkg/obs"
	"github.com/grasp-sync/grasp-sync/pkg/policy"
	"github.com/grasp-sync/grasp-sync/pkg/rejected"
	"github.com/grasp-sync/grasp-sync/pkg/store"
	"github.com/grasp-sync/grasp-sync/services/discovery"
	"github.com/grasp-sync/grasp-sync/services/fetcher"
	"github.com/grasp-sync/grasp-sync/services/ingester"
	"github.com/grasp-sync/grasp-sync/services/planner"
	"github.com/grasp-sync/grasp-sync/services/relay"
)

// AllServices are the services graspd runs by default.
var AllServices = []string{"relay", "discovery", "planner", "fetcher", "ingester"}

// Config is graspd's own configuration (GRASP_* variables). Each service's
// configuration is read from the same environment.
type Config struct {
	// DataDir holds the embedded NATS store and the event store.
	DataDir string `envconfig:"DATA_DIR" default:"./data"`
	// NATSListen is where the embedded NATS server accepts TCP clients
	// (graspctl, the nats CLI); empty disables TCP. The default port is not
	// 4222 so it never collides with a system NATS.
	NATSListen string `envconfig:"NATS_LISTEN" default:"127.0.0.1:4233"`
	// NATSURL, when set, uses that external NATS instead of the embedded one.
	NATSURL string `envconfig:"NATS_URL"`
	// Security: credentials and certificate authorities for an external, secured NATS.
	bus.Security
	// StoreURL is the event store; default: the embedded store under DataDir (kv on pebble for a new directory, on badger for one badger wrote; kv+pebble:// or kv+badger:// names the engine).
	StoreURL string `envconfig:"STORE_URL"`
	// MetricsAddr serves /metrics, /healthz and /readyz.
	MetricsAddr string `envconfig:"METRICS_ADDR" default:"127.0.0.1:9477"`
	// Pprof serves the Go runtime's profiles (heap, goroutines, CPU) under /debug/pprof/ on the metrics address, for finding where memory or time goes.
	Pprof bool `envconfig:"PPROF"`
	// Prefix namespaces subjects, streams and buckets.
	Prefix string `envconfig:"PREFIX" default:"grasp"`
	// LogLevel is debug, info, warn or error (logs on stderr).
	LogLevel string `envconfig:"LOG_LEVEL" default:"info"`
	// LogFormat is text or json; unset: text when stderr is a terminal, JSON otherwise.
	LogFormat string `envconfig:"LOG_FORMAT"`
	// StoreMemory is the embedded kv store's memory budget for its memtables and block and index caches (0: 48MiB); more makes reads of a large store faster. PostgreSQL ignores it.
	StoreMemory config.ByteSize `envconfig:"STORE_MEMORY"`
	// MemoryLimit is the Go runtime's soft memory limit (GOMEMLIMIT), such as 256MiB or 1GiB: past it the garbage collector works harder to stay under it. Unset: GOMEMLIMIT if set (GOMEMLIMIT=off: no limit), else 256MiB minus what lies outside the Go heap (the embedded store's budget, STORE_MEMORY, and 48MiB for the program's code and the runtime), at least 128MiB, so graspd fits in about 256 MB; that default rises with the live heap instead of making the collector thrash (docs/decisions/0039-default-soft-memory-limit.md). With more memory to spare, set it to about three quarters of what graspd may use.
	MemoryLimit config.ByteSize `envconfig:"MEMORY_LIMIT"`
	// Services lists the services to run (all by default).
	Services []string `envconfig:"SERVICES" default:"relay,discovery,planner,fetcher,ingester"`
}

// MemoryTotal is the memory graspd's defaults are sized for, the small
// VPS of issue 17 (docs/decisions/0039-default-soft-memory-limit.md).
const MemoryTotal = 256 << 20

// outsideGoHeap is what graspd keeps resident outside both the Go heap and
// the embedded store's budget: the program's mapped code and data (~36 MB)
// and the runtime's own. The soft limit counts neither, so it leaves them
// room (docs/decisions/0074-store-budget-48mib.md).
const outsideGoHeap = 48 << 20

// DefaultMemoryLimit is the soft memory limit graspd applies when none is
// configured: MemoryTotal less the embedded store's budget, which pebble
// allocates outside the Go heap (cgo builds), and less outsideGoHeap, and at
// least 128 MiB. PostgreSQL has no budget in the process.
func DefaultMemoryLimit(c Config) config.ByteSize {
	budget := int64(0)
	if !strings.HasPrefix(c.StoreURL, "postgres://") && !strings.HasPrefix(c.StoreURL, "postgresql://") {
		budget = int64(c.StoreMemory)
		if budget <= 0 {
			budget = store.DefaultKVMemory
		}
	}
	return config.ByteSize(max(MemoryTotal-budget-outsideGoHeap, 128<<20))
}

// Validate checks the service list and addresses.
func (c *Config) Validate() error {
	for _, s := range c.Services {
		if !slices.Contains(AllServices, s) {
			return config.Invalid("SERVICES", strings.Join(c.Services, ","), fmt.Sprintf("unknown service %q (known: %s)", s, strings.Join(AllServices, ",")))
		}
	}
	if c.NATSListen != "" {
		if _, _, err := net.SplitHostPort(c.NATSListen); err != nil {
			return config.Invalid("NATS_LISTEN", c.NATSListen, "want host:port")
		}
	}
	return nil
}

// Configs is every configuration graspd needs.
type Configs struct {
	Graspd    Config
	Relay     relay.Config
	Discovery discovery.Config
	Planner   planner.Config
	Fetcher   fetcher.Config
	Ingester  ingester.Config
}

// LoadConfigs reads every configuration from the environment.
func LoadConfigs() (Configs, error) {
	var c Configs
	for _, spec := range []any{&c.Graspd, &c.Relay, &c.Discovery, &c.Planner, &c.Fetcher, &c.Ingester} {
		if err := config.Load(spec); err != nil {
			return c, err
		}
	}
	return c, nil
}

// App is a started graspd.
type App struct {
	cfg      Configs
	log      *slog.Logger
	store    *store.Store
	nats     *server.Server
	relayLn  net.Listener
	health   *obs.Server
	registry *prometheus.Registry
	clock    clock.Clock
}

// Start binds every listener, opens the store and starts NATS, so that every
// start-up mistake is reported before anything runs. Run runs the services.
func Start(ctx context.Context, c Configs, log *slog.Logger) (*App, error) {
	// One policy (docs/decisions/0018-one-policy-configured-once.md): the relay and the ingester read the
	// same GRASP_POLICY_* variables; a Configs built in code must not split
	// them either.
	if c.Relay.Limits.WithDefaults() != c.Ingester.Limits.WithDefaults() {
		return nil, fmt.Errorf("the relay's policy limits %+v differ from the ingester's %+v: both must be the same (GRASP_POLICY_*)",
			c.Relay.Limits.WithDefaults(), c.Ingester.Limits.WithDefaults())
	}
	// Likewise the archive settings (GRASP_ARCHIVE_*): the relay, the
	// ingester, discovery and the planner must agree on what is archived.
	if r, i, d, p := c.Relay.Archive.String(), c.Ingester.Archive.String(), c.Discovery.Archive.String(), c.Planner.Archive.String(); r != i || r != d || r != p {
		return nil, fmt.Errorf("the archive settings differ: relay %s, ingester %s, discovery %s, planner %s: all must be the same (GRASP_ARCHIVE_*)", r, i, d, p)
	}
	a := &App{cfg: c, log: log, registry: obs.NewRegistry(), clock: clock.Real{}}
	ok := false
	defer func() {
		if !ok {
			a.Close()
		}
	}()

	var err error
	if a.BoltOn() {
		// Bolt-on mode (docs/decisions/0035-bolt-on-target-relay.md): no relay of ours; discovery
		// reads the target, the ingester publishes to it. Announcements
		// list the target's public address, which defaults to its URL.
		target := c.Ingester.Settings.Relay
		if c.Relay.PublicURL == "" || c.Relay.PublicURL == "ws://"+c.Relay.Addr {
			a.cfg.Relay.PublicURL = target
		}
		if a.cfg.Discovery.RelayURL == "" {
			a.cfg.Discovery.RelayURL = target
		}
		a.cfg.Graspd.Services = slices.DeleteFunc(slices.Clone(c.Graspd.Services), func(s string) bool { return s == "relay" })
		if c.Ingester.Archive.Enabled() {
			// The target applies its own policy: it refuses announcements
			// that do not list it, so nothing is archived.
			log.Warn("GRASP_ARCHIVE_* has no effect in bolt-on mode: the target relay refuses announcements that do not list it", "target", target)
		}
	} else {
		ln, err := net.Listen("tcp", c.Relay.Addr)
		if err != nil {
			return nil, fmt.Errorf("GRASP_RELAY_ADDR=%s: cannot listen: %w", c.Relay.Addr, unwrapSyscall(err))
		}
		a.relayLn = ln
		if c.Relay.PublicURL == "" || c.Relay.PublicURL == "ws://"+c.Relay.Addr {
			// With port 0 the real address is known only now.
			a.cfg.Relay.PublicURL = "ws://" + ln.Addr().String()
		}
		if a.cfg.Discovery.RelayURL == "" {
			a.cfg.Discovery.RelayURL = "ws://" + ln.Addr().String()
		}
	}

	a.health = obs.NewServer(a.registry)
	if c.Graspd.Pprof {
		a.health.EnablePprof()
	}
	if err := a.health.Listen("GRASP_METRICS_ADDR", c.Graspd.MetricsAddr); err != nil {
		return nil, err
	}

	if c.Graspd.NATSURL == "" {
		if a.nats, err = startNATS(c.Graspd); err != nil {
			return nil, err
		}
		a.cfg.Fetcher = embeddedFetcher(a.cfg.Fetcher)
	}
	b, err := a.connect(ctx, "graspd")
	if err != nil {
		return nil, err
	}
	defer b.Close()
	if err := bus.Setup(ctx, b.JS, b.Names, bus.DefaultOptions()); err != nil {
		return nil, fmt.Errorf("create streams: %w", err)
	}
	storeURL := c.Graspd.StoreURL
	if storeURL == "" {
		storeURL = filepath.Join(c.Graspd.DataDir, "events")
	}
	if a.store, err = store.Open(storeURL, store.WithKVMemory(int64(c.Graspd.StoreMemory))); err != nil {
		return nil, fmt.Errorf("GRASP_STORE_URL: %w", err)
	}
	ok = true
	return a, nil
}

// startNATS starts the embedded JetStream server.
func startNATS(c Config) (*server.Server, error) {
	opts := &server.Options{
		ServerName: "graspd",
		JetStream:  true,
		StoreDir:   filepath.Join(c.DataDir, "nats"),
		NoLog:      true,
		NoSigs:     true,
		DontListen: c.NATSListen == "",
		// Every stream and bucket is file-backed (pkg/bus); the server's
		// default would reserve 75 % of the machine's memory for memory
		// storage nobody uses.
		JetStreamMaxMemory: 64 << 20,
	}
	if c.NATSListen != "" {
		host, port, _ := net.SplitHostPort(c.NATSListen)
		// nats-server reports a taken port only in its log: probe first so
		// the operator gets one clear line.
		probe, err := net.Listen("tcp", c.NATSListen)
		if err != nil {
			return nil, fmt.Errorf("GRASP_NATS_LISTEN=%s: cannot listen: %w", c.NATSListen, unwrapSyscall(err))
		}
		probe.Close()
		opts.Host = host
		fmt.Sscan(port, &opts.Port)
		if opts.Port == 0 {
			opts.Port = server.RANDOM_PORT
		}
	}
	s, err := server.NewServer(opts)
	if err != nil {
		return nil, fmt.Errorf("embedded nats: %w", err)
	}
	go s.Start()
	if !s.ReadyForConnections(10 * time.Second) {
		s.Shutdown()
		return nil, fmt.Errorf("GRASP_NATS_LISTEN=%s: embedded nats did not start within 10s", c.NATSListen)
	}
	return s, nil
}

// embeddedFetcher is the fetcher's configuration on graspd's embedded
// NATS: what the operator did not set, the ID and lease TTL of a fetcher
// that is its NATS server's only replica (fetcher.EmbeddedID,
// fetcher.EmbeddedLeaseTTL; docs/decisions/0079-graspd-fetcher-leases.md).
func embeddedFetcher(c fetcher.Config) fetcher.Config {
	if c.ID == "" {
		c.ID = fetcher.EmbeddedID
	}
	if c.LeaseTTL == 0 {
		c.LeaseTTL = fetcher.EmbeddedLeaseTTL
	}
	return c
}

func unwrapSyscall(err error) error {
	var op *net.OpError
	if errors.As(err, &op) && op.Err != nil {
		return op.Err
	}
	return err
}

// connect gives each service its own NATS connection, as when distributed.
func (a *App) connect(ctx context.Context, name string) (*bus.Bus, error) {
	names := bus.Names{Prefix: a.cfg.Graspd.Prefix}
	if a.nats != nil {
		return bus.ConnectInProcess(a.nats, name, names)
	}
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	b, err := bus.Connect(cctx, a.cfg.Graspd.NATSURL, name, names, a.cfg.Graspd.Security)
	if err != nil {
		return nil, fmt.Errorf("GRASP_NATS_URL=%s: %w", a.cfg.Graspd.NATSURL, err)
	}
	return b, nil
}

// BoltOn reports whether graspd syncs into a target relay it did not write
// (GRASP_TARGET_RELAY) instead of running its own.
func (a *App) BoltOn() bool { return a.cfg.Ingester.Settings.Enabled() }

// RelayURL is the own relay's websocket URL; in bolt-on mode, the target's.
func (a *App) RelayURL() string {
	if a.relayLn == nil {
		return a.cfg.Ingester.Settings.Relay
	}
	return "ws://" + a.relayLn.Addr().String()
}

// PublicURL is the URL announcements must list.
func (a *App) PublicURL() string { return a.cfg.Relay.PublicURL }

// MetricsAddr is where /metrics is served.
func (a *App) MetricsAddr() string { return a.health.Addr() }

// NATSURL is the embedded server's client URL ("" without a TCP listener).
func (a *App) NATSURL() string {
	if a.nats == nil {
		return a.cfg.Graspd.NATSURL
	}
	if a.cfg.Graspd.NATSListen == "" {
		return ""
	}
	return a.nats.ClientURL()
}

// Store is the event store (for tests and graspctl-like inspection).
func (a *App) Store() *store.Store { return a.store }

// Run runs the configured services until ctx is done or one fails.
func (a *App) Run(parent context.Context) error {
	g, ctx := errgroup.WithContext(parent)
	g.Go(func() error { return a.health.Serve(ctx) })
	var ing atomic.Pointer[ingester.Ingester]
	if err := a.startOps(ctx, g.Go, &ing); err != nil {
		return err
	}
	pol := &policy.Policy{ServiceURL: a.cfg.Relay.PublicURL}
	for _, name := range a.cfg.Graspd.Services {
		b, err := a.connect(ctx, name)
		if err != nil {
			return err
		}
		defer b.Close()
		log := a.log
		switch name {
		case "relay":
			r := relay.New(a.cfg.Relay, a.store, b, log)
			a.registry.MustRegister(r.Collectors()...)
			ln := a.relayLn
			g.Go(func() error { return r.Run(ctx, ln) })
		case "discovery":
			d := discovery.New(a.cfg.Discovery, b, a.cfg.Relay.PublicURL, func(e *nostr.Event) bool { return pol.ListsService(e) }, a.clock, log, a.registry)
			if a.BoltOn() {
				d.WithSeen(a.mirrorSeen)
			}
			a.health.AddReadiness("discovery", d.Ready)
			g.Go(func() error { return d.Run(ctx) })
		case "planner":
			p := planner.New(a.cfg.Planner, b, a.clock, log, a.registry)
			g.Go(func() error { return p.Run(ctx) })
		case "fetcher":
			// The local side of NIP-77 reconciliation: what the store holds
			// plus what the policy has refused for good.
			refused := rejected.NewCache()
			g.Go(func() error {
				kv, err := rejected.Open(ctx, b)
				if err != nil {
					return err
				}
				return refused.Run(ctx, kv)
			})
			f := fetcher.New(a.cfg.Fetcher, b, a.clock, log, a.registry).
				WithLocalSet(fetcher.UnionLocalSet{fetcher.StoreLocalSet{Store: a.store}, refused})
			g.Go(func() error { return f.Run(ctx) })
		case "ingester":
			i := ingester.New(a.cfg.Ingester, b, a.store, a.cfg.Relay.PublicURL, log, a.registry)
			ing.Store(i)
			if pub := i.Target(); pub != nil {
				// No relay of ours serves the status page: the metrics
				// address does, with the target's section.
				a.health.SetRoot(relay.StatusHandler{Name: a.cfg.Relay.Name, Description: a.cfg.Relay.Description,
					PublicURL: a.cfg.Relay.PublicURL, Bus: b, Log: log, Target: pub.Status})
			}
			g.Go(func() error { return i.Run(ctx) })
		}
	}
	if a.BoltOn() {
		a.log.Info("bolt-on mode: no relay of our own, syncing into the target relay", "target", a.RelayURL(),
			"status_page", "http://"+a.MetricsAddr()+"/")
	}
	a.log.Info("graspd running", "relay", a.RelayURL(), "public_url", a.PublicURL(),
		"nats", a.NATSURL(), "metrics", "http://"+a.MetricsAddr()+"/metrics", "services", strings.Join(a.cfg.Graspd.Services, ","))
	err := g.Wait()
	if parent.Err() != nil {
		return nil // asked to stop: errors on the way out are the stop itself
	}
	return err
}

// mirrorSeen records in the mirror what discovery's self-subscription reads
// on the target (bolt-on mode): announcements, roots and deletions others
// wrote there directly, so the policy sees the repositories the target
// hosts and the fetcher does not download those events again. The target is
// trusted for what it holds (it verified them; we configured it). Best
// effort: an event missed here is fetched from a remote and answered
// "duplicate" by the target instead.
func (a *App) mirrorSeen(ctx context.Context, evts []*nostr.Event) {
	for _, e := range evts {
		if _, err := store.SaveAccepted(ctx, a.store, e, nil); err != nil && ctx.Err() == nil {
			a.log.Warn("mirroring an event seen on the target failed", "id", e.ID, "kind", e.Kind, "err", err)
		}
	}
}

// Close releases what Start acquired.
func (a *App) Close() {
	if a.relayLn != nil {
		a.relayLn.Close()
	}
	if a.store != nil {
		a.store.Close()
	}
	if a.nats != nil {
		a.nats.Shutdown()
		a.nats.WaitForShutdown()
	}
}
