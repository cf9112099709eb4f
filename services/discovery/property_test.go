package discovery

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sort"
	"testing"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/nbd-wtf/go-nostr"
	"google.golang.org/protobuf/proto"

	graspv1 "github.com/grasp-sync/grasp-sync/proto/grasp/v1"

	"github.com/grasp-sync/grasp-sync/pkg/bus"
	"github.com/grasp-sync/grasp-sync/pkg/clock"
	"github.com/grasp-sync/grasp-sync/pkg/nip34"
	"github.com/grasp-sync/grasp-sync/pkg/testkit"
	"github.com/grasp-sync/grasp-sync/pkg/testkit/natstest"
)

// universe is a small world of keys, repositories and relays that random
// event sequences are drawn from, small enough that events collide (same
// repository, same timestamps, deletions hitting real targets).
type universe struct {
	owners []testkit.Key
	other  testkit.Key
	ids    []string
	relays []string
}

func newUniverse() universe {
	return universe{
		owners: []testkit.Key{testkit.NewKey(), testkit.NewKey(), testkit.NewKey()},
		other:  testkit.NewKey(),
		ids:    []string{"alpha", "beta"},
		relays: []string{"wss://a.example", "wss://b.example", "wss://c.example/", "WSS://D.example:443",
			"ws://10.0.0.1", "http://e.example", "wss://user:pw@f.example", service},
	}
}

// events draws n events: announcement versions (listing us or not, random
// relay sets, colliding timestamps), root events tagging one or two
// repositories, and deletions by authors and by others, of coordinates and
// of ids.
func (u universe) events(rng *rand.Rand, n int) []*nostr.Event {
	var out []*nostr.Event
	var anns, roots []*nostr.Event
	ts := func() nostr.Timestamp { return nostr.Timestamp(1000 + rng.IntN(40)) }
	pick := func() (testkit.Key, string) { return u.owners[rng.IntN(len(u.owners))], u.ids[rng.IntN(len(u.ids))] }
	for len(out) < n {
		var e *nostr.Event
		switch r := rng.IntN(10); {
		case r < 5: // announcement version
			k, d := pick()
			var relays []string
			for _, rl := range u.relays {
				if rng.IntN(3) == 0 {
					relays = append(relays, rl)
				}
			}
			clone := []string{"https://github.com/x/" + d + ".git"}
			switch rng.IntN(4) {
			case 0: // does not list us
			case 1: // lists us only in relays
				relays = append(relays, service)
			default:
				clone = append(clone, testkit.GraspCloneURL(service, k.PubKey, d))
				relays = append(relays, service)
			}
			if rng.IntN(4) == 0 {
				clone = append(clone, testkit.GraspCloneURL("wss://grasp.example", k.PubKey, d))
			}
			e = k.Announcement(d, clone, relays, nil, testkit.At(ts()), testkit.WithContent(fmt.Sprint(rng.Int())))
			anns = append(anns, e)
		case r < 8: // root event tagging one or two repositories
			k, d := pick()
			author := u.owners[rng.IntN(len(u.owners))]
			opts := []testkit.Option{testkit.At(ts()), testkit.WithContent(fmt.Sprint(rng.Int()))}
			if rng.IntN(3) == 0 {
				k2, d2 := pick()
				opts = append(opts, testkit.WithTags(nostr.Tag{"a", testkit.RepoRef(k2.PubKey, d2)}))
			}
			if rng.IntN(2) == 0 {
				e = author.Issue(testkit.RepoRef(k.PubKey, d), "issue", opts...)
			} else {
				e = author.Patch(testkit.RepoRef(k.PubKey, d), opts...)
			}
			roots = append(roots, e)
		default: // deletion
			var target *nostr.Event
			if rng.IntN(2) == 0 && len(anns) > 0 {
				target = anns[rng.IntN(len(anns))]
			} else if len(roots) > 0 {
				target = roots[rng.IntN(len(roots))]
			} else {
				continue
			}
			author := u.owners[0]
			for _, k := range u.owners {
				if k.PubKey == target.PubKey {
					author = k
				}
			}
			if rng.IntN(4) == 0 {
				author = u.other // not the author: must be ignored
			}
			if target.Kind == nip34.KindRepoAnnouncement && rng.IntN(2) == 0 {
				// by id rather than by coordinate
				e = author.Sign(&nostr.Event{Kind: nip34.KindDeletion, CreatedAt: ts(), Tags: nostr.Tags{{"e", target.ID}}})
			} else {
				e = author.Deletion([]*nostr.Event{target}, testkit.At(ts()))
			}
		}
		out = append(out, e)
	}
	return out
}

