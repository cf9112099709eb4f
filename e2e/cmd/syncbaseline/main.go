// Command syncbaseline runs `make bench`'s baseline initial sync
// (syncbaseline.Sync: one connection per relay, layer 2 then layer 3 by
// REQ, every copy's signature checked, saved to a fresh store) in a process
// of its own, so that the benchmark with the relays in their own process
// (issue 24 §3; docs/performance.md) reads its CPU from /proc/<pid>/stat
// exactly as it reads graspd's.
//
// -plan names a JSON file: an array of {"url": …, "repos": [30617 address,
// …]}; -ids a file of the event ids the sync must store, one per line;
// -store the store's directory or URL (store.Open). The benchmark drives it
// over stdin and stdout, one JSON line per step, so that the CPU it reads
// covers exactly the sync:
//
//	stdout {"ready":true}                         store open, nothing sent yet
//	stdin  any line                               start the sync
//	stdout {"synced":true,"wall_s":…,"received":…,"verified":…,"stored":…}
//	stdin  any line                               check the ids
//	stdout {"missing":n}                          ids of -ids not in the store
//
// then it exits. An error ends it with {"error": …} and status 1.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/grasp-sync/grasp-sync/pkg/store"
	"github.com/grasp-sync/grasp-sync/pkg/testkit/syncbaseline"
)

func main() {
	plan := flag.String("plan", "", "JSON file: the relays and the repositories listing each")
	ids := flag.String("ids", "", "file of the event ids to check afterwards, one per line")
	dir := flag.String("store", "", "the store (directory or URL, as store.Open takes)")
	flag.Parse()
	enc := json.NewEncoder(os.Stdout)
	if err := run(*plan, *ids, *dir, bufio.NewScanner(os.Stdin), enc); err != nil {
		_ = enc.Encode(map[string]string{"error": err.Error()})
		fmt.Fprintln(os.Stderr, "syncbaseline:", err)
		os.Exit(1)
	}
}

func run(planPath, idsPath, dir string, in *bufio.Scanner, out *json.Encoder) error {
	if planPath == "" || dir == "" {
		return errors.New("-plan and -store are required")
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	b, err := os.ReadFile(planPath)
	if err != nil {
		return fmt.Errorf("read the plan: %w", err)
	}
	var relays []syncbaseline.Relay
	if err := json.Unmarshal(b, &relays); err != nil {
		return fmt.Errorf("parse the plan %s: %w", planPath, err)
	}
	st, err := store.Open(dir)
	if err != nil {
		return fmt.Errorf("open the store: %w", err)
	}
	defer st.Close()
	if err := out.Encode(map[string]bool{"ready": true}); err != nil {
		return err
	}
	if !in.Scan() {
		return errors.New("stdin closed before the start")
	}
	began := time.Now()
	stats, err := syncbaseline.Sync(ctx, st, relays)
	if err != nil {
		return err
	}
	if err := out.Encode(map[string]any{
		"synced": true, "wall_s": time.Since(began).Seconds(),
		"received": stats.Received, "verified": stats.Verified, "stored": stats.Stored,
	}); err != nil {
		return err
	}
	if !in.Scan() {
		return errors.New("stdin closed before the check")
	}
	missing := 0
	if idsPath != "" {
		b, err := os.ReadFile(idsPath)
		if err != nil {
			return fmt.Errorf("read the ids: %w", err)
		}
		for _, id := range strings.Fields(string(b)) {
			ok, err := st.Has(ctx, id)
			if err != nil {
				return fmt.Errorf("check %s: %w", id, err)
			}
			if !ok {
				missing++
			}
		}
	}
	return out.Encode(map[string]int{"missing": missing})
}
