package relay

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/dgraph-io/badger/v4"
	eventbadger "github.com/fiatjaf/eventstore/badger"
	"github.com/fiatjaf/khatru"
	"github.com/nbd-wtf/go-nostr"

	"github.com/grasp-sync/grasp-sync/pkg/store"
	"github.com/grasp-sync/grasp-sync/pkg/testkit"
)

// The read benchmark of issue 24 §4: our relay (the guard, per-connection
// ordering, the kv store on pebble) against plain khatru on eventstore's
// badger, serving the same events to the same clients. docs/performance.md, "The own relay's reads".
//
// How it is kept fair: each relay runs in a process of its own (this test
// binary started again with GRASP_READBENCH_SERVE, see serveReadBench), over
// a store the benchmark filled before starting it; the clients run in the
// test process, which does nothing else meanwhile, so they share no
// goroutines, heap or garbage collector with either relay. Both relays stay
// up for the whole run and are measured alternately (khatru first in even
// rounds, ours first in odd ones), each after a warm-up round, so load
// changes on the box hit both alike. Besides requests per second the relay
// process's CPU-seconds per request are read from /proc/<pid>/stat, which
// a busy box disturbs less than wall time.

// Read benchmark shape: 20 clients, each sending 30 REQs one after another
// (the next once the previous one's EOSE came, then CLOSEd).
const (
	readBenchClients = 20
	readBenchREQs    = 30
	readBenchRounds  = 3
	readBenchRepos   = 10
	readBenchIssues  = 500 // per repository
	readBenchIDs     = 100 // ids per by-id REQ
)

// TestBenchReads measures requests/s of our relay and of plain khatru on
// the same query mixes (make bench; GRASP_BENCH=1). It prints one "bench
// row:" per mix with issue 24's target (≥ 1.0× plain khatru).
// GRASP_READBENCH_PROFILE=DIR writes each relay's CPU profile there.
func TestBenchReads(t *testing.T) {
	if os.Getenv("GRASP_BENCH") == "" {
		t.Skip("set GRASP_BENCH=1 (make bench) to run the read benchmark")
	}
	dir := t.TempDir()
	ds := newReadBenchData()
	t.Logf("dataset: %d events (%d repositories × (announcement + %d issues + %d comments)), mean %d bytes",
		len(ds.events), readBenchRepos, readBenchIssues, readBenchIssues, ds.meanSize())
	fillOurs(t, filepath.Join(dir, "ours"), ds.events)
	fillKhatru(t, filepath.Join(dir, "khatru"), ds.events)

	relays := []*benchRelay{
		startBenchRelay(t, "khatru", filepath.Join(dir, "khatru")),
		startBenchRelay(t, "ours", filepath.Join(dir, "ours")),
	}
	mixes := ds.mixes()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	// Warm-up: every mix once on each relay (caches, connections' first
	// allocations), not counted.
	for _, r := range relays {
		for _, m := range mixes {
			if _, err := runReadLoad(ctx, r, m); err != nil {
				t.Fatalf("warm-up %s on %s: %v", m.name, r.name, err)
			}
		}
	}
	results := map[string]map[string][]readResult{} // mix → relay → rounds
	for round := 0; round < readBenchRounds; round++ {
		order := relays
		if round%2 == 1 {
			order = []*benchRelay{relays[1], relays[0]}
		}
		for _, m := range mixes {
			for _, r := range order {
				res, err := runReadLoad(ctx, r, m)
				if err != nil {
					t.Fatalf("round %d, %s on %s: %v", round, m.name, r.name, err)
				}
				if results[m.name] == nil {
					results[m.name] = map[string][]readResult{}
				}
				results[m.name][r.name] = append(results[m.name][r.name], res)
				t.Logf("round %d %-7s %-6s: %6.0f requests/s, p50 %5.1f ms, p90 %5.1f ms, relay cpu %.2f ms/request, client cpu %.2f ms/request",
					round, m.name, r.name, res.rate(), ms(res.p(50)), ms(res.p(90)), res.relayCPUPerReq(), res.clientCPUPerReq())
			}
		}
	}
	load, _ := os.ReadFile("/proc/loadavg")
	t.Logf("load average at the end: %s", strings.TrimSpace(string(load)))
	for _, m := range mixes {
		k, o := results[m.name]["khatru"], results[m.name]["ours"]
		kr, or := sumRate(k), sumRate(o)
		ratio := or / kr
		verdict := "met"
		if ratio < 1.0 {
			verdict = "NOT MET"
		}
		fmt.Printf("bench row: relay reads, %s (%d clients × %d REQs, %d alternating rounds): ours %.0f requests/s (p50 %.1f ms, %.2f cpu-ms/request), plain khatru on badger %.0f requests/s (p50 %.1f ms, %.2f cpu-ms/request) = %.2f× (target ≥ 1.0×) — %s\n",
			m.name, readBenchClients, readBenchREQs, readBenchRounds,
			or, ms(medianP50(o)), meanCPU(o), kr, ms(medianP50(k)), meanCPU(k), ratio, verdict)
	}
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// readBenchData is the benchmark's events and what the clients ask for.
type readBenchData struct {
	events  []*nostr.Event
	repos   []string   // repository coordinates (30617:pubkey:d)
	issueID [][]string // ids of each repository's issues
}

func newReadBenchData() *readBenchData {
	ds := &readBenchData{}
	base := nostr.Timestamp(time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC).Unix())
	// Issue bodies of a realistic size: a paragraph or two.
	body := strings.Repeat("Steps to reproduce: clone, build, run the tests; the third one fails with a timeout. ", 6)
	for r := 0; r < readBenchRepos; r++ {
		owner := testkit.NewKey()
		d := fmt.Sprintf("repo-%d", r)
		ref := testkit.RepoRef(owner.PubKey, d)
		ds.repos = append(ds.repos, ref)
		ds.events = append(ds.events, owner.Announcement(d, []string{"https://git.example.com/" + d + ".git"},
			[]string{"wss://git.example.com"}, nil, testkit.At(base)))
		var ids []string
		for i := 0; i < readBenchIssues; i++ {
			author := owner
			if i%3 != 0 {
				author = testkit.NewKey()
			}
			at := base + nostr.Timestamp(r*readBenchIssues*2+i*2+1)
			issue := author.Issue(ref, fmt.Sprintf("issue %d of %s", i, d), testkit.At(at),
				testkit.WithContent(fmt.Sprintf("%s (#%d)", body, i)))
			comment := owner.Comment(issue, issue, "Thanks, confirmed: "+body[:120], testkit.At(at+1))
			ds.events = append(ds.events, issue, comment)
			ids = append(ids, issue.ID)
		}
		ds.issueID = append(ds.issueID, ids)
	}
	return ds
}

