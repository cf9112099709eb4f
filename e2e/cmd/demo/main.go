// Command demo shows grasp-sync working on one machine: it starts three
// local remote relays seeded with a generated NIP-34 dataset, starts graspd
// (every service in-process), announces the repositories to it, prints each
// relay's sync status every second until every relay is Connected and every
// event is stored, then prints a summary. `make demo` runs it.
package main

import (
	"context"
	"flag"
	"fmt"
	"net"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/grasp-sync/grasp-sync/e2e"
	"github.com/grasp-sync/grasp-sync/pkg/testkit/testrelay"
)

// demoTB lets the test harnesses (testkit relays, e2e.StartGraspd) run in a
// program: cleanups run at exit, failures end the program. Embedding the
// interface satisfies testing.TB's private method; only the methods below
// are called.
type demoTB struct {
	testing.TB
	cleanups []func()
}

func (d *demoTB) Helper()                         {}
func (d *demoTB) Name() string                    { return "demo" }
func (d *demoTB) Cleanup(f func())                { d.cleanups = append(d.cleanups, f) }
func (d *demoTB) Logf(format string, args ...any) { fmt.Printf(format+"\n", args...) }
func (d *demoTB) Errorf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "demo: "+format+"\n", args...)
}
func (d *demoTB) Error(args ...any) { fmt.Fprintln(os.Stderr, append([]any{"demo:"}, args...)...) }
func (d *demoTB) Fatalf(format string, args ...any) {
	d.Errorf(format, args...)
	d.close()
	os.Exit(1)
}
func (d *demoTB) Fatal(args ...any) { d.Error(args...); d.close(); os.Exit(1) }
func (d *demoTB) TempDir() string {
	dir, err := os.MkdirTemp("", "grasp-demo-")
	if err != nil {
		d.Fatalf("temp dir: %v", err)
	}
	d.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// close runs the cleanups, last registered first.
func (d *demoTB) close() {
	for i := len(d.cleanups) - 1; i >= 0; i-- {
		d.cleanups[i]()
	}
	d.cleanups = nil
}

var statusNames = map[float64]string{-1: "unknown", 0: "Disconnected", 1: "Connecting", 2: "Syncing", 3: "Connected", 4: "Connected (failures)", 5: "Disconnecting"}

func main() {
	repos := flag.Int("repos", 60, "repositories to generate")
	perRepo := flag.Int("events", 20, "events per repository (half roots, half comments)")
	timeout := flag.Duration("timeout", 5*time.Minute, "give up after this long")
	flag.Parse()
	tb := &demoTB{}
	defer tb.close()

	// The announcements must name our public URL before graspd starts.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatalf("pick a port: %v", err)
	}
	addr := ln.Addr().String()
	ln.Close()
	publicURL := "ws://" + addr

	relays := make([]*testrelay.Relay, 3)
	urls := make([]string, 3)
	for i := range relays {
		// The third relay speaks REQ only, like many real ones.
		relays[i] = testrelay.Start(tb, testrelay.Options{Negentropy: i < 2, MaxLimit: 500})
		urls[i] = relays[i].URL
	}
	ds := e2e.GenerateDataset(publicURL, urls, *repos, *perRepo, 2, uint64(time.Now().UnixNano()))
	for i, r := range relays {
		for _, e := range ds.PerRelay[i] {
			if err := r.Store.SaveEvent(context.Background(), e); err != nil {
				tb.Fatalf("seed %s: %v", r.URL, err)
			}
		}
		fmt.Printf("remote relay %s: %d events\n", r.URL, len(ds.PerRelay[i]))
	}

	env := e2e.BaseEnv(tb.TempDir())
	env["GRASP_RELAY_ADDR"] = addr
	logPath := os.Getenv("GRASP_DEMO_LOG")
	if logPath == "" {
		logPath = os.TempDir() + "/grasp-demo.log"
	}
	logf, err := os.Create(logPath)
	if err != nil {
		tb.Fatalf("log file: %v", err)
	}
	defer logf.Close()
	app, _ := e2e.StartGraspd(tb, env, logf, "info")
	fmt.Printf("graspd: relay %s, metrics http://%s/metrics, log %s\n", app.RelayURL(), app.MetricsAddr(), logPath)

	began := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	if err := testrelay.Publish(ctx, app.RelayURL(), ds.Announcements...); err != nil {
		tb.Fatalf("announce: %v", err)
	}
	fmt.Printf("announced %d repositories to graspd\n\n", len(ds.Announcements))

	ids := e2e.IDs(ds.Distinct...)
	for {
		m, merr := e2e.Metrics(ctx, app)
		stored, serr := e2e.CountStored(ctx, app, ids)
		if merr != nil || serr != nil {
			tb.Fatalf("status: %v %v", merr, serr)
		}
		var line []string
		connected := 0
		for _, u := range urls {
			st := e2e.RelayStatus(m, u)
			if st == e2e.StatusConnected {
				connected++
			}
			line = append(line, fmt.Sprintf("%s %s", strings.TrimPrefix(u, "ws://"), statusNames[st]))
		}
		fmt.Printf("%6.1fs  %s  stored %d/%d\n", time.Since(began).Seconds(), strings.Join(line, " | "), stored, len(ids))
		if connected == len(urls) && stored == len(ids) {
			break
		}
		select {
		case <-ctx.Done():
			tb.Fatalf("not everything synced within %s", *timeout)
		case <-time.After(time.Second):
		}
	}
	took := time.Since(began)
	fmt.Printf("\nsummary: %d repositories, %d events synced from 3 relays in %s\n", len(ds.Repos), len(ds.Distinct), took.Round(10*time.Millisecond))
	counts := e2e.KindCounts(append(slices.Clone(ds.Distinct), ds.Announcements...))
	kinds := make([]int, 0, len(counts))
	for k := range counts {
		kinds = append(kinds, k)
	}
	slices.Sort(kinds)
	names := map[int]string{30617: "announcements", 1617: "patches", 1621: "issues", 1111: "comments"}
	for _, k := range kinds {
		fmt.Printf("  kind %5d %-14s %6d\n", k, names[k], counts[k])
	}
}
