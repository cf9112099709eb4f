package ingester

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"syscall"
	"testing"
	"time"

	"github.com/nbd-wtf/go-nostr"

	"github.com/grasp-sync/grasp-sync/pkg/clock"
	"github.com/grasp-sync/grasp-sync/pkg/store"
	"github.com/grasp-sync/grasp-sync/pkg/testkit"
)

// BenchmarkDecideLookups is the policy's part of the decide step (its
// store reads through the batch, EvaluateVerified) for batches of 256 new
// issues and comments on stored issues of 20 and of 200 served repositories, with
// no cross-batch cache, the announcement cache, and the announcement cache
// and the memory of stored events (refs: the issues counted as stored by
// this replica a moment ago, as they are in a sync), alternating in one
// process (10 passes over 5,120 events each): cpu-µs per event decided.
// Nothing is written, so every batch asks what the last one asked. Run with -benchtime 1x.
func BenchmarkDecideLookups(b *testing.B) {
	const service = "wss://git.example.com"
	for _, repos := range []int{20, 200} {
		func() {
			st, err := store.Open(b.TempDir())
			if err != nil {
				b.Fatal(err)
			}
			defer st.Close()
			ctx := context.Background()
			owner, author := testkit.NewKey(), testkit.NewKey()
			var stored, decided []*nostr.Event
			var issues []*nostr.Event
			for r := range repos {
				d := fmt.Sprintf("repo-%d", r)
				stored = append(stored, owner.Announcement(d, []string{testkit.GraspCloneURL(service, owner.PubKey, d)}, []string{service}, nil))
				for n := range 10 {
					issue := author.Issue(testkit.RepoRef(owner.PubKey, d), fmt.Sprintf("issue %d", n))
					issues = append(issues, issue)
					stored = append(stored, issue)
				}
			}
			for _, e := range stored {
				if _, err := st.Save(ctx, e); err != nil {
					b.Fatal(err)
				}
			}
			for n := range 5120 {
				if n%2 == 0 {
					decided = append(decided, author.Issue(testkit.RepoRef(owner.PubKey, fmt.Sprintf("repo-%d", n%repos)), fmt.Sprintf("new %d", n)))
				} else {
					root := issues[n%len(issues)]
					decided = append(decided, author.Comment(root, root, fmt.Sprintf("comment %d", n)))
				}
			}
			// A fake clock: no entry expires during the passes.
			i := New(Config{Consumer: "ingester"}, nil, st, service, slog.New(slog.NewTextHandler(io.Discard, nil)), nil).WithClock(clock.NewFake(time.Now()))
			for round := range 3 {
				for _, mode := range []string{"none", "anns", "anns+refs"} {
					b.Run(fmt.Sprintf("repos=%d/cache=%s/round%d", repos, mode, round), func(b *testing.B) {
						i.anns.reset(mode != "none")
						i.refs.reset(mode == "anns+refs")
						i.refs.put(issues, i.refs.generation(), i.clk.Now())
						cpu0 := cpuNow()
						const passes = 10
						for from := 0; from < passes*len(decided); from += 256 {
							bt := &batch{i: i, pending: newPendingSet(), deferred: newPendingSet(), cache: map[string]lookup{}}
							pol := *i.policy
							pol.Store = bt
							start := from % len(decided)
							for _, e := range decided[start:min(start+256, len(decided))] {
								if d := pol.EvaluateVerified(ctx, e); !d.Accept {
									b.Fatalf("%s refused: %s", e.ID, d.Message)
								}
							}
						}
						per := float64((cpuNow() - cpu0).Microseconds()) / float64(passes*len(decided))
						b.ReportMetric(per, "cpu-µs/event")
						fmt.Printf("decide lookups, %d repositories, caches %s, round %d: %.1f cpu-µs/event\n", repos, mode, round, per)
					})
				}
			}
		}()
	}
}

func cpuNow() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