func (ds *readBenchData) meanSize() int {
	n := 0
	for _, e := range ds.events {
		n += len(e.String())
	}
	return n / len(ds.events)
}

// readMix is one query mix: what client c sends as its i-th REQ, and how
// many events the answer must hold.
type readMix struct {
	name string
	req  func(c, i int) (filter nostr.Filter, want int)
}

// mixes: "issues" is issue 24 §4's (every REQ: one repository's 500
// issues, by its "a" tag); "ids" asks for 100 issues by id, from all
// repositories (the store's lookups by id).
func (ds *readBenchData) mixes() []readMix {
	return []readMix{
		{name: "issues", req: func(c, i int) (nostr.Filter, int) {
			ref := ds.repos[(c+i)%len(ds.repos)]
			return nostr.Filter{Kinds: []int{testkit.KindIssue}, Tags: nostr.TagMap{"a": {ref}}, Limit: 500}, readBenchIssues
		}},
		{name: "ids", req: func(c, i int) (nostr.Filter, int) {
			rng := rand.New(rand.NewPCG(uint64(c), uint64(i)))
			var ids []string
			for len(ids) < readBenchIDs {
				repo := ds.issueID[rng.IntN(len(ds.issueID))]
				id := repo[rng.IntN(len(repo))]
				if !slices.Contains(ids, id) {
					ids = append(ids, id)
				}
			}
			return nostr.Filter{IDs: ids}, readBenchIDs
		}},
	}
}

// fillOurs writes the events into a kv+pebble store, as graspd's ingester
// would.
func fillOurs(t *testing.T, dir string, evts []*nostr.Event) {
	st, err := store.Open("kv+pebble://" + dir)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	for chunk := range slices.Chunk(evts, 256) {
		for _, r := range st.SaveBatch(context.Background(), chunk) {
			if r.Err != nil || !r.Stored {
				t.Fatalf("store: %+v", r)
			}
		}
	}
}

