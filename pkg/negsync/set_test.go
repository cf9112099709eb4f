package negsync_test

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"iter"
	"maps"
	"math/big"
	mrand "math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/nbd-wtf/go-nostr"
	"github.com/nbd-wtf/go-nostr/nip77/negentropy"
	"github.com/nbd-wtf/go-nostr/nip77/negentropy/storage/vector"

	"github.com/grasp-sync/grasp-sync/pkg/negsync"
)

func randomItems(r *mrand.Rand, n int) []negsync.Item {
	out := make([]negsync.Item, n)
	for i := range out {
		var id [32]byte
		_, _ = rand.Read(id[:])
		// Few timestamps, so that many items tie on created_at.
		out[i] = negsync.Item{ID: hex.EncodeToString(id[:]), CreatedAt: nostr.Timestamp(1000 + r.IntN(n/4+1))}
	}
	return out
}

func vectorOf(items []negsync.Item) *vector.Vector {
	v := vector.New()
	for _, it := range items {
		v.Insert(it.CreatedAt, it.ID)
	}
	v.Seal()
	return v
}

func collect(seq iter.Seq2[int, negentropy.Item]) (out []string) {
	for i, it := range seq {
		out = append(out, fmt.Sprint(i, it))
	}
	return out
}

// A Set answers every negentropy.Storage question as go-nostr's own vector
// does for the same items: sizes, ranges, bounds, lower bounds, and the
// fingerprint of every range (the vector sums the ids one by one; the set
// subtracts running sums).
func TestSetAnswersAsGoNostrsVector(t *testing.T) {
	r := mrand.New(mrand.NewPCG(1, 2))
	for _, n := range []int{0, 1, 2, 31, 32, 33, 200} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			items := randomItems(r, n)
			set, vec := negsync.NewSet(items), vectorOf(items)
			if set.Size() != vec.Size() {
				t.Fatalf("Size = %d, vector %d", set.Size(), vec.Size())
			}
			for b := 0; b <= n; b++ {
				for e := b; e <= n; e++ {
					if n > 40 && e-b > 3 && e != n && b != 0 && r.IntN(10) > 0 {
						continue // every range of the small sets, a sample of the large one
					}
					if got, want := set.Fingerprint(b, e), vec.Fingerprint(b, e); got != want {
						t.Fatalf("Fingerprint(%d, %d) = %s, vector %s", b, e, got, want)
					}
					if got, want := collect(set.Range(b, e)), collect(vec.Range(b, e)); !slices.Equal(got, want) {
						t.Fatalf("Range(%d, %d) = %v, vector %v", b, e, got, want)
					}
				}
			}
			for idx := 0; idx <= n; idx++ {
				if got, want := set.GetBound(idx), vec.GetBound(idx); got != want {
					t.Fatalf("GetBound(%d) = %v, vector %v", idx, got, want)
				}
				for _, bound := range []negentropy.Bound{vec.GetBound(idx), {Item: negentropy.Item{Timestamp: vec.GetBound(idx).Timestamp}}, negentropy.InfiniteBound} {
					if got, want := set.FindLowerBound(0, n, bound), vec.FindLowerBound(0, n, bound); got != want {
						t.Fatalf("FindLowerBound(0, %d, %v) = %d, vector %d", n, bound, got, want)
					}
				}
			}
		})
	}
}

// The running sum wraps modulo 2^256, NIP-77's accumulator: ids of all ones
// overflow every word, and each range's fingerprint is the one computed from
// the ids' sum modulo 2^256 with math/big. (go-nostr v0.52.3's accumulator
// drops a carry when a word of the id is all ones and a carry comes in, so
// its vector differs here; strfry adds with every carry:
// docs/dependencies.md.)
func TestSetFingerprintWrapsAround(t *testing.T) {
	allOnes := strings.Repeat("ff", 32)
	items := []negsync.Item{{ID: allOnes, CreatedAt: 1}, {ID: allOnes[:62] + "fe", CreatedAt: 2},
		{ID: "ff" + strings.Repeat("00", 31), CreatedAt: 3}, {ID: "ff00" + allOnes[4:], CreatedAt: 4}}
	set := negsync.NewSet(items)
	mod := new(big.Int).Lsh(big.NewInt(1), 256)
	overflowed := false
	for b := 0; b <= len(items); b++ {
		for e := b; e <= len(items); e++ {
			sum := new(big.Int)
			for _, it := range items[b:e] {
				le, _ := hex.DecodeString(it.ID)
				slices.Reverse(le)
				sum.Add(sum, new(big.Int).SetBytes(le))
			}
			overflowed = overflowed || sum.Cmp(mod) >= 0
			sum.Mod(sum, mod)
			buf := make([]byte, 32)
			sum.FillBytes(buf)
			slices.Reverse(buf) // back to little-endian
			h := sha256.Sum256(append(buf, negentropy.EncodeVarInt(e-b)...))
			if got, want := set.Fingerprint(b, e), hex.EncodeToString(h[:16]); got != want {
				t.Errorf("Fingerprint(%d, %d) = %s, want %s", b, e, got, want)
			}
		}
	}
	if !overflowed {
		t.Fatal("no range's sum overflows 256 bits: the test checks nothing")
	}
}