// pool draws one large signed event pool (signing is the slow part under
// -race); each sequence of a property test is a random subset of it, so
// deletions may name events the sequence never delivers, as happens live.
func (u universe) pool() []*nostr.Event {
	return u.events(rand.New(rand.NewPCG(1, 2)), 400)
}

// sample picks n distinct events of the pool in random order.
func sample(rng *rand.Rand, pool []*nostr.Event, n int) []*nostr.Event {
	idx := rng.Perm(len(pool))[:n]
	out := make([]*nostr.Event, n)
	for i, j := range idx {
		out[i] = pool[j]
	}
	return out
}

// kvContents reads every repository entry of the bucket, updated_at
// cleared.
func kvContents(t *testing.T, kv jetstream.KeyValue) map[string]string {
	t.Helper()
	w, err := kv.WatchAll(context.Background(), jetstream.IgnoreDeletes())
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = w.Stop() }()
	out := map[string]string{}
	for e := range w.Updates() {
		if e == nil {
			break
		}
		if e.Key() == bus.BootstrapRelaysKey {
			continue
		}
		var v graspv1.RepoSyncNeeds
		if err := proto.Unmarshal(e.Value(), &v); err != nil {
			t.Fatalf("key %s: %v", e.Key(), err)
		}
		if v.UpdatedAt == 0 {
			t.Errorf("key %s: updated_at not set", e.Key())
		}
		c, _ := content(&v)
		out[e.Key()] = string(c[:])
	}
	return out
}

// recompute builds the index from scratch, events in created_at order, and
// renders what the bucket must hold.
func recompute(events []*nostr.Event) map[string]string {
	sorted := slices.Clone(events)
	sort.SliceStable(sorted, func(i, j int) bool { return sorted[i].CreatedAt < sorted[j].CreatedAt })
	x := newIndex()
	for _, e := range sorted {
		x.Apply(e)
	}
	out := map[string]string{}
	for _, ref := range x.Hosted() {
		c, _ := content(x.Entry(ref))
		out[ref.Key()] = string(c[:])
	}
	return out
}

