// Command graspd runs the whole GRASP sync server in one process.
package main

import (
	"context"
	"fmt"
	stdlog "log"
	"os"

	"github.com/grasp-sync/grasp-sync/pkg/config"
	"github.com/grasp-sync/grasp-sync/pkg/obs"
	"github.com/grasp-sync/grasp-sync/pkg/verify"
	"github.com/grasp-sync/grasp-sync/services/graspd"
)

const what = `Runs the whole GRASP sync server in one process: the relay, discovery, planner,
fetcher and ingester, over an embedded NATS and event store unless told otherwise.`

func main() {
	done, err := obs.CommandLine("graspd", obs.ServiceHelp("graspd", what), os.Args[1:], os.Stdout)
	if err != nil {
		fmt.Fprintf(os.Stderr, "graspd: %v\n", err)
		os.Exit(2)
	}
	if done {
		return
	}
	if err := run(); err != nil {
		fmt.Fprintf(os.Stderr, "graspd: %v\n", err)
		os.Exit(1)
	}
}

func run() error {
	cfg, err := graspd.LoadConfigs()
	if err != nil {
		return err
	}
	log, err := obs.NewLoggerFor(os.Stderr, cfg.Graspd.LogLevel, cfg.Graspd.LogFormat)
	if err != nil {
		return err
	}
	ctx, stop := obs.SignalContext(context.Background())
	defer stop()
	// Before anything allocates in bulk (docs/decisions/0030-memory-on-a-small-machine.md, docs/decisions/0039-default-soft-memory-limit.md).
	memLimit, memSource := config.ApplyDefaultMemoryLimit(ctx, cfg.Graspd.MemoryLimit, graspd.DefaultMemoryLimit(cfg.Graspd))
	// Libraries that log through the standard logger (eventstore, khatru)
	// log as structured lines too.
	stdlog.SetFlags(0)
	stdlog.SetOutput(obs.LineWriter(log, "lib"))
	app, err := graspd.Start(ctx, cfg, log)
	if err != nil {
		return err
	}
	// Logged once start-up succeeded, so a start-up mistake stays one line.
	// The verifier depends on the build (docs/decisions/0027-signature-verification-libsecp256k1.md).
	log.Info("configuration", "version", obs.Version, "commit", obs.Commit, "verifier", verify.Backend(), "memory_limit", config.ByteSize(memLimit), "memory_limit_from", memSource, "config", config.Effective(&cfg))
	defer app.Close()
	if app.BoltOn() {
		fmt.Fprintf(os.Stderr, "graspd: bolt-on mode, syncing into the target relay %s, public URL %s, NATS %s, metrics http://%s/metrics, status page http://%s/\n",
			app.RelayURL(), app.PublicURL(), app.NATSURL(), app.MetricsAddr(), app.MetricsAddr())
	} else {
		fmt.Fprintf(os.Stderr, "graspd: relay %s (NIP-11 at %s), public URL %s, NATS %s, metrics http://%s/metrics\n",
			app.RelayURL(), "http"+app.RelayURL()[2:], app.PublicURL(), app.NATSURL(), app.MetricsAddr())
	}
	return app.Run(ctx)
}
