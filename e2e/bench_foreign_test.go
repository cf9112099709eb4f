package e2e

import (
	"context"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/nbd-wtf/go-nostr"

	"github.com/grasp-sync/grasp-sync/pkg/testkit"

	"github.com/grasp-sync/grasp-sync/pkg/testkit/testrelay"
)

// TestBenchEndToEndForeign is `make bench`'s resync measurement in a world
// where half the announcements on each relay are foreign: each relay holds
// the announcements of the repositories listing it and as many announcements
// of repositories that do not list us, by authors who maintain none of ours
// (what layer 1 finds on a public relay). After the initial sync, a fresh
// planner resyncs every relay from scratch with the ingester's remembered
// refusals kept (the rejected-events bucket is the only NATS state carried
// over), once with NIP-77 and once with REQ only. It writes its row of
// docs/performance.md. GRASP_BENCH=1 enables it; GRASP_BENCH_REPOS and
// GRASP_BENCH_EVENTS_PER_REPO scale it.
func TestBenchEndToEndForeign(t *testing.T) {
	if os.Getenv("GRASP_BENCH") == "" {
		t.Skip("SKIP: benchmark; run with GRASP_BENCH=1 (make bench)")
	}
	repos, perRepo := benchInt("GRASP_BENCH_REPOS", 1000), benchInt("GRASP_BENCH_EVENTS_PER_REPO", 50)
	load := "unknown"
	if b, err := os.ReadFile("/proc/loadavg"); err == nil {
		load = strings.Fields(string(b))[0]
	}
	const nRelays = 5
	remotes := make([]*testrelay.Relay, nRelays)
	urls := make([]string, nRelays)
	for i := range remotes {
		remotes[i] = testrelay.Start(t, testrelay.Options{Negentropy: true, MaxLimit: 500})
		StrictTags(remotes[i])
		urls[i] = remotes[i].URL
	}
	ds := GenerateDataset(benchPublicURL, urls, repos, perRepo, 2, 1)
	ours, foreign := 0, 0
	rng := rand.New(rand.NewPCG(2, 3))
	for i := range remotes {
		var anns []*nostr.Event
		for r, rel := range ds.RepoRelays {
			for _, j := range rel {
				if j == i {
					anns = append(anns, ds.Announcements[r])
				}
			}
		}
		ours += len(anns)
		for n := len(anns); n > 0; n-- {
			k := testkit.NewKey()
			d := fmt.Sprintf("foreign-%d-%d", i, n)
			// Spread over 90 days like ours (GenerateDataset says why).
			at := testkit.At(nostr.Timestamp(time.Now().Add(-90*24*time.Hour).Unix() + rng.Int64N(89*24*3600)))
			anns = append(anns, k.Announcement(d, []string{"https://git.elsewhere.example/" + k.PubKey + "/" + d + ".git"},
				[]string{"wss://relay.elsewhere.example"}, nil, at))
			foreign++
		}
		ds.PerRelay[i] = append(ds.PerRelay[i], anns...)
	}
	seedRelays(t, remotes, ds)

	// Initial sync: the foreign announcements are fetched and refused once.
	dataDir := t.TempDir()
	env := BaseEnv(dataDir)
	env["GRASP_PUBLIC_URL"] = benchPublicURL
	env["GRASP_SHARDS"] = "16"
	app, stop := StartGraspd(t, env, nil, "")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	if err := testrelay.Publish(ctx, app.RelayURL(), ds.Announcements...); err != nil {
		t.Fatalf("publish announcements: %v", err)
	}
	if err := waitAll(ctx, app.Store(), ds.Distinct); err != nil {
		t.Fatalf("initial sync: %v", err)
	}
	if err := WaitQuiescent(ctx, app, urls, time.Second); err != nil {
		t.Fatal(err)
	}
	m, err := Metrics(ctx, app)
	if err != nil {
		t.Fatal(err)
	}
	refused := MetricSum(m, "grasp_ingester_refused_total", `reason="not-maintainer"`) + MetricSum(m, "grasp_ingester_refused_total", `reason="not-listed"`)
	t.Logf("initial sync done; %v foreign announcements refused (%d seeded)", refused, foreign)
	stop()

	negDir, reqDir := t.TempDir(), t.TempDir()
	for _, dir := range []string{negDir, reqDir} {
		if err := copyRejected(filepath.Join(dataDir, "nats"), filepath.Join(dir, "nats")); err != nil {
			t.Fatal(err)
		}
	}
	eventsDir := filepath.Join(dataDir, "events")
	neg, negWall, negEvents := resyncBytesIn(t, negDir, eventsDir, urls, false)
	req, reqWall, _ := resyncBytesIn(t, reqDir, eventsDir, urls, true)
	ratio := neg / req
	row := fmt.Sprintf("| %d repositories × %d events, %d relays; %d of our announcements and %d foreign ones on the relays | "+
		"%.0f KB (%s, %d events) | %.0f KB (%s) | %.1f%% | ≤ 5%% — %s |",
		repos, perRepo, nRelays, ours, foreign, neg/1024, negWall.Round(100*time.Millisecond), negEvents,
		req/1024, reqWall.Round(100*time.Millisecond), 100*ratio, map[bool]string{true: "met", false: "**not met**"}[ratio <= 0.05])
	report := "## Resync bytes with foreign announcements\n\n" +
		"`TestBenchEndToEndForeign` (`make bench`, no -race): the end-to-end world plus, on each relay, the announcements of the " +
		"repositories listing it and as many announcements that do not list us by authors who maintain none of our " +
		"repositories. After the initial sync, a fresh graspd resyncs every relay from scratch over the complete store with " +
		"only the ingester's remembered refusals (the rejected-events bucket) carried over. " +
		fmt.Sprintf("Machine: %d CPUs, load average %s when the run began, %s, %s.\n\n", runtime.NumCPU(), load, runtime.Version(), time.Now().UTC().Format("2006-01-02")) +
		"| world | NIP-77 | REQ+EOSE | ratio | target |\n| --- | --- | --- | --- | --- |\n" + row + "\n"
	t.Log("\n" + report)
	if err := writeSection(filepath.Join("..", "docs", "performance.md"), perfForeignBegin, perfForeignEnd, report); err != nil {
		t.Fatal(err)
	}
}