// TestIndexEqualsRecomputation is the property test of the issue: after any
// random sequence of announcement updates (versions out of order and
// repeated, relay changes, removals by no longer listing us, deletions,
// roots before their announcements), delivered in random batches with
// restarts in between (a new index reconciling the bucket it finds), the
// bucket equals a from-scratch recomputation.
func TestIndexEqualsRecomputation(t *testing.T) {
	n := natstest.Start(t)
	js, err := jetstream.New(n.Connect(t))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	u := newUniverse()
	pool := u.pool()
	seeds := 150
	if testing.Short() {
		seeds = 30
	}
	for seed := range seeds {
		rng := rand.New(rand.NewPCG(uint64(seed), 42))
		events := sample(rng, pool, 10+rng.IntN(60))
		kv, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: fmt.Sprint("prop_", seed), Storage: jetstream.MemoryStorage})
		if err != nil {
			t.Fatal(err)
		}
		// Delivery: random order, some events twice.
		delivery := slices.Clone(events)
		for range rng.IntN(5) {
			delivery = append(delivery, events[rng.IntN(len(events))])
		}
		rng.Shuffle(len(delivery), func(i, j int) { delivery[i], delivery[j] = delivery[j], delivery[i] })

		// Entries left by an earlier deployment, for repositories none of
		// these events mention, plus a key that is no repository at all:
		// the first term must remove them when it reconciles.
		for i := range rng.IntN(3) {
			ref := nip34.RepoRef{PubKey: u.other.PubKey, Identifier: fmt.Sprint("old", i)}
			data, _ := proto.Marshal(&graspv1.RepoSyncNeeds{RepoRef: ref.String(), Relays: []string{"wss://old.example"}})
			if _, err := kv.Put(ctx, ref.Key(), data); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := kv.Put(ctx, "junk", []byte("x")); err != nil {
			t.Fatal(err)
		}

		var (
			x       *RepoSyncIndex
			w       *IndexWriter
			pending map[nip34.RepoRef]struct{}
			loaded  bool
		)
		fresh := func() {
			x, w, pending, loaded = newIndex(), NewIndexWriter(kv, clock.Real{}), map[nip34.RepoRef]struct{}{}, false
		}
		// flush is the service's batch write; a term's first one reconciles
		// the bucket it finds (IndexWriter.Load).
		flush := func() {
			if !loaded {
				refs, err := w.Load(ctx)
				if err != nil {
					t.Fatal(err)
				}
				for _, ref := range refs {
					pending[ref] = struct{}{}
				}
				loaded = true
			}
			for ref := range pending {
				if _, err := w.Sync(ctx, ref, x.Entry(ref)); err != nil {
					t.Fatal(err)
				}
			}
			clear(pending)
		}
		fresh()
		var seen []*nostr.Event
		for i := 0; i < len(delivery); {
			end := min(len(delivery), i+1+rng.IntN(6))
			for _, e := range delivery[i:end] {
				for _, ref := range x.Apply(e) {
					pending[ref] = struct{}{}
				}
				seen = append(seen, e)
			}
			i = end
			if rng.IntN(5) != 0 {
				flush()
				continue
			}
			// Crash before this batch was written, then restart: a new term
			// re-reads everything delivered so far, in another order, and
			// reconciles the bucket it finds (which may hold entries of
			// repositories no longer hosted).
			fresh()
			replay := slices.Clone(seen)
			rng.Shuffle(len(replay), func(i, j int) { replay[i], replay[j] = replay[j], replay[i] })
			for _, e := range replay {
				for _, ref := range x.Apply(e) {
					pending[ref] = struct{}{}
				}
			}
			flush()
		}
		if _, err := kv.Get(ctx, "junk"); err == nil {
			t.Fatalf("seed %d: stray key survived reconciliation", seed)
		}
		got, want := kvContents(t, kv), recompute(events)
		if len(got) != len(want) {
			t.Fatalf("seed %d: bucket has %d entries, recomputation %d", seed, len(got), len(want))
		}
		for k, v := range want {
			if got[k] != v {
				ref, _ := nip34.ParseKey(k)
				t.Fatalf("seed %d: entry %s differs from the recomputation", seed, ref)
			}
		}
		if err := js.DeleteKeyValue(ctx, kv.Bucket()); err != nil {
			t.Fatal(err)
		}
	}
}

// TestIndexOrderIndependent checks the property the bucket test relies on,
// without NATS and with many more sequences: any two orders of the same
// events give the same index.
func TestIndexOrderIndependent(t *testing.T) {
	pool := newUniverse().pool()
	seeds := 1000
	if testing.Short() {
		seeds = 100
	}
	for seed := range seeds {
		rng := rand.New(rand.NewPCG(uint64(seed), 7))
		events := sample(rng, pool, 5+rng.IntN(150))
		want := recompute(events)
		shuffled := slices.Clone(events)
		rng.Shuffle(len(shuffled), func(i, j int) { shuffled[i], shuffled[j] = shuffled[j], shuffled[i] })
		x := newIndex()
		for _, e := range shuffled {
			x.Apply(e)
		}
		got := map[string]string{}
		for _, ref := range x.Hosted() {
			c, _ := content(x.Entry(ref))
			got[ref.Key()] = string(c[:])
		}
		if len(got) != len(want) {
			t.Fatalf("seed %d: %d entries in one order, %d in another", seed, len(got), len(want))
		}
		for k, v := range want {
			if got[k] != v {
				t.Fatalf("seed %d: entry %s depends on the order", seed, k)
			}
		}
	}
}
