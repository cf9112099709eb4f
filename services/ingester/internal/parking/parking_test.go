package parking_test

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nbd-wtf/go-nostr"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/grasp-sync/grasp-sync/pkg/bus"
	"github.com/grasp-sync/grasp-sync/pkg/clock"
	"github.com/grasp-sync/grasp-sync/pkg/testkit"
	"github.com/grasp-sync/grasp-sync/pkg/testkit/natstest"
	"github.com/grasp-sync/grasp-sync/services/ingester/internal/parking"
)

var t0 = time.Unix(1_750_000_000, 0)

func TestToken(t *testing.T) {
	id := strings.Repeat("ab", 32)
	coord := "30617:" + id + ":my repo/with.dots"
	tests := []struct {
		name, ref string
		check     func(string) bool
	}{
		{"id stays", id, func(s string) bool { return s == id }},
		{"coordinate hashed, subject-safe", coord, func(s string) bool {
			return len(s) == 33 && s[0] == 'c' && !strings.ContainsAny(s, ". *>")
		}},
		{"upper-case id is not an id", strings.ToUpper(id), func(s string) bool { return s != strings.ToUpper(id) && s[0] == 'c' }},
		{"empty", "", func(s string) bool { return s == "" }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := parking.Token(tt.ref); !tt.check(got) {
				t.Fatalf("Token(%q) = %q", tt.ref, got)
			}
		})
	}
	if parking.Token(coord) != parking.Token(coord) || parking.Token(coord) == parking.Token(coord+"x") {
		t.Fatal("coordinate tokens not stable or not distinct")
	}
}

func TestWakeTokensAndSignals(t *testing.T) {
	alice, bob := testkit.NewKey(), testkit.NewKey()
	repo := testkit.RepoRef(alice.PubKey, "repo")
	issue := bob.Issue(repo, "bug")
	comment := bob.Comment(issue, issue, "me too")
	ann := alice.Announcement("repo", []string{"https://x/y.git"}, []string{"wss://x"}, nil)
	var many []string
	for i := 0; i < 40; i++ {
		many = append(many, bob.Note(strings.Repeat("n", i+1)).ID)
	}

	tests := []struct {
		name string
		got  []string
		want []string // in this order, exactly
	}{
		{"parked comment waits for its issue and for itself", parking.WakeTokens(comment, []string{issue.ID}, 16),
			[]string{comment.ID, issue.ID}},
		{"parked announcement also waits under its coordinate", parking.WakeTokens(ann, []string{testkit.RepoRef(bob.PubKey, "repo")}, 16),
			[]string{ann.ID, parking.Token(repo), parking.Token(testkit.RepoRef(bob.PubKey, "repo"))}},
		{"capped, own id first", parking.WakeTokens(comment, many, 3), []string{comment.ID, many[0], many[1]}},
		{"duplicates dropped", parking.WakeTokens(comment, []string{issue.ID, issue.ID, comment.ID}, 16), []string{comment.ID, issue.ID}},
		{"stored issue signals itself and its repo", parking.Signals(issue, 32), []string{issue.ID, parking.Token(repo)}},
		{"stored comment signals itself and the issue it tags", parking.Signals(comment, 32), []string{comment.ID, issue.ID}},
		{"stored announcement signals its coordinate", parking.Signals(ann, 32), []string{ann.ID, parking.Token(repo)}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if !slices.Equal(tt.got, tt.want) {
				t.Fatalf("got %v\nwant %v", tt.got, tt.want)
			}
		})
	}
}

type fixture struct {
	lot   *parking.Lot
	reg   *prometheus.Registry
	clock *clock.Fake
	bus   *bus.Bus
}

