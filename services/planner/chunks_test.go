package planner

import (
	"fmt"
	"testing"
	"time"
)

// rootsSent counts the roots each items batch of the drained commands
// names (one number per AddFilters that names any).
func (h *harness) rootsSent() []int {
	var out []int
	for _, c := range h.m.Drain() {
		if add := c.GetAddFilters(); add != nil && add.RootCount() > 0 {
			out = append(out, add.RootCount())
		}
	}
	return out
}

// streamRoots announces r1's roots growing by step every 500 ms until n,
// recomputing after each, and returns the root counts of the batches sent.
func streamRoots(h *harness, n, step int) []int {
	return streamEvery(h, n, step, 500*time.Millisecond)
}

// A stream of roots (an initial sync's, arriving as the ingester stores
// them) reaches a relay in batches of whole filters, 100 roots each, not
// one batch per recompute; what does not fill a filter goes once the
// stream pauses for ChunkQuiet, and roots after a pause go at once
// (docs/decisions/0061-planner-roots-in-full-filters.md).
func TestRootsStreamInFullFilters(t *testing.T) {
	rules := testRules()
	rules.ChunkQuiet = 3 * time.Second
	rules.ChunkStreamItems = 0 // ChunkQuiet alone (TestLargeStreamSpansDiscoveryWindows)
	h := newHarness(t, rules, 1)
	h.repo("r1", []string{relayA})
	h.recompute()
	h.connect(relayA, "s1") // layer 1, and r1's own part: an items batch
	h.drain()

	if got := fmt.Sprint(streamRoots(h, 330, 30)); got != "[100 100 100]" {
		t.Fatalf("roots per batch while they stream: %s, want [100 100 100]", got)
	}
	// 30 left: they go once no root came for ChunkQuiet, not before.
	h.now = h.now.Add(2 * time.Second)
	h.m.Tick(h.now)
	if got := h.rootsSent(); len(got) != 0 {
		t.Fatalf("held roots went before the stream paused: %v", got)
	}
	if s := h.status(relayA); s == "connected" {
		t.Fatalf("relay counted as synced while roots are held")
	}
	h.now = h.now.Add(time.Second)
	h.m.Tick(h.now)
	if got := fmt.Sprint(h.rootsSent()); got != "[30]" {
		t.Fatalf("after the pause: %s, want [30]", got)
	}
	// A root after a pause goes at once.
	h.now = h.now.Add(4 * time.Second)
	var names []string
	for i := range 331 {
		names = append(names, fmt.Sprintf("root%d", i))
	}
	h.repo("r1", []string{relayA}, names...)
	h.m.Recompute(h.now, false)
	if got := fmt.Sprint(h.rootsSent()); got != "[1]" {
		t.Fatalf("a root after a pause: %s, want [1]", got)
	}
}

// A trickle that never pauses and never fills a filter still goes every
// ChunkMaxWait.
func TestRootsTrickleGoWithinMaxWait(t *testing.T) {
	rules := testRules()
	rules.ChunkQuiet = 3 * time.Second
	h := newHarness(t, rules, 1)
	h.repo("r1", []string{relayA})
	h.recompute()
	h.connect(relayA, "s1")
	h.drain()
	// One root every 500 ms: 20 in each ChunkMaxWait (10 s).
	sent := streamRoots(h, 70, 1)
	if len(sent) != 3 {
		t.Fatalf("trickle of 70 roots over 35 s: batches %v, want three, one every ChunkMaxWait", sent)
	}
	for _, n := range sent {
		if n < 19 || n > 21 {
			t.Fatalf("trickle of 70 roots over 35 s: batches %v, want about 20 roots each (10 s of one root per 500 ms)", sent)
		}
	}
}

// Without the hold (ChunkQuiet 0) the same stream costs a batch per
// recompute: what the hold saves.
func TestRootsStreamWithoutHold(t *testing.T) {
	h := newHarness(t, testRules(), 1)
	h.repo("r1", []string{relayA})
	h.recompute()
	h.connect(relayA, "s1")
	h.drain()
	if got := len(streamRoots(h, 330, 30)); got != 11 {
		t.Fatalf("batches without the hold: %d, want 11", got)
	}
}

