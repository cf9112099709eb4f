package e2e

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// GRASP_BENCH_SCALE_PROFILE=1 on a multi-process row: where the deployment's
// CPU goes. Once a quarter of the world is stored, every process's CPU
// profile is taken over the same window (GRASP_BENCH_SCALE_PROFILE_SECS,
// default 60): the NATS nodes' from the prof_port the harness gives them
// (never the shipped manifests), the services' from /debug/pprof/ on their
// metrics address (GRASP_PPROF). Each NATS node's monitoring endpoints are
// saved at the window's start and end, so message counts per connection,
// subscription, stream, consumer and route can be read as rates:
// <world dir>/profiles/<process>.cpu.pprof and <node>-<endpoint>-{0,1}.json.

// natsSnapshots are the monitoring endpoints saved around the window.
var natsSnapshots = map[string]string{
	"varz":   "/varz",
	"routez": "/routez",
	"connz":  "/connz?subs=detail&limit=4096",
	"jsz":    "/jsz?accounts=true&streams=true&consumers=true&config=true&raft=true",
}

// profileSecs is GRASP_BENCH_SCALE_PROFILE_SECS (default 60).
func profileSecs() int {
	d := benchDuration("GRASP_BENCH_SCALE_PROFILE_SECS", 60*time.Second)
	return max(1, int(d.Seconds()))
}

// captureProfiles takes one window of profiles and snapshots (above) into
// dir; failures are logged, not fatal: they cost the row its diagnosis only.
func captureProfiles(ctx context.Context, t *testing.T, d *Deployment, dir string, secs int) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Logf("profiles: %v", err)
		return
	}
	snap := func(suffix string) {
		for _, n := range d.NATS {
			if !n.Running() {
				continue
			}
			base := strings.TrimSuffix(n.HealthURL, "/healthz")
			for name, path := range natsSnapshots {
				if err := fetchToFile(ctx, base+path, filepath.Join(dir, fmt.Sprintf("%s-%s-%s.json", n.Name, name, suffix)), 30*time.Second); err != nil {
					t.Logf("profiles: %s %s: %v", n.Name, name, err)
				}
			}
		}
	}
	began := time.Now()
	snap("0")
	var wg sync.WaitGroup
	for _, p := range d.Procs() {
		if p.ProfAddr == "" || !p.Running() {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			u := fmt.Sprintf("http://%s/debug/pprof/profile?seconds=%d", p.ProfAddr, secs)
			if err := fetchToFile(ctx, u, filepath.Join(dir, p.Name+".cpu.pprof"), time.Duration(secs+60)*time.Second); err != nil {
				t.Logf("profiles: %s: %v", p.Name, err)
			}
		}()
	}
	wg.Wait()
	snap("1")
	_ = os.WriteFile(filepath.Join(dir, "window.txt"), []byte(fmt.Sprintf("snapshots %s apart; profiles %d s\n", time.Since(began).Round(time.Millisecond), secs)), 0o644)
	t.Logf("profiles: %d s window saved in %s", secs, dir)
}

// fetchToFile writes the body of a GET of u to path.
func fetchToFile(ctx context.Context, u, path string, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s", u, resp.Status)
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, resp.Body); err != nil {
		_ = f.Close()
		return err
	}
	return f.Close()
}