func open(t *testing.T, n *natstest.NATS, cfg parking.Config, clk *clock.Fake) fixture {
	t.Helper()
	ctx := context.Background()
	b, err := bus.Connect(ctx, n.URL, t.Name(), bus.Names{Prefix: "t"}, bus.Security{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.Close)
	reg := prometheus.NewRegistry()
	lot, err := parking.Open(ctx, b, cfg, clk, nil, reg)
	if err != nil {
		t.Fatal(err)
	}
	return fixture{lot: lot, reg: reg, clock: clk, bus: b}
}

func ids(ps []parking.Parked) []string {
	var out []string
	for _, p := range ps {
		out = append(out, p.Event.ID)
	}
	slices.Sort(out)
	return out
}

func sorted(s ...string) []string { slices.Sort(s); return s }

func counter(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	total := 0.0
	for _, mf := range mfs {
		if mf.GetName() == name {
			for _, m := range mf.GetMetric() {
				total += m.GetCounter().GetValue()
			}
		}
	}
	return total
}

func TestParkWakeUnpark(t *testing.T) {
	ctx := context.Background()
	f := open(t, natstest.Start(t), parking.Config{}, clock.NewFake(t0))
	alice, bob := testkit.NewKey(), testkit.NewKey()
	repo := testkit.RepoRef(alice.PubKey, "repo")
	ann := alice.Announcement("repo", []string{"https://x/y.git"}, []string{"wss://x"}, nil)
	issue := bob.Issue(repo, "bug")
	comment := bob.Comment(issue, issue, "me too")
	orphan := bob.Note("orphan")
	reply := bob.Note("reply", testkit.WithTags(nostr.Tag{"e", orphan.ID}))

	for _, p := range []struct {
		evt     *nostr.Event
		missing []string
	}{{issue, []string{repo}}, {comment, []string{issue.ID}}, {orphan, nil}} {
		_, ok, err := f.lot.Park(ctx, p.evt, "no-reference", p.missing, "wss://remote")
		if err != nil || !ok {
			t.Fatalf("park %d: %v %v", p.evt.Kind, ok, err)
		}
	}
	if _, ok, err := f.lot.Park(ctx, issue, "no-reference", []string{repo}, ""); err != nil || ok {
		t.Fatalf("second park of the same event: %v %v, want false", ok, err)
	}
	if n, _ := f.lot.Len(ctx); n != 3 {
		t.Fatalf("Len = %d, want 3", n)
	}

	tests := []struct {
		name   string
		stored *nostr.Event
		want   []string
	}{
		{"announcement wakes the issue waiting for its coordinate", ann, []string{issue.ID}},
		{"issue wakes its comment, and itself (it is stored now)", issue, sorted(issue.ID, comment.ID)},
		{"reply wakes the orphan it tags (forward reference)", reply, []string{orphan.ID}},
		{"unrelated event wakes nothing", bob.Note("unrelated"), nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := f.lot.Waiting(ctx, tt.stored)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(ids(got), tt.want) {
				t.Fatalf("Waiting = %v, want %v", ids(got), tt.want)
			}
		})
	}

	got, err := f.lot.Waiting(ctx, ann)
	if err != nil || len(got) != 1 {
		t.Fatalf("Waiting(ann) = %v, %v", got, err)
	}
	p := got[0]
	if p.Reason != "no-reference" || !slices.Equal(p.Missing, []string{repo}) || p.Relay != "wss://remote" || !p.ParkedAt.Equal(t0) {
		t.Fatalf("parked record = %+v", p)
	}
	if p.Event.ID != issue.ID || !p.Event.CheckID() {
		t.Fatalf("parked event does not round-trip: %v", p.Event)
	}
	f.lot.Unpark(ctx, p, "stored")
	if got, _ := f.lot.Waiting(ctx, ann); len(got) != 0 {
		t.Fatalf("unparked event still waiting: %v", ids(got))
	}
	if n, _ := f.lot.Len(ctx); n != 2 {
		t.Fatalf("Len after unpark = %d, want 2", n)
	}
	if v := counter(t, f.reg, "grasp_parking_unparked_total"); v != 1 {
		t.Fatalf("unparked_total = %v", v)
	}
	if v := counter(t, f.reg, "grasp_parking_parked_total"); v != 3 {
		t.Fatalf("parked_total = %v", v)
	}
}