// fillKhatru writes the events into eventstore's badger with its defaults.
func fillKhatru(t *testing.T, dir string, evts []*nostr.Event) {
	db := &eventbadger.BadgerBackend{Path: dir, BadgerOptionsModifier: quietBadger}
	if err := db.Init(); err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	for _, e := range evts {
		var err error
		if nostr.IsAddressableKind(e.Kind) {
			err = db.ReplaceEvent(context.Background(), e)
		} else {
			err = db.SaveEvent(context.Background(), e)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
}

// quietBadger leaves badger's options at their defaults but its INFO log.
func quietBadger(o badger.Options) badger.Options { return o.WithLogger(nil) }

// benchRelay is a relay process of the benchmark.
type benchRelay struct {
	name string
	url  string
	pid  int
}

// startBenchRelay starts this test binary as the relay named kind over dir
// and waits for its address. The process ends when the test does (its
// stdin closes; Pdeathsig if the test binary dies first).
func startBenchRelay(t *testing.T, kind, dir string) *benchRelay {
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "GRASP_READBENCH_SERVE="+kind, "GRASP_READBENCH_DIR="+dir)
	cmd.Stderr = os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = stdin.Close()
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
	})
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil {
		t.Fatalf("relay %s: no address: %v", kind, err)
	}
	url, ok := strings.CutPrefix(strings.TrimSpace(line), "listening ")
	if !ok {
		t.Fatalf("relay %s: unexpected first line %q", kind, line)
	}
	go func() { _, _ = io.Copy(io.Discard, stdout) }()
	return &benchRelay{name: kind, url: url, pid: cmd.Process.Pid}
}

// serveReadBench is the relay process of the read benchmark (TestMain runs
// it when GRASP_READBENCH_SERVE is set): "ours" (this package's relay over
// kv+pebble, as graspd serves it) or "khatru" (plain khatru on eventstore's
// badger, as khatru's README sets it up). It prints "listening URL" and
// serves until its stdin closes.
func serveReadBench(kind, dir string) error {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	var h http.Handler
	switch kind {
	case "ours":
		st, err := store.Open("kv+pebble://" + dir)
		if err != nil {
			return err
		}
		defer st.Close()
		log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
		// The benchmark's 20 clients share 127.0.0.1; trusted, it is
		// treated as 20 clients from addresses of their own would be
		// (each well within the per-address limits).
		h = New(Config{Addr: ln.Addr().String(), TrustedAddresses: "127.0.0.1"}, st, nil, log).Handler()
	case "khatru":
		db := &eventbadger.BadgerBackend{Path: dir, BadgerOptionsModifier: quietBadger}
		if err := db.Init(); err != nil {
			return err
		}
		defer db.Close()
		k := khatru.NewRelay()
		k.StoreEvent = append(k.StoreEvent, db.SaveEvent)
		k.QueryEvents = append(k.QueryEvents, db.QueryEvents)
		k.CountEvents = append(k.CountEvents, db.CountEvents)
		k.DeleteEvent = append(k.DeleteEvent, db.DeleteEvent)
		k.ReplaceEvent = append(k.ReplaceEvent, db.ReplaceEvent)
		h = k
	default:
		return fmt.Errorf("GRASP_READBENCH_SERVE=%s: want ours or khatru", kind)
	}
	if pdir := os.Getenv("GRASP_READBENCH_PROFILE"); pdir != "" {
		f, err := os.Create(filepath.Join(pdir, kind+".cpu.pprof"))
		if err != nil {
			return err
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer f.Close()
		defer pprof.StopCPUProfile()
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	fmt.Printf("listening ws://%s\n", ln.Addr())
	stdinClosed := make(chan struct{})
	go func() { _, _ = io.Copy(io.Discard, os.Stdin); close(stdinClosed) }()
	select {
	case err := <-errc:
		return err
	case <-stdinClosed:
	}
	_ = srv.Close() // websockets are hijacked: the process exit ends them
	return nil
}

// readResult is one measured run of a mix on a relay.
type readResult struct {
	wall       time.Duration
	latencies  []time.Duration // sorted
	relayCPU   time.Duration   // the relay process's user+system time
	clientCPU  time.Duration   // this process's
	requests   int
	eventsSeen int
}

func (r readResult) rate() float64 { return float64(r.requests) / r.wall.Seconds() }
func (r readResult) p(q int) time.Duration {
	return r.latencies[(len(r.latencies)-1)*q/100]
}
func (r readResult) relayCPUPerReq() float64 { return ms(r.relayCPU) / float64(r.requests) }
func (r readResult) clientCPUPerReq() float64 {
	return ms(r.clientCPU) / float64(r.requests)
}

// sumRate is requests/s over all rounds together.
func sumRate(rs []readResult) float64 {
	var n int
	var wall time.Duration
	for _, r := range rs {
		n += r.requests
		wall += r.wall
	}
	return float64(n) / wall.Seconds()
}

func medianP50(rs []readResult) time.Duration {
	var ps []time.Duration
	for _, r := range rs {
		ps = append(ps, r.p(50))
	}
	slices.Sort(ps)
	return ps[len(ps)/2]
}

func meanCPU(rs []readResult) float64 {
	var cpu time.Duration
	n := 0
	for _, r := range rs {
		cpu += r.relayCPU
		n += r.requests
	}
	return ms(cpu) / float64(n)
}

// runReadLoad connects the clients, then lets each send its REQs in turn
// and times them; connections are opened before the clock starts.
func runReadLoad(ctx context.Context, r *benchRelay, m readMix) (readResult, error) {
	conns := make([]*websocket.Conn, readBenchClients)
	for i := range conns {
		c, _, err := websocket.Dial(ctx, r.url, nil)
		if err != nil {
			return readResult{}, fmt.Errorf("dial %s: %w", r.url, err)
		}
		c.SetReadLimit(16 << 20)
		conns[i] = c
		defer c.CloseNow()
	}
	lat := make([][]time.Duration, readBenchClients)
	seen := make([]int, readBenchClients)
	errs := make([]error, readBenchClients)
	cpu0, err := procCPU(r.pid)
	if err != nil {
		return readResult{}, err
	}
	self0, _ := procCPU(os.Getpid())
	start := time.Now()
	var wg sync.WaitGroup
	for c := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < readBenchREQs; i++ {
				f, want := m.req(c, i)
				t0 := time.Now()
				n, err := oneREQ(ctx, conns[c], "s"+strconv.Itoa(i), f)
				if err != nil {
					errs[c] = err
					return
				}
				if n != want {
					errs[c] = fmt.Errorf("client %d REQ %d: %d events, want %d", c, i, n, want)
					return
				}
				lat[c] = append(lat[c], time.Since(t0))
				seen[c] += n
			}
		}()
	}
	wg.Wait()
	wall := time.Since(start)
	cpu1, err := procCPU(r.pid)
	if err != nil {
		return readResult{}, err
	}
	self1, _ := procCPU(os.Getpid())
	for _, err := range errs {
		if err != nil {
			return readResult{}, err
		}
	}
	res := readResult{wall: wall, relayCPU: cpu1 - cpu0, clientCPU: self1 - self0, requests: readBenchClients * readBenchREQs}
	for c := range lat {
		res.latencies = append(res.latencies, lat[c]...)
		res.eventsSeen += seen[c]
	}
	slices.Sort(res.latencies)
	return res, nil
}