// Announcements that stream in (a bulk import, or a relay accepting them
// slowly) reach a relay the same way: the repositories' own parts that do
// not fill a filter wait for the stream to pause.
func TestReposStreamInFullFilters(t *testing.T) {
	rules := testRules()
	rules.ChunkQuiet = 3 * time.Second
	h := newHarness(t, rules, 1)
	h.repo("r0", []string{relayA})
	h.recompute()
	h.connect(relayA, "s1")
	h.drain()
	batches := func() []int {
		var out []int
		for _, c := range h.m.Drain() {
			if add := c.GetAddFilters(); add != nil && len(add.GetRepoRefs()) > 0 {
				out = append(out, len(add.GetRepoRefs()))
			}
		}
		return out
	}
	var sent []int
	for i := range 50 {
		if i%10 == 0 {
			h.now = h.now.Add(500 * time.Millisecond)
			h.m.Tick(h.now)
			sent = append(sent, batches()...)
		}
		h.repo(fmt.Sprintf("n%d", i), []string{relayA})
		if i%10 == 9 {
			h.m.Recompute(h.now, false)
			sent = append(sent, batches()...)
		}
	}
	if len(sent) != 0 {
		t.Fatalf("repositories sent while they stream: %v", sent)
	}
	h.now = h.now.Add(3 * time.Second)
	h.m.Tick(h.now)
	if got := fmt.Sprint(batches()); got != "[50]" {
		t.Fatalf("after the pause: %s, want [50]", got)
	}
}

// streamEvery announces r1's roots growing by step every gap until n,
// recomputing after each (Ticks every 500 ms in between), and returns the
// root counts of the batches sent.
func streamEvery(h *harness, n, step int, gap time.Duration) []int {
	var names []string
	var sent []int
	for len(names) < n {
		for range step {
			names = append(names, fmt.Sprintf("root%d", len(names)))
		}
		for waited := time.Duration(0); waited < gap; waited += 500 * time.Millisecond {
			h.now = h.now.Add(500 * time.Millisecond)
			h.m.Tick(h.now)
			sent = append(sent, h.rootsSent()...)
		}
		h.repo("r1", []string{relayA}, names...)
		h.m.Recompute(h.now, false)
		sent = append(sent, h.rootsSent()...)
	}
	return sent
}

// A large sync's index batches come once per discovery window (5 s) while
// its stored stream never pauses: a large stream's roots are held across
// those gaps (ChunkStreamQuiet), so they go in whole filters or every
// ChunkMaxWait, not one batch per index batch; a small one (a chain of
// single roots, each found in the batch before) keeps ChunkQuiet and goes 3 s
// after each step, as before (docs/decisions/0083-chunk-quiet-beyond-discovery-window.md).
func TestLargeStreamSpansDiscoveryWindows(t *testing.T) {
	rules := testRules()
	rules.ChunkQuiet = 3 * time.Second
	start := func() *harness {
		h := newHarness(t, rules, 1)
		h.repo("r1", []string{relayA})
		h.recompute()
		h.connect(relayA, "s1")
		h.drain()
		return h
	}
	// 40 roots every 6 s: the first 120 (over 100) make the stream large.
	h := start()
	sent := streamEvery(h, 400, 40, 6*time.Second)
	h.now = h.now.Add(20 * time.Second)
	h.m.Tick(h.now)
	sent = append(sent, h.rootsSent()...)
	total := 0
	for _, n := range sent {
		total += n
	}
	if total != 400 || len(sent) > 6 {
		t.Fatalf("400 roots in 10 index batches 6 s apart: batches %v, want all 400 in at most 6", sent)
	}
	rules.ChunkStreamItems = 0 // as before decision 0083: one batch per index batch
	h = start()
	if got := len(streamEvery(h, 400, 40, 6*time.Second)); got != 10 {
		t.Fatalf("without the large stream's quiet: %d batches, want 10", got)
	}
	// A chain: one root at a time, each 1 s after the batch before it.
	rules.ChunkStreamItems = 100
	h = start()
	var names []string
	for i := range 3 {
		names = append(names, fmt.Sprintf("root%d", i))
		h.now = h.now.Add(time.Second)
		h.repo("r1", []string{relayA}, names...)
		h.m.Recompute(h.now, false)
		waited := time.Duration(0)
		for len(h.rootsSent()) == 0 {
			if waited > 10*time.Second {
				t.Fatalf("step %d: the root never went", i)
			}
			h.now = h.now.Add(500 * time.Millisecond)
			waited += 500 * time.Millisecond
			h.m.Tick(h.now)
		}
		if i > 0 && waited != 3*time.Second {
			t.Fatalf("step %d of a chain of single roots went after %v, want ChunkQuiet (3s)", i, waited)
		}
	}
}