func TestSharedAcrossReplicas(t *testing.T) {
	ctx := context.Background()
	n := natstest.Start(t)
	clk := clock.NewFake(t0)
	a, b := open(t, n, parking.Config{}, clk), open(t, n, parking.Config{}, clk)
	bob := testkit.NewKey()
	root := bob.Note("root")
	c := bob.Note("child", testkit.WithTags(nostr.Tag{"e", root.ID}))
	if _, _, err := a.lot.Park(ctx, c, "no-reference", []string{root.ID}, ""); err != nil {
		t.Fatal(err)
	}
	got, err := b.lot.Waiting(ctx, root)
	if err != nil || !slices.Equal(ids(got), []string{c.ID}) {
		t.Fatalf("replica b sees %v, %v; want the event replica a parked", ids(got), err)
	}
	b.lot.Unpark(ctx, got[0], "stored")
	if got, _ := a.lot.Waiting(ctx, root); len(got) != 0 {
		t.Fatalf("replica a still sees %v after b unparked it", ids(got))
	}
}

func TestEvictsOldestFirst(t *testing.T) {
	ctx := context.Background()
	f := open(t, natstest.Start(t), parking.Config{MaxEvents: 3}, clock.NewFake(t0))
	bob := testkit.NewKey()
	root := bob.Note("root")
	var parked []*nostr.Event
	for i := 0; i < 5; i++ {
		evt := bob.Note(strings.Repeat("x", i+1), testkit.WithTags(nostr.Tag{"e", root.ID}))
		if _, _, err := f.lot.Park(ctx, evt, "no-reference", []string{root.ID}, ""); err != nil {
			t.Fatal(err)
		}
		parked = append(parked, evt)
	}
	if n, _ := f.lot.Len(ctx); n != 3 {
		t.Fatalf("Len = %d, want 3", n)
	}
	got, err := f.lot.Waiting(ctx, root)
	if err != nil {
		t.Fatal(err)
	}
	if want := sorted(parked[2].ID, parked[3].ID, parked[4].ID); !slices.Equal(ids(got), want) {
		t.Fatalf("left %v, want the three newest", ids(got))
	}
	if v := counter(t, f.reg, "grasp_parking_evicted_total"); v != 2 {
		t.Fatalf("evicted_total = %v, want 2", v)
	}
	if v := gaugeValue(t, f.reg, "grasp_parking_events"); v != 3 {
		t.Fatalf("gauge = %v", v)
	}
}

// gaugeValue reads a gauge from the registry.
func gaugeValue(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			return mf.GetMetric()[0].GetGauge().GetValue()
		}
	}
	t.Fatalf("no gauge %s", name)
	return 0
}

func TestExpiresByAge(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	clk := clock.NewFake(t0)
	f := open(t, natstest.Start(t), parking.Config{MaxAge: time.Hour, SweepInterval: time.Minute}, clk)
	bob := testkit.NewKey()
	root := bob.Note("root")
	old := bob.Note("old", testkit.WithTags(nostr.Tag{"e", root.ID}))
	young := bob.Note("young", testkit.WithTags(nostr.Tag{"e", root.ID}))
	if _, _, err := f.lot.Park(ctx, old, "no-reference", []string{root.ID}, ""); err != nil {
		t.Fatal(err)
	}
	clk.Advance(30 * time.Minute)
	if _, _, err := f.lot.Park(ctx, young, "no-reference", []string{root.ID}, ""); err != nil {
		t.Fatal(err)
	}

	if n, err := f.lot.Sweep(ctx); err != nil || n != 0 {
		t.Fatalf("early sweep removed %d (%v)", n, err)
	}

	done := make(chan error, 1)
	go func() { done <- f.lot.Run(ctx) }()
	waitFor(t, func() bool { return clk.Waiters() > 0 })
	clk.Advance(31 * time.Minute) // old is 61 min parked, young 31
	waitFor(t, func() bool { return counter(t, f.reg, "grasp_parking_expired_total") == 1 })
	got, err := f.lot.Waiting(ctx, root)
	if err != nil || !slices.Equal(ids(got), []string{young.ID}) {
		t.Fatalf("after expiry: %v %v, want only the young event", ids(got), err)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run: %v", err)
	}
}

