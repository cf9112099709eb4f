// Command graspctl inspects a running grasp-sync:
//
//	graspctl [--nats URL] [--creds FILE] [--ca FILE] [--prefix P] COMMAND
//	  status  [--json] [--watch] [--interval 2s] [--metrics URL]   relay table
//	  repos   [--relay URL] [--json]               the RepoSyncIndex
//	  explain [--json] [--relay-url URL] [--service-url URL] REPO_REF
//	                                               relays of one repository and why
//	  tap     [--pretty] [--from-start] [--relay URL] [--repo REF] [--kind N] [SUBJECT…]
//
// GRASP_NATS_URL (default: graspd's embedded server at
// nats://127.0.0.1:4233), GRASP_NATS_CREDS and GRASP_PREFIX are the
// defaults of the global flags.
//
// Exit codes: 0 ok, 1 other failure, 2 usage, 3 NATS unreachable,
// 4 bucket missing (nothing ran with this prefix), 5 unknown repository.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/grasp-sync/grasp-sync/pkg/bus"
	"github.com/grasp-sync/grasp-sync/pkg/obs"
	"github.com/grasp-sync/grasp-sync/pkg/syncstatus"
	"github.com/grasp-sync/grasp-sync/services/graspctl"
)

// Exit codes a script can act on.
const (
	exitFailure     = 1
	exitUsage       = 2
	exitUnreachable = 3
	exitNoBucket    = 4
	exitUnknownRepo = 5
)

const usage = `usage: graspctl [--nats URL] [--creds FILE] [--ca FILE] [--prefix P] COMMAND
  status  [--json] [--watch] [--interval 2s] [--metrics URL]
  repos   [--relay URL] [--json]
  explain [--json] [--relay-url URL] [--service-url URL] REPO_REF
  tap     [--pretty] [--from-start] [--relay URL] [--repo REF] [--kind N] [SUBJECT…]`

// exitError carries an exit code and a hint of what to do.
type exitError struct {
	code int
	err  error
}

func (e *exitError) Error() string { return e.err.Error() }
func (e *exitError) Unwrap() error { return e.err }

func main() {
	ctx, stop := obs.SignalContext(context.Background())
	err := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	if err != nil {
		fmt.Fprintf(os.Stderr, "graspctl: %v\n", err)
		os.Exit(exitCode(err))
	}
}

