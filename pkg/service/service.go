// Package service is what every grasp-sync binary does around its own work:
// answer --version and --help, read the common configuration, log (text at
// a terminal, JSON otherwise), connect to NATS and create the
// shared streams, serve /metrics, /healthz and /readyz, stop on SIGINT or
// SIGTERM, and turn a start-up mistake into one line and a non-zero exit.
package service

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sync/errgroup"

	"github.com/grasp-sync/grasp-sync/pkg/bus"
	"github.com/grasp-sync/grasp-sync/pkg/config"
	"github.com/grasp-sync/grasp-sync/pkg/obs"
	"github.com/grasp-sync/grasp-sync/pkg/verify"
)

// Common is the configuration every service binary shares.
type Common struct {
	// NATSURL is the NATS server (or cluster) the service joins.
	NATSURL string `envconfig:"NATS_URL" default:"nats://127.0.0.1:4222"`
	// Security: credentials and certificate authorities for a secured NATS.
	bus.Security
	// Prefix namespaces subjects, streams and buckets.
	Prefix string `envconfig:"PREFIX" default:"grasp"`
	// Replicas of streams and buckets (3 in a NATS cluster).
	Replicas int `envconfig:"NATS_REPLICAS" default:"1"`
	// SetupTimeout bounds connecting to NATS and creating the shared streams and buckets at start; past it the binary exits. A cluster electing stream leaders can take tens of seconds.
	SetupTimeout time.Duration `envconfig:"NATS_SETUP_TIMEOUT" default:"1m"`
	// MetricsAddr serves /metrics, /healthz and /readyz.
	MetricsAddr string `envconfig:"METRICS_ADDR" default:"127.0.0.1:9477"`
	// LogLevel is debug, info, warn or error (logs on stderr).
	LogLevel string `envconfig:"LOG_LEVEL" default:"info"`
	// LogFormat is text or json; unset: text when stderr is a terminal, JSON otherwise.
	LogFormat string `envconfig:"LOG_FORMAT"`
	// MemoryLimit is the Go runtime's soft memory limit (GOMEMLIMIT), such as 256MiB or 1GiB: past it the garbage collector works harder to stay under it. Unset: GOMEMLIMIT if set, else no limit. Set it to about three quarters of the memory the process may use.
	MemoryLimit config.ByteSize `envconfig:"MEMORY_LIMIT"`
	// Pprof serves the Go runtime's profiles (heap, goroutines, CPU) under /debug/pprof/ on the metrics address, for finding where memory or time goes.
	Pprof bool `envconfig:"PPROF"`
}

// Env is what a service's run function gets.
type Env struct {
	Log      *slog.Logger
	Registry *prometheus.Registry
	Health   *obs.Server
	Bus      *bus.Bus
	// Bus options the contract's streams and buckets were set up with
	// (replicas from GRASP_NATS_REPLICAS), for a service's own buckets.
	Options bus.Options
}

// Main runs one service binary and exits. spec is the service's own
// configuration struct, loaded before run is called.
// Arguments are only --version and --help (obs.CommandLine); anything else
// exits 2.
func Main(name string, spec any, run func(ctx context.Context, env *Env) error) {
	done, err := obs.CommandLine(name, obs.ServiceHelp(name, "Runs the grasp-sync "+name+" service."), os.Args[1:], os.Stdout)
	if err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", name, err)
		os.Exit(2)
	}
	if done {
		os.Exit(0)
	}
	if err := mainErr(name, spec, run); err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", name, err)
		os.Exit(1)
	}
}

func mainErr(name string, spec any, run func(ctx context.Context, env *Env) error) error {
	var common Common
	if err := config.Load(&common); err != nil {
		return err
	}
	if common.SetupTimeout <= 0 {
		return fmt.Errorf("GRASP_NATS_SETUP_TIMEOUT=%s: must be positive", common.SetupTimeout)
	}
	if err := common.Security.Check(); err != nil {
		return err
	}
	if spec != nil {
		if err := config.Load(spec); err != nil {
			return err
		}
	}
	log, err := obs.NewLoggerFor(os.Stderr, common.LogLevel, common.LogFormat)
	if err != nil {
		return err
	}
	log = log.With("service", name)
	memLimit, memSource := config.ApplyMemoryLimit(common.MemoryLimit)
	ctx, stop := obs.SignalContext(context.Background())
	defer stop()

	reg := obs.NewRegistry()
	health := obs.NewServer(reg)
	if common.Pprof {
		health.EnablePprof()
	}
	if err := health.Listen("GRASP_METRICS_ADDR", common.MetricsAddr); err != nil {
		return err
	}
	names := bus.Names{Prefix: common.Prefix}
	cctx, cancel := context.WithTimeout(ctx, common.SetupTimeout)
	defer cancel()
	b, err := bus.Connect(cctx, common.NATSURL, name, names, common.Security)
	if err != nil {
		return fmt.Errorf("GRASP_NATS_URL=%s: %w", bus.RedactURL(common.NATSURL), err)
	}
	defer b.Close()
	opts := bus.DefaultOptions()
	opts.Replicas = common.Replicas
	if err := bus.Setup(cctx, b.JS, names, opts); err != nil {
		return fmt.Errorf("GRASP_NATS_URL=%s: %w", bus.RedactURL(common.NATSURL), err)
	}
	health.AddReadiness("nats", func() error {
		if !b.Conn.IsConnected() {
			return errors.New("disconnected")
		}
		return nil
	})
	effective := config.Effective(&common)
	if spec != nil {
		for k, v := range config.Effective(spec) {
			effective[k] = v
		}
	}
	log.Info("started", "version", obs.Version, "commit", obs.Commit, "verifier", verify.Backend(), "metrics", health.Addr(), "nats", bus.RedactURL(common.NATSURL), "memory_limit", config.ByteSize(memLimit), "memory_limit_from", memSource, "config", effective)

	g, gctx := errgroup.WithContext(ctx)
	gctx, end := context.WithCancel(gctx)
	g.Go(func() error { return health.Serve(gctx) })
	g.Go(func() error {
		defer end() // the service ending ends the health server too
		return run(gctx, &Env{Log: log, Registry: reg, Health: health, Bus: b, Options: opts})
	})
	err = g.Wait()
	if err != nil && ctx.Err() != nil {
		return nil
	}
	return err
}
