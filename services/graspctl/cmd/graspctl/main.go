// Command graspctl inspects a running grasp-sync: `graspctl tap [subject]`
// follows any subject, decoding control messages; `graspctl repos` lists
// the RepoSyncIndex. GRASP_NATS_URL names the server (default: graspd's
// embedded one at nats://127.0.0.1:4233).
package main

import (
	"context"
	"fmt"
	"os"

	"github.com/grasp-sync/grasp-sync/pkg/bus"
	"github.com/grasp-sync/grasp-sync/pkg/obs"
	"github.com/grasp-sync/grasp-sync/services/graspctl"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintf(os.Stderr, "graspctl: %v\n", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	url := os.Getenv("GRASP_NATS_URL")
	if url == "" {
		url = "nats://127.0.0.1:4233"
	}
	prefix := os.Getenv("GRASP_PREFIX")
	if prefix == "" {
		prefix = bus.DefaultPrefix
	}
	if len(args) == 0 {
		return fmt.Errorf("usage: graspctl tap [subject] | graspctl repos")
	}
	ctx, stop := obs.SignalContext(context.Background())
	defer stop()
	b, err := bus.Connect(ctx, url, "graspctl", bus.Names{Prefix: prefix})
	if err != nil {
		return fmt.Errorf("GRASP_NATS_URL=%s: %w", url, err)
	}
	defer b.Close()
	switch args[0] {
	case "tap":
		subject := prefix + ".>"
		if len(args) > 1 {
			subject = args[1]
		}
		return graspctl.Tap(ctx, b.Conn, subject, os.Stdout)
	case "repos":
		return graspctl.Repos(ctx, b, os.Stdout)
	}
	return fmt.Errorf("unknown command %q: want tap or repos", args[0])
}
