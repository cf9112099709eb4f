package fetcher

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nbd-wtf/go-nostr"

	"github.com/grasp-sync/grasp-sync/pkg/clock"
	"github.com/grasp-sync/grasp-sync/pkg/negsync"
	"github.com/grasp-sync/grasp-sync/pkg/store"
	"github.com/grasp-sync/grasp-sync/pkg/testkit"
)

// countedStore is a real embedded store whose local set counts its reads.
type countedStore struct {
	st    *store.Store
	reads atomic.Int32
	// gate, when set, holds each read until it is closed or ctx ends.
	gate chan struct{}
	// entered is sent to (if set) when a read starts.
	entered chan struct{}
}

func newCountedStore(t *testing.T) *countedStore {
	t.Helper()
	st, err := store.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.Close)
	return &countedStore{st: st}
}

func (c *countedStore) save(t *testing.T, evts ...*nostr.Event) {
	t.Helper()
	for _, e := range evts {
		if _, err := c.st.Save(context.Background(), e); err != nil {
			t.Fatal(err)
		}
	}
}

func (c *countedStore) Items(ctx context.Context, f nostr.Filter) ([]negsync.Item, error) {
	c.reads.Add(1)
	if c.entered != nil {
		c.entered <- struct{}{}
	}
	if c.gate != nil {
		select {
		case <-c.gate:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	return StoreLocalSet{Store: c.st}.Items(ctx, f)
}

func (c *countedStore) Held(ctx context.Context, ids []string) ([]string, error) {
	return StoreLocalSet{Store: c.st}.Held(ctx, ids)
}

func itemIDs(items []negsync.Item) []string {
	out := make([]string, len(items))
	for i, it := range items {
		out[i] = it.ID
	}
	slices.Sort(out)
	return out
}

func eventIDs(evts ...*nostr.Event) []string {
	out := make([]string, len(evts))
	for i, e := range evts {
		out[i] = e.ID
	}
	slices.Sort(out)
	return out
}

// A filter's items are read from the store once per TTL and handed to
// every caller meanwhile; what is stored meanwhile is held at once (Held
// asks the store) and listed once the TTL has passed.
func TestSharedLocalSetReadsOncePerTTL(t *testing.T) {
	ctx := context.Background()
	key := testkit.NewKey()
	base := newCountedStore(t)
	first := []*nostr.Event{key.Announcement("a", nil, nil, nil), key.Announcement("b", nil, nil, nil)}
	base.save(t, first...)
	clk := clock.NewFake(time.Unix(1_700_000_000, 0))
	reads := map[string]int{}
	s := newSharedLocalSet(base, 3*time.Second, 100, clk.Now, func(src string) { reads[src]++ })
	announcements := nostr.Filter{Kinds: []int{nostr.KindRepositoryAnnouncement}}

	for range 3 {
		items, err := s.Items(ctx, announcements)
		if err != nil {
			t.Fatal(err)
		}
		if got, want := itemIDs(items), eventIDs(first...); !slices.Equal(got, want) {
			t.Fatalf("items %v, want %v", got, want)
		}
	}
	if n := base.reads.Load(); n != 1 {
		t.Fatalf("store read %d times for three asks within the TTL, want 1", n)
	}
	if reads["store"] != 1 || reads["shared"] != 2 {
		t.Fatalf("reads counted %v, want store 1, shared 2", reads)
	}
	// The reconciliations get the set built once, not one each
	// (docs/decisions/0080-local-set-built-once.md).
	set1, err := s.Set(ctx, announcements)
	if err != nil {
		t.Fatal(err)
	}
	set2, _ := s.Set(ctx, announcements)
	if set1 != set2 || set1.Len() != len(first) {
		t.Fatalf("two asks within the TTL got sets %p and %p (%d items), want one set of %d", set1, set2, set1.Len(), len(first))
	}

	// Another filter is its own list.
	if _, err := s.Items(ctx, nostr.Filter{Kinds: []int{nostr.KindRepositoryState}}); err != nil {
		t.Fatal(err)
	}
	if n := base.reads.Load(); n != 2 {
		t.Fatalf("store read %d times after a second filter, want 2", n)
	}

	later := key.Announcement("c", nil, nil, nil)
	base.save(t, later)
	held, err := s.Held(ctx, []string{later.ID})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(held, []string{later.ID}) {
		t.Fatalf("held %v right after it was stored, want it", held)
	}
	clk.Advance(2 * time.Second)
	items, _ := s.Items(ctx, announcements)
	if slices.Contains(itemIDs(items), later.ID) {
		t.Fatal("a list handed out within the TTL was read again")
	}
	clk.Advance(time.Second)
	items, _ = s.Items(ctx, announcements)
	if got, want := itemIDs(items), eventIDs(append(first, later)...); !slices.Equal(got, want) {
		t.Fatalf("items after the TTL %v, want %v", got, want)
	}
	if n := base.reads.Load(); n != 3 {
		t.Fatalf("store read %d times, want 3", n)
	}
}

// gatedSharedSet is a shared set over a store holding one announcement,
// whose reads wait at base.gate and say so on base.entered; f matches it.
func gatedSharedSet(t *testing.T) (base *countedStore, s *sharedLocalSet, f nostr.Filter) {
	t.Helper()
	base = newCountedStore(t)
	base.save(t, testkit.NewKey().Announcement("a", nil, nil, nil))
	base.gate, base.entered = make(chan struct{}), make(chan struct{}, 64)
	s = newSharedLocalSet(base, 3*time.Second, 100, clock.NewFake(time.Unix(1_700_000_000, 0)).Now, nil)
	return base, s, nostr.Filter{Kinds: []int{nostr.KindRepositoryAnnouncement}}
}

// Callers asking for the same filter while it is being read share that one
// read.
func TestSharedLocalSetConcurrentCallersShareARead(t *testing.T) {
	base, s, f := gatedSharedSet(t)

	const callers = 20
	var wg sync.WaitGroup
	errs := make(chan error, callers)
	for range callers {
		wg.Go(func() {
			items, err := s.Items(context.Background(), f)
			if err == nil && len(items) != 1 {
				err = fmt.Errorf("%d items, want 1", len(items))
			}
			errs <- err
		})
	}
	<-base.entered // the one read has started and waits at the gate
	close(base.gate)
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	// Callers that came after the read ended found its list kept.
	if n := base.reads.Load(); n != 1 {
		t.Fatalf("store read %d times for %d callers at once, want 1", n, callers)
	}
}

// A read that ends with its caller's context does not fail the callers
// that shared it: they read again under their own.
func TestSharedLocalSetLeaderCancelled(t *testing.T) {
	base, s, f := gatedSharedSet(t)

	leaderCtx, cancel := context.WithCancel(context.Background())
	leaderErr := make(chan error, 1)
	go func() {
		_, err := s.Items(leaderCtx, f)
		leaderErr <- err
	}()
	<-base.entered
	follower := make(chan error, 1)
	go func() {
		items, err := s.Items(context.Background(), f)
		if err == nil && len(items) != 1 {
			err = fmt.Errorf("%d items, want 1", len(items))
		}
		follower <- err
	}()
	cancel()
	if err := <-leaderErr; err == nil {
		t.Fatal("the cancelled caller got no error")
	}
	<-base.entered // the follower's own read
	close(base.gate)
	if err := <-follower; err != nil {
		t.Fatalf("the other caller: %v", err)
	}
}

// The lists kept stay within the item bound: a list larger than the bound
// is not kept, and keeping one drops the soonest to expire first.
func TestSharedLocalSetBounded(t *testing.T) {
	ctx := context.Background()
	key := testkit.NewKey()
	base := newCountedStore(t)
	var evts []*nostr.Event
	for i := range 5 {
		evts = append(evts, key.Announcement(fmt.Sprintf("r%d", i), nil, nil, nil))
	}
	base.save(t, evts...)
	clk := clock.NewFake(time.Unix(1_700_000_000, 0))
	s := newSharedLocalSet(base, 3*time.Second, 4, clk.Now, nil)
	all := nostr.Filter{Kinds: []int{nostr.KindRepositoryAnnouncement}}
	for range 2 {
		if _, err := s.Items(ctx, all); err != nil {
			t.Fatal(err)
		}
	}
	if n := base.reads.Load(); n != 2 {
		t.Fatalf("a list of 5 with a bound of 4: store read %d times for 2 asks, want 2", n)
	}
	one := func(i int) nostr.Filter { return nostr.Filter{IDs: []string{evts[i].ID}} }
	for i := range 4 { // four lists of one fill the bound
		if _, err := s.Items(ctx, one(i)); err != nil {
			t.Fatal(err)
		}
		clk.Advance(100 * time.Millisecond)
	}
	if _, err := s.Items(ctx, one(4)); err != nil { // drops one(0), the soonest to expire
		t.Fatal(err)
	}
	if s.held > 4 {
		t.Fatalf("%d items kept, bound 4", s.held)
	}
	before := base.reads.Load()
	for _, i := range []int{1, 2, 3, 4} {
		if _, err := s.Items(ctx, one(i)); err != nil {
			t.Fatal(err)
		}
	}
	if n := base.reads.Load() - before; n != 0 {
		t.Fatalf("lists still kept were read %d times again", n)
	}
	if _, err := s.Items(ctx, one(0)); err != nil {
		t.Fatal(err)
	}
	if n := base.reads.Load() - before; n != 1 {
		t.Fatal("the dropped list was not read again")
	}
}

// An empty list is not kept: a batch with an empty local set reads the
// filter's history whole with REQ, so a stale empty list would fetch
// everything stored meanwhile again.
func TestSharedLocalSetKeepsNoEmptyList(t *testing.T) {
	ctx := context.Background()
	base := newCountedStore(t)
	clk := clock.NewFake(time.Unix(1_700_000_000, 0))
	s := newSharedLocalSet(base, 3*time.Second, 100, clk.Now, nil)
	f := nostr.Filter{Kinds: []int{nostr.KindRepositoryAnnouncement}}
	if items, err := s.Items(ctx, f); err != nil || len(items) != 0 {
		t.Fatalf("items %v, %v; want none", items, err)
	}
	stored := testkit.NewKey().Announcement("a", nil, nil, nil)
	base.save(t, stored)
	items, err := s.Items(ctx, f)
	if err != nil {
		t.Fatal(err)
	}
	if got := itemIDs(items); !slices.Equal(got, []string{stored.ID}) {
		t.Fatalf("items %v right after the first was stored, want it (an empty list was kept)", got)
	}
}
