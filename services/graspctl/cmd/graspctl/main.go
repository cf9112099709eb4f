// Command graspctl inspects a running grasp-sync:
//
//	graspctl COMMAND [flags]   (connection flags anywhere on the line)
//	  status  [--json] [--watch] [--interval 2s] [--metrics URL]   relay table
//	  repos   [--relay URL] [--json]               the RepoSyncIndex
//	  explain [--json] [--relay-url URL] [--service-url URL] REPO_REF|EVENT_ID
//	                                               relays of one repository and why
//	  tap     [--pretty] [--from-start] [--relay URL] [--repo REF] [--kind N] [SUBJECT…]
//
// The connection flags --nats, --creds, --ca, --cert, --key and --prefix
// default to GRASP_NATS_URL (else graspd's embedded server at
// nats://127.0.0.1:4233), GRASP_NATS_CREDS, GRASP_NATS_CA, GRASP_NATS_CERT,
// GRASP_NATS_KEY and GRASP_PREFIX. `graspctl COMMAND --help` prints a
// command's flags; --version the version.
//
// Exit codes: 0 ok, 1 other failure, 2 usage, 3 NATS unreachable,
// 4 bucket missing (nothing ran with this prefix), 5 unknown repository.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/grasp-sync/grasp-sync/pkg/bus"
	"github.com/grasp-sync/grasp-sync/pkg/nip34"
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

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	inv, err := parseArgs(args, os.Getenv)
	if err != nil {
		return err
	}
	switch {
	case inv.Help != "":
		_, err := io.WriteString(stdout, inv.Help)
		return err
	case inv.Version:
		_, err := fmt.Fprintln(stdout, obs.VersionLine("graspctl"))
		return err
	}
	sec := bus.Security{Creds: inv.Conn.Creds, CA: inv.Conn.CA, Cert: inv.Conn.Cert, Key: inv.Conn.Key}
	b, err := connect(ctx, inv.Conn.NATS, sec, inv.Conn.Prefix)
	if err != nil {
		return err
	}
	defer b.Close()
	switch inv.Command {
	case "status":
		return graspctl.Status(ctx, b, inv.Status, stdout)
	case "repos":
		return graspctl.Repos(ctx, b, inv.Repos.Relay, inv.Repos.JSON, stdout)
	case "explain":
		if nip34.IsLowerHex(inv.RepoRef, 64) {
			return graspctl.ExplainEvent(ctx, b, inv.RepoRef, inv.Explain, stdout)
		}
		return graspctl.Explain(ctx, b, inv.RepoRef, inv.Explain, stdout)
	default: // tap
		inv.Tap.Errors = stderr
		return graspctl.Tap(ctx, b, inv.Tap, stdout)
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