// Markers around the section TestBenchEndToEndForeign owns in
// docs/performance.md.
const (
	perfForeignBegin = "<!-- e2e bench foreign: begin (generated by make bench; edit e2e/bench_foreign_test.go) -->"
	perfForeignEnd   = "<!-- e2e bench foreign: end -->"
)

// writeSection replaces the text between begin and end in path (or appends
// it with the markers).
func writeSection(path, begin, end, report string) error {
	old, err := os.ReadFile(path)
	if err != nil && !os.IsNotExist(err) {
		return err
	}
	s := string(old)
	block := begin + "\n\n" + report + "\n" + end + "\n"
	if i, j := strings.Index(s, begin), strings.Index(s, end); i >= 0 && j > i {
		s = s[:i] + block + s[j+len(end)+1:]
	} else {
		s = strings.TrimRight(s, "\n") + "\n\n" + block
	}
	return os.WriteFile(path, []byte(s), 0o644)
}

// copyRejected copies the JetStream stream of the rejected-events bucket
// (KV_<prefix>_rejected) from one embedded NATS store directory to
// another, leaving every other stream and bucket behind: the new graspd
// starts with no planner, fetcher or index state, but with what the
// ingester remembered.
func copyRejected(from, to string) error {
	var src string
	err := filepath.WalkDir(from, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && strings.HasPrefix(d.Name(), "KV_") && strings.HasSuffix(d.Name(), "_rejected") {
			src = path
			return filepath.SkipAll
		}
		return nil
	})
	if err != nil {
		return err
	}
	if src == "" {
		return fmt.Errorf("no rejected-events stream under %s", from)
	}
	return filepath.WalkDir(src, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		r, err := filepath.Rel(from, path)
		if err != nil {
			return err
		}
		dst := filepath.Join(to, r)
		if d.IsDir() {
			return os.MkdirAll(dst, 0o755)
		}
		data, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		return os.WriteFile(dst, data, 0o644)
	})
}
