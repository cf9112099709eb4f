package store_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/nbd-wtf/go-nostr"

	"github.com/grasp-sync/grasp-sync/pkg/filters"
	"github.com/grasp-sync/grasp-sync/pkg/store"
)

const itemsBenchEvents = 50_000

// itemsBenchStore is the store BenchmarkItems reads: the e2e world's shape
// and size (1,000 repositories, 50,000 events: issues and patches with a
// tags, comments with E/e and A, statuses with e and a), on kv+pebble,
// written as the ingester writes (SaveBatch of 256).
func itemsBenchStore(b *testing.B) (*store.Store, *corpus, []string) {
	b.Helper()
	s, err := store.Open("kv+pebble://" + b.TempDir())
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(s.Close)
	c := newCorpus(1000)
	var stored []string
	var batch []*nostr.Event
	flush := func() {
		for _, r := range s.SaveBatch(context.Background(), batch) {
			if r.Err != nil {
				b.Fatal(r.Err)
			}
		}
		batch = batch[:0]
	}
	for range itemsBenchEvents {
		e := c.next()
		stored = append(stored, e.ID)
		if batch = append(batch, e); len(batch) == 256 {
			flush()
		}
	}
	flush()
	settle(b)
	return s, c, stored
}

// settle waits (up to a minute) until the process is idle: pebble's
// flushes and compactions after the fill would otherwise be counted as CPU
// of whichever benchmark runs first.
func settle(b *testing.B) {
	for range 240 {
		cpu0 := processCPU(b)
		time.Sleep(250 * time.Millisecond)
		if processCPU(b)-cpu0 < 10*time.Millisecond {
			return
		}
	}
}

// BenchmarkItems measures the fetcher's local-set reads on the kv store:
// Items for its item filters (pkg/filters: #a of 100 repositories, #E of
// 100 roots, the same since half-way) and which of 500 ids are held
// (dropHeld: half stored, half not), each the old way (the paged scan
// decoding every event; Items by id) and the new (the kv item lister;
// Held), one after the other on one store. cpu-µs/item is the process's
// CPU per item listed.
//
//	go test -run '^$' -bench BenchmarkItems -count 5 ./store/
func BenchmarkItems(b *testing.B) {
	s, c, stored := itemsBenchStore(b)
	var coords, roots []string
	for r := range 100 {
		coords = append(coords, c.coord(r))
	}
	roots = c.roots[:100]
	mid := nostr.Timestamp(c.ts - (c.ts-1_650_000_000)/2)
	a := filters.Layer2(coords)[0]
	E := filters.Layer3(roots)[1]
	var ask []string
	for n := range 250 {
		ask = append(ask, stored[n*150], fmt.Sprintf("%064x", n))
	}
	ctx := context.Background()
	items := map[string]func(nostr.Filter) ([]store.Item, error){
		"scan":   func(f nostr.Filter) ([]store.Item, error) { return store.ItemsByScan(ctx, s, f) },
		"lister": func(f nostr.Filter) ([]store.Item, error) { return s.Items(ctx, f) },
	}
	for _, q := range []struct {
		name string
		f    nostr.Filter
	}{
		{"a_100_repos", a},
		{"E_100_roots", E},
		{"a_100_repos_since", filters.Since([]nostr.Filter{a}, mid)[0]},
	} {
		for _, way := range []string{"scan", "lister"} {
			b.Run(q.name+"/"+way, func(b *testing.B) {
				n := 0
				cpu0 := processCPU(b)
				for b.Loop() {
					got, err := items[way](q.f)
					if err != nil {
						b.Fatal(err)
					}
					n += len(got)
				}
				b.ReportMetric(float64(n)/float64(b.N), "items/op")
				b.ReportMetric(float64(processCPU(b)-cpu0)/1e3/float64(max(n, 1)), "cpu-µs/item")
			})
		}
	}
	held := map[string]func() (int, error){
		"items_by_id": func() (int, error) {
			got, err := store.ItemsByScan(ctx, s, nostr.Filter{IDs: ask})
			return len(got), err
		},
		"held": func() (int, error) {
			got, err := s.Held(ctx, ask)
			return len(got), err
		},
	}
	for _, way := range []string{"items_by_id", "held"} {
		b.Run("500_ids/"+way, func(b *testing.B) {
			n := 0
			cpu0 := processCPU(b)
			for b.Loop() {
				got, err := held[way]()
				if err != nil {
					b.Fatal(err)
				}
				n += got
			}
			b.ReportMetric(float64(n)/float64(b.N), "held/op")
			b.ReportMetric(float64(processCPU(b)-cpu0)/1e3/float64(b.N*len(ask)), "cpu-µs/id")
		})
	}
}