// waitFor polls cond: the condition is set by another goroutine (the
// sweeper) whose progress this test cannot observe otherwise.
func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met within 5s")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// BenchmarkWaiting is the cost the ingester's wake loop pays per stored
// event: one stream-info request per signal (here: the event's id and its
// repository coordinate), with 1,000 unrelated events parked.
func BenchmarkWaiting(b *testing.B) {
	ctx := context.Background()
	n := natstest.Start(b)
	bb, err := bus.Connect(ctx, n.URL, "bench", bus.Names{Prefix: "t"}, bus.Security{})
	if err != nil {
		b.Fatal(err)
	}
	defer bb.Close()
	lot, err := parking.Open(ctx, bb, parking.Config{}, clock.NewFake(t0), nil, nil)
	if err != nil {
		b.Fatal(err)
	}
	k := testkit.NewKey()
	for i := 0; i < 1000; i++ {
		root := k.Note("root" + strings.Repeat("r", i%50))
		if _, _, err := lot.Park(ctx, k.Note("x"+strings.Repeat("y", i), testkit.WithTags(nostr.Tag{"e", root.ID})), "no-reference", []string{root.ID}, ""); err != nil {
			b.Fatal(err)
		}
	}
	stored := k.Issue(testkit.RepoRef(k.PubKey, "repo"), "bug")
	b.ResetTimer()
	for b.Loop() {
		if got, err := lot.Waiting(ctx, stored); err != nil || len(got) != 0 {
			b.Fatalf("%v %v", got, err)
		}
	}
}

// TestScanInSlices walks the lot a slice at a time in parking order, skips
// what left the lot, sees what was parked meanwhile, and ends with next 0.
func TestScanInSlices(t *testing.T) {
	ctx := context.Background()
	f := open(t, natstest.Start(t), parking.Config{}, clock.NewFake(t0))
	bob := testkit.NewKey()
	root := bob.Note("root")
	var evts []*nostr.Event
	var handles []parking.Parked
	for i := 0; i < 5; i++ {
		evt := bob.Note(strings.Repeat("s", i+1), testkit.WithTags(nostr.Tag{"e", root.ID}))
		p, _, err := f.lot.Park(ctx, evt, "no-reference", []string{root.ID}, "")
		if err != nil {
			t.Fatal(err)
		}
		evts, handles = append(evts, evt), append(handles, p)
	}
	f.lot.Unpark(ctx, handles[1], "stored")

	var seen []string
	first, next, err := f.lot.Scan(ctx, 0, 2)
	if err != nil {
		t.Fatal(err)
	}
	if len(first) != 2 || next == 0 {
		t.Fatalf("first slice: %d events, next %d; want 2 and more to come", len(first), next)
	}
	for _, p := range first {
		seen = append(seen, p.Event.ID)
	}
	// Parked after the scan began: seen before it ends.
	late := bob.Note("late", testkit.WithTags(nostr.Tag{"e", root.ID}))
	if _, _, err := f.lot.Park(ctx, late, "no-reference", []string{root.ID}, ""); err != nil {
		t.Fatal(err)
	}
	for next != 0 {
		var got []parking.Parked
		if got, next, err = f.lot.Scan(ctx, next, 2); err != nil {
			t.Fatal(err)
		}
		for _, p := range got {
			seen = append(seen, p.Event.ID)
		}
	}
	want := []string{evts[0].ID, evts[2].ID, evts[3].ID, evts[4].ID, late.ID}
	if !slices.Equal(seen, want) {
		t.Fatalf("scanned %v\nwant    %v (parking order, the unparked one skipped)", seen, want)
	}
	// A scanned handle unparks like any other.
	again, _, err := f.lot.Scan(ctx, 0, 1)
	if err != nil {
		t.Fatal(err)
	}
	f.lot.Unpark(ctx, again[0], "stored")
	if n, _ := f.lot.Len(ctx); n != 4 {
		t.Fatalf("Len = %d after unparking a scanned event, want 4", n)
	}
}
