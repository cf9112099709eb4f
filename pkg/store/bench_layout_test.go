package store_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/nbd-wtf/go-nostr"

	"github.com/grasp-sync/grasp-sync/pkg/store"
)

// BenchmarkTagLayout compares the kv store's tag keys of format v2 (one per
// letter as given) and v3 (both cases of a letter in one key;
// docs/decisions/0051-kv-format-v3.md) in one process, alternating: keys
// written per event, CPU per event stored (SaveBatch of 256, the
// ingester's batch; the process's CPU, so pebble's flushes count), and CPU
// per query for the tag shapes the relay, the policy and the local set
// send. GRASP_STORE_BENCH_N events per store (default 50,000); run with
// -benchtime 1x.
func BenchmarkTagLayout(b *testing.B) {
	n := 50_000
	if v := os.Getenv("GRASP_STORE_BENCH_N"); v != "" {
		n, _ = strconv.Atoi(v)
	}
	layouts := []struct {
		name string
		opts []store.Option
	}{{"v2", []store.Option{store.WithKVTagsV2()}}, {"v3", nil}}
	for round := range 2 {
		for _, l := range layouts {
			b.Run(fmt.Sprintf("%s/round%d", l.name, round), func(b *testing.B) {
				s, err := store.Open("kv+pebble://"+b.TempDir(), l.opts...)
				if err != nil {
					b.Fatal(err)
				}
				defer s.Close()
				ctx := context.Background()
				c := newCorpus(max(10, n/500))
				evts := make([]*nostr.Event, n)
				for i := range evts {
					evts[i] = c.next()
				}
				cpu0, start := processCPU(b), time.Now()
				for from := 0; from < n; from += 256 {
					for _, r := range s.SaveBatch(ctx, evts[from:min(from+256, n)]) {
						if r.Err != nil {
							b.Fatal(r.Err)
						}
					}
				}
				cpu, wall := processCPU(b)-cpu0, time.Since(start)
				keys, err := store.KVKeys(s)
				if err != nil {
					b.Fatal(err)
				}
				b.ReportMetric(float64(keys)/float64(n), "keys/event")
				b.ReportMetric(float64(cpu.Microseconds())/float64(n), "cpu-µs/event")
				fmt.Printf("layout %s round %d: %d events, %.2f keys/event, %.1f cpu-µs/event, %.1f wall-µs/event\n",
					l.name, round, n, float64(keys)/float64(n), float64(cpu.Microseconds())/float64(n), float64(wall.Microseconds())/float64(n))
				stored := make([]string, n)
				for i, e := range evts {
					stored[i] = e.ID
				}
				rng := rand.New(rand.NewPCG(3, 4))
				root := func() string { return c.roots[rng.IntN(len(c.roots))] }
				shapes := append(queryKinds(c, stored),
					queryKind{"#E_root", func() nostr.Filter { return nostr.Filter{Tags: nostr.TagMap{"E": {root()}}, Limit: 500} }},
					queryKind{"#A_repo", func() nostr.Filter {
						return nostr.Filter{Tags: nostr.TagMap{"A": {c.coord(rng.IntN(c.repos))}}, Limit: 100}
					}},
					queryKind{"layer3_100_roots", func() nostr.Filter {
						vs := make([]string, 100)
						for i := range vs {
							vs[i] = root()
						}
						return nostr.Filter{Tags: nostr.TagMap{"e": vs}}
					}},
					queryKind{"deleted_by_id", func() nostr.Filter {
						return nostr.Filter{Kinds: []int{5}, Authors: []string{c.owners[0]}, Tags: nostr.TagMap{"e": {stored[rng.IntN(n)]}}, Limit: 1}
					}},
				)
				for _, q := range shapes {
					ops, cpu0 := 0, processCPU(b)
					for ops < 2000 {
						if _, err := s.Query(ctx, q.filter()); err != nil {
							b.Fatal(err)
						}
						ops++
					}
					per := float64((processCPU(b) - cpu0).Microseconds()) / float64(ops)
					fmt.Printf("layout %s round %d: query %s %.1f cpu-µs/op\n", l.name, round, q.name, per)
				}
			})
		}
	}
}