// Ids that are not 64 hex digits are left out and a repeated item counts
// once; the caller's slice is not reordered.
func TestNewSetDropsBadIDsAndRepeats(t *testing.T) {
	r := mrand.New(mrand.NewPCG(3, 4))
	good := randomItems(r, 5)
	in := append(slices.Clone(good), good[2], negsync.Item{ID: "abc", CreatedAt: 1}, negsync.Item{ID: good[0].ID[:63] + "z", CreatedAt: 1})
	before := slices.Clone(in)
	set := negsync.NewSet(in)
	if set.Len() != 5 {
		t.Fatalf("Len = %d, want the 5 distinct good items", set.Len())
	}
	if !slices.Equal(in, before) {
		t.Fatal("NewSet reordered its argument")
	}
	if (*negsync.Set)(nil).Len() != 0 {
		t.Fatal("a nil set's Len is not 0")
	}
}

// Two engines reconcile in memory, go-nostr's vector on the relay's side
// and a Set on ours, the Set shared by several reconciliations at once (the
// race detector watches): each finds exactly the ids only the relay holds.
func TestSetReconcilesWithGoNostrsEngine(t *testing.T) {
	r := mrand.New(mrand.NewPCG(5, 6))
	common, ours, theirs := randomItems(r, 3000), randomItems(r, 200), randomItems(r, 150)
	set := negsync.NewSet(append(slices.Clone(common), ours...))
	want := map[string]bool{}
	for _, it := range theirs {
		want[it.ID] = true
	}
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for range 4 {
		wg.Go(func() {
			server := negentropy.New(vectorOf(append(slices.Clone(common), theirs...)), 4096)
			client := negentropy.New(set, 4096)
			got := map[string]bool{}
			done := make(chan struct{})
			go func() {
				defer close(done)
				for id := range client.HaveNots {
					got[id] = true
				}
			}()
			go func() {
				for range client.Haves {
				}
			}()
			msg := client.Start()
			for round := 0; msg != ""; round++ {
				if round > 50 {
					errs <- fmt.Errorf("no agreement after 50 rounds")
					return
				}
				answer, err := server.Reconcile(msg)
				if err != nil {
					errs <- err
					return
				}
				if msg, err = client.Reconcile(answer); err != nil {
					errs <- err
					return
				}
			}
			<-done
			if !maps.Equal(got, want) {
				errs <- fmt.Errorf("found %d ids the relay alone holds, want %d", len(got), len(want))
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

// BenchmarkReconcileBuild is what one reconciliation of layer 1 cost per
// relay before the set was shared (a vector filled, sealed and
// fingerprinted for the first message) against what it costs with a shared
// Set (the first message alone).
func BenchmarkReconcileBuild(b *testing.B) {
	r := mrand.New(mrand.NewPCG(7, 8))
	items := randomItems(r, 20_000)
	b.Run("vector", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			seen := make(map[string]struct{}, len(items))
			v := vector.New()
			for _, it := range items {
				if _, dup := seen[it.ID]; dup {
					continue
				}
				seen[it.ID] = struct{}{}
				v.Insert(it.CreatedAt, it.ID)
			}
			v.Seal()
			_ = negentropy.New(v, 60_000).Start()
		}
	})
	b.Run("shared-set", func(b *testing.B) {
		set := negsync.NewSet(items)
		b.ReportAllocs()
		for b.Loop() {
			_ = negentropy.New(set, 60_000).Start()
		}
	})
	b.Run("set-built", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			_ = negentropy.New(negsync.NewSet(items), 60_000).Start()
		}
	})
}