// oneREQ sends a REQ, counts the EVENTs until its EOSE, then CLOSEs it, as
// a client that only wants stored events does. Only the label of each
// message is looked at, so the client costs little next to the relay (it
// shares the box's two cores with the relay measured).
func oneREQ(ctx context.Context, c *websocket.Conn, sub string, f nostr.Filter) (int, error) {
	req, err := json.Marshal(nostr.ReqEnvelope{SubscriptionID: sub, Filters: nostr.Filters{f}})
	if err != nil {
		return 0, err
	}
	if err := c.Write(ctx, websocket.MessageText, req); err != nil {
		return 0, err
	}
	n := 0
	var head [16]byte
	for {
		// Only the label is read into memory; the rest of the message is
		// discarded through a pooled buffer (no allocation per message).
		_, r, err := c.Reader(ctx)
		if err != nil {
			return n, err
		}
		k, err := io.ReadFull(r, head[:])
		if err != nil && err != io.ErrUnexpectedEOF {
			return n, err
		}
		if _, err := io.Copy(io.Discard, r); err != nil {
			return n, err
		}
		msg := head[:k]
		switch {
		case bytes.HasPrefix(msg, []byte(`["EVENT"`)):
			n++
		case bytes.HasPrefix(msg, []byte(`["EOSE"`)):
			closeMsg, _ := json.Marshal(nostr.CloseEnvelope(sub))
			return n, c.Write(ctx, websocket.MessageText, closeMsg)
		default:
			return n, fmt.Errorf("unexpected answer to %s: %s…", sub, msg)
		}
	}
}

// procCPU is a process's user + system CPU time from /proc/<pid>/stat.
func procCPU(pid int) (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// Fields after the command name (which may hold spaces) start after
	// the last ')'; utime and stime are fields 14 and 15 of the line.
	rest := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
	if len(rest) < 13 {
		return 0, fmt.Errorf("/proc/%d/stat: too few fields", pid)
	}
	utime, _ := strconv.ParseInt(rest[11], 10, 64)
	stime, _ := strconv.ParseInt(rest[12], 10, 64)
	const ticks = 100 // USER_HZ on Linux
	return time.Duration(utime+stime) * time.Second / ticks, nil
}