func exitCode(err error) int {
	var ee *exitError
	switch {
	case errors.As(err, &ee):
		return ee.code
	case errors.Is(err, syncstatus.ErrBucketMissing):
		return exitNoBucket
	case errors.Is(err, syncstatus.ErrUnknownRepo):
		return exitUnknownRepo
	}
	return exitFailure
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	global := flag.NewFlagSet("graspctl", flag.ContinueOnError)
	global.SetOutput(stderr)
	url := global.String("nats", envOr("GRASP_NATS_URL", "nats://127.0.0.1:4233"), "NATS server URL (GRASP_NATS_URL)")
	creds := global.String("creds", os.Getenv("GRASP_NATS_CREDS"), "NATS credentials file (GRASP_NATS_CREDS)")
	ca := global.String("ca", os.Getenv("GRASP_NATS_CA"), "PEM file of the CAs that sign the NATS servers' certificates (GRASP_NATS_CA)")
	prefix := global.String("prefix", envOr("GRASP_PREFIX", bus.DefaultPrefix), "subject/bucket prefix (GRASP_PREFIX)")
	global.Usage = func() { fmt.Fprintln(stderr, usage) }
	if err := global.Parse(args); err != nil {
		return &exitError{exitUsage, err}
	}
	if global.NArg() == 0 {
		return &exitError{exitUsage, errors.New(usage)}
	}
	cmd, rest := global.Arg(0), global.Args()[1:]
	fs := flag.NewFlagSet(cmd, flag.ContinueOnError)
	fs.SetOutput(stderr)
	asJSON := fs.Bool("json", false, "print JSON")
	watch := fs.Bool("watch", false, "status: refresh in place")
	interval := fs.Duration("interval", 2*time.Second, "status --watch: refresh interval")
	relay := fs.String("relay", "", "only this relay URL")
	repo := fs.String("repo", "", "tap: only messages mentioning this repository coordinate")
	kind := fs.Int("kind", 0, "tap: only nostr events of this kind")
	metricsURL := fs.String("metrics", envOr("GRASP_METRICS_URL", "http://127.0.0.1:9477/metrics"), "status: graspd's /metrics, for events stored and their rate (GRASP_METRICS_URL; empty skips)")
	relayURL := fs.String("relay-url", envOr("GRASP_RELAY_URL", "ws://127.0.0.1:7777"), "explain: this service's relay, to read the announcement from (GRASP_RELAY_URL; empty skips)")
	serviceURL := fs.String("service-url", os.Getenv("GRASP_PUBLIC_URL"), "explain: this service's public URL as announcements list it (GRASP_PUBLIC_URL; default --relay-url)")
	pretty := fs.Bool("pretty", false, "tap: indent each JSON object")
	fromStart := fs.Bool("from-start", false, "tap: replay what the streams hold first")
	switch cmd {
	case "status", "repos", "explain", "tap":
	default:
		return &exitError{exitUsage, fmt.Errorf("unknown command %q\n%s", cmd, usage)}
	}
	if err := fs.Parse(rest); err != nil {
		return &exitError{exitUsage, err}
	}
	if cmd == "explain" && fs.NArg() != 1 {
		return &exitError{exitUsage, errors.New("usage: graspctl explain [--json] REPO_REF (a coordinate 30617:<pubkey>:<identifier>; `graspctl repos` lists them)")}
	}

	// A client certificate, when NATS asks for one, comes from the
	// environment only, as for the services.
	sec := bus.Security{Creds: *creds, CA: *ca, Cert: os.Getenv("GRASP_NATS_CERT"), Key: os.Getenv("GRASP_NATS_KEY")}
	b, err := connect(ctx, *url, sec, *prefix)
	if err != nil {
		return err
	}
	defer b.Close()
	switch cmd {
	case "status":
		return graspctl.Status(ctx, b, graspctl.StatusOptions{JSON: *asJSON, Watch: *watch, Interval: *interval, MetricsURL: *metricsURL}, stdout)
	case "repos":
		return graspctl.Repos(ctx, b, *relay, *asJSON, stdout)
	case "explain":
		return graspctl.Explain(ctx, b, fs.Arg(0), graspctl.ExplainOptions{JSON: *asJSON, RelayURL: *relayURL, ServiceURL: *serviceURL}, stdout)
	default: // tap
		return graspctl.Tap(ctx, b, graspctl.TapOptions{Subjects: fs.Args(), Pretty: *pretty, FromStart: *fromStart,
			Filter: graspctl.TapFilter{Relay: *relay, Repo: *repo, Kind: *kind}, Errors: stderr}, stdout)
	}
}

// connect reaches NATS with a short timeout and says what to do when it
// cannot.
func connect(ctx context.Context, url string, sec bus.Security, prefix string) (*bus.Bus, error) {
	if err := sec.Check(); err != nil {
		return nil, &exitError{exitUsage, fmt.Errorf("credentials or certificates: %w", err)}
	}
	nc, err := nats.Connect(url, append(sec.Options(), nats.Name("graspctl"), nats.Timeout(5*time.Second))...)
	if err != nil {
		return nil, &exitError{exitUnreachable, fmt.Errorf("cannot reach NATS at %s: %w (is graspd running? set --nats or GRASP_NATS_URL)", bus.RedactURL(url), err)}
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, fmt.Errorf("jetstream at %s: %w", bus.RedactURL(url), err)
	}
	return &bus.Bus{Conn: nc, JS: js, Names: bus.Names{Prefix: prefix}}, nil
}
