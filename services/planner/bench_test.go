package planner

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"os"
	"runtime"
	"slices"
	"syscall"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	graspv1 "github.com/grasp-sync/grasp-sync/proto/grasp/v1"
)

// scale describes a benchmark world: repos × rootsPerRepo roots, each repo
// listed by relaysPerRepo of relays relays.
type scale struct {
	name                                 string
	repos, rootsPerRepo, relays, perRepo int
}

var (
	designScale  = scale{"design", 10_000, 50, 500, 5}
	stretchScale = scale{"stretch", 10_000, 500, 500, 5}
)

func benchRootID(repo, i int) string {
	var b [16]byte
	binary.BigEndian.PutUint64(b[:8], uint64(repo))
	binary.BigEndian.PutUint64(b[8:], uint64(i))
	sum := sha256.Sum256(b[:])
	return hex.EncodeToString(sum[:])
}

func benchNeeds(sc scale, repo, extraRoots int) *graspv1.RepoSyncNeeds {
	n := &graspv1.RepoSyncNeeds{RepoRef: fmt.Sprintf("30617:%064x:repo-%d", repo, repo)}
	for k := range sc.perRepo {
		n.Relays = append(n.Relays, fmt.Sprintf("wss://relay-%03d.example", (repo*sc.perRepo+k)%sc.relays))
	}
	for i := range sc.rootsPerRepo + extraRoots {
		n.RootEventIds = append(n.RootEventIds, benchRootID(repo, i))
	}
	return n
}

// buildWorld loads the index at scale into a machine and, when synced,
// connects every relay and confirms every batch through the real lifecycle
// (relay by relay, draining commands so they do not pile up).
func buildWorld(tb testing.TB, sc scale, synced bool) *Machine {
	tb.Helper()
	rules := DefaultRules()
	rules.Heartbeat = 0
	m := NewMachine(rules, NewIndex(), 1, func() float64 { return 0.5 }, nil)
	for r := range sc.repos {
		m.ApplyIndex([]IndexChange{m.Index().Put(fmt.Sprintf("k%d", r), benchNeeds(sc, r, 0))})
	}
	now := t0
	m.Recompute(now, true)
	m.Drain()
	for _, id := range m.sortedRelays() {
		s := m.relays[id]
		m.HandleReport(now, &graspv1.FetchReport{RelayUrl: s.URL, SessionId: "s1",
			Report: &graspv1.FetchReport_Connected{Connected: &graspv1.Connected{}}})
		m.Drain()
		if !synced {
			// Connected with nothing fetched: undo the batches the connect
			// started, so a recompute sees every item missing.
			m.clearPending(s)
			s.AnnouncementsSynced = true
			continue
		}
		for len(s.Batches) > 0 {
			m.HandleReport(now, &graspv1.FetchReport{RelayUrl: s.URL, SessionId: "s1",
				Report: &graspv1.FetchReport_BatchDone{BatchDone: &graspv1.BatchDone{BatchId: s.Batches[0].ID, Outcome: graspv1.BatchOutcome_BATCH_OUTCOME_OK}}})
			m.Drain()
		}
	}
	// Consolidations the connects queued (at stretch scale every relay's
	// split batches open more live filters than its minimal set plus
	// headroom) are built before measuring, as the loop would.
	for m.DeferredConsolidations() > 0 {
		now = now.Add(rules.ConsolidateEvery)
		m.Tick(now)
		m.Drain()
	}
	m.TakeDirty()
	return m
}

func liveHeapMB() float64 {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return float64(ms.HeapAlloc) / (1 << 20)
}

func scales(b *testing.B) []scale {
	out := []scale{designScale}
	if os.Getenv("GRASP_BENCH_STRETCH") != "" {
		out = append(out, stretchScale)
	}
	return out
}

// BenchmarkRecompute measures one full recompute (ComputeActions over every
// relay, decisions executed) at quiescence — everything confirmed, the
// steady state a discovery batch meets — and the live heap of that state.
func BenchmarkRecompute(b *testing.B) {
	for _, sc := range scales(b) {
		b.Run(sc.name+"/full-synced", func(b *testing.B) {
			m := buildWorld(b, sc, true)
			heap := liveHeapMB()
			pairs := 0
			for _, s := range m.relays {
				_, roots, _, _ := s.Counts()
				pairs += roots
			}
			if pairs != sc.repos*sc.rootsPerRepo*sc.perRepo {
				b.Fatalf("%d confirmed pairs", pairs)
			}
			b.ResetTimer()
			for range b.N {
				m.Recompute(t0, true)
				if cmds := m.Drain(); len(cmds) != 0 {
					b.Fatalf("%d commands at quiescence", len(cmds))
				}
			}
			b.ReportMetric(heap, "live-heap-MB")
			b.ReportMetric(float64(pairs), "pairs")
			runtime.KeepAlive(m)
		})
	}
}

// BenchmarkComputeActionsCold measures the decision alone (pure
// ComputeActions) when every relay is connected and nothing is fetched yet:
// every one of the relay × root pairs is missing.
func BenchmarkComputeActionsCold(b *testing.B) {
	for _, sc := range scales(b) {
		b.Run(sc.name, func(b *testing.B) {
			m := buildWorld(b, sc, false)
			b.ResetTimer()
			for range b.N {
				actions := ComputeActions(m.idx, m.relays, nil, t0)
				if len(actions) != sc.relays {
					b.Fatalf("%d actions", len(actions))
				}
			}
		})
	}
}

// BenchmarkRecomputeColdCommands is the cold recompute including building
// every AddFilters command (filters with hex ids): what a planner with an
// empty grasp_relay_state does once.
func BenchmarkRecomputeColdCommands(b *testing.B) {
	for _, sc := range scales(b) {
		b.Run(sc.name, func(b *testing.B) {
			for range b.N {
				b.StopTimer()
				m := buildWorld(b, sc, false)
				b.StartTimer()
				m.Recompute(t0, true)
				if len(m.Drain()) == 0 {
					b.Fatal("no commands")
				}
			}
		})
	}
}

// BenchmarkColdCommandsEncoded is BenchmarkRecomputeColdCommands with every
// command encoded as the loop publishes it, for a fetcher that lists a
// batch's live filters and one that reads them as an index into its
// historic filters (AddFilters.live_from_historic): payload-MB is what the
// command stream carries for the whole world, and what a fetcher decodes.
func BenchmarkColdCommandsEncoded(b *testing.B) {
	for _, sc := range scales(b) {
		for _, indexed := range []bool{false, true} {
			b.Run(fmt.Sprintf("%s/indexed=%v", sc.name, indexed), func(b *testing.B) {
				size, n := 0, 0
				for range b.N {
					b.StopTimer()
					m := buildWorld(b, sc, false)
					for _, s := range m.relays {
						s.liveFromHistoric = indexed
					}
					b.StartTimer()
					m.Recompute(t0, true)
					size, n = 0, 0
					for _, c := range m.Drain() {
						data, err := proto.Marshal(c)
						if err != nil {
							b.Fatal(err)
						}
						size += len(data)
						n++
					}
				}
				b.ReportMetric(float64(size)/(1<<20), "payload-MB")
				b.ReportMetric(float64(n), "commands")
			})
		}
	}
}

// BenchmarkIncremental measures one discovery batch of 100 changed
// repositories on the synced world — "1root": each gains one root; "grow"
// (the original shape): in batch i each gains i+1 roots, so batches grow
// along a run — index updates,
// recompute of the touched relays and the resulting commands, reported as
// p50/mean(ns/op)/max per batch; recompute-* is the Recompute alone (what
// grasp_planner_recompute_duration_seconds measures: the loop applies index
// entries as they arrive, before the debounced recompute). Every relay gains
// live filters in every batch, so consolidations fall due all the time.
//
// "deferred" (the default rules) replays, between two batches, one second of
// the planner loop on the injected time: Tick at each NextDeadline, which
// builds the deferred consolidations, and the protobuf encoding of the
// commands it emits (what the loop does before publishing). That work is not
// in the per-batch time; it is reported as bg-ms (wall time per one-second
// interval), bg-cpu-ms (process CPU time in it; cpu-ms is the same for the
// batch), bg-KB (command bytes per interval), consol/batch (consolidations
// built per interval: ReplaceLive or merges of live sets), replace/batch
// (those that were ReplaceLive), dequeued/batch (queue entries taken,
// including those found unneeded) and queue-max (the most relays still
// queued when a batch arrived). The steady state is the second half of the
// batches, once every relay has consolidated at least once (a relay does
// every 12–23 batches): ss-bg-cpu-ms and ss-bg-core-% (that CPU as a share of
// one core at one batch per second: the issue 17 target is ≤ 10 % at stretch
// scale) and ss-bg-KB. "inline" consolidates inside the recompute
// (ConsolidatePerTick 0), as the planner did before.
func BenchmarkIncremental(b *testing.B) {
	for _, sc := range scales(b) {
		for _, bench := range []struct{ mode, shape string }{{"deferred", "grow"}, {"inline", "grow"}, {"deferred", "1root"}, {"inline", "1root"}} {
			mode := bench.mode
			b.Run(sc.name+"/100-repos/"+bench.shape+"/"+mode, func(b *testing.B) {
				m := buildWorld(b, sc, true)
				if mode == "inline" {
					m.rules.ConsolidatePerTick = 0
				}
				var took, recompute []time.Duration
				var bg, cpu, bgCPU, ssCPU time.Duration
				consolidations, replaces, drained, queueMax, bytes, ssBytes := 0, 0, 0, 0, 0, 0
				now := t0.Add(time.Hour) // after every timer buildWorld left
				b.ResetTimer()
				for i := range b.N {
					b.StopTimer()
					batch := make([]*graspv1.RepoSyncNeeds, 100)
					for j := range batch {
						repo := (i*100 + j) % sc.repos
						extra := 1 + i // grow: batch i adds i+1 roots to each repository
						if bench.shape == "1root" {
							extra = 1 + (i*100+j)/sc.repos // one more root each time a repository changes
						}
						batch[j] = benchNeeds(sc, repo, extra)
					}
					queueMax = max(queueMax, m.DeferredConsolidations())
					b.StartTimer()
					start, cpu0 := time.Now(), cpuTime()
					for j, needs := range batch {
						repo := (i*100 + j) % sc.repos
						m.ApplyIndex([]IndexChange{m.Index().Put(fmt.Sprintf("k%d", repo), needs)})
					}
					applied := time.Now()
					m.Recompute(now, false)
					if len(m.Drain()) == 0 {
						b.Fatal("no commands")
					}
					took = append(took, time.Since(start))
					recompute = append(recompute, time.Since(applied))
					b.StopTimer()
					cpu += cpuTime() - cpu0
					// The loop until the next batch, one second later.
					end := now.Add(time.Second)
					start, cpu0 = time.Now(), cpuTime()
					for {
						next := m.NextDeadline()
						if next.IsZero() || !next.Before(end) {
							break
						}
						now = maxTime(now, next)
						queued := m.DeferredConsolidations()
						m.Tick(now)
						drained += queued - m.DeferredConsolidations()
						for _, c := range m.Drain() {
							switch {
							case c.GetReplaceLive() != nil:
								consolidations++
								replaces++
							case c.GetCloseLive() != nil && c.GetCloseLive().GetAfterLiveId() != "":
								consolidations++
							}
							data, err := proto.Marshal(c)
							if err != nil {
								b.Fatal(err)
							}
							bytes += len(data)
							if i >= b.N/2 {
								ssBytes += len(data)
							}
						}
					}
					bg += time.Since(start)
					bgCPU += cpuTime() - cpu0
					if i >= b.N/2 {
						ssCPU += cpuTime() - cpu0
					}
					now = end
					b.StartTimer()
				}
				b.StopTimer()
				slices.Sort(took)
				slices.Sort(recompute)
				b.ReportMetric(float64(took[len(took)/2].Microseconds())/1000, "p50-ms")
				b.ReportMetric(float64(took[len(took)*9/10].Microseconds())/1000, "p90-ms")
				b.ReportMetric(float64(took[len(took)-1].Microseconds())/1000, "max-ms")
				b.ReportMetric(float64(recompute[len(recompute)/2].Microseconds())/1000, "recompute-p50-ms")
				b.ReportMetric(float64(recompute[len(recompute)-1].Microseconds())/1000, "recompute-max-ms")
				b.ReportMetric(float64(bg.Microseconds())/1000/float64(b.N), "bg-ms")
				b.ReportMetric(float64(cpu.Microseconds())/1000/float64(b.N), "cpu-ms")
				b.ReportMetric(float64(bgCPU.Microseconds())/1000/float64(b.N), "bg-cpu-ms")
				b.ReportMetric(float64(bytes)/1024/float64(b.N), "bg-KB")
				ss := float64(b.N - b.N/2)
				b.ReportMetric(float64(ssCPU.Microseconds())/1000/ss, "ss-bg-cpu-ms")
				b.ReportMetric(float64(ssCPU.Microseconds())/1000/ss/10, "ss-bg-core-%")
				b.ReportMetric(float64(ssBytes)/1024/ss, "ss-bg-KB")
				if mode == "deferred" && b.N >= 24 {
					// A row for make bench: the issue 17 §4 target.
					pct := float64(ssCPU.Microseconds()) / 1000 / ss / 10
					verdict := "met"
					if pct > 10 {
						verdict = "NOT met"
					}
					b.Logf("%s scale, %s: steady-state background work %.1f %% of one core at one discovery batch per second (target ≤ 10 %%: %s); %.0f KB of commands per second",
						sc.name, bench.shape, pct, verdict, float64(ssBytes)/1024/ss)
				}
				b.ReportMetric(float64(consolidations)/float64(b.N), "consol/batch")
				b.ReportMetric(float64(replaces)/float64(b.N), "replace/batch")
				b.ReportMetric(float64(drained)/float64(b.N), "dequeued/batch")
				b.ReportMetric(float64(queueMax), "queue-max")
			})
		}
	}
}

// cpuTime is the process's CPU time (user + system, every thread: the GC's
// too), so costs can be read apart from waiting for a CPU on a shared box.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func maxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// BenchmarkConsolidate measures one consolidation of a design-scale relay
// (100 repositories, 5,000 roots: ~154 live filters in 4 commands): building
// the commands, and encoding them as the loop does before publishing
// (bytes/op is the payload).
func BenchmarkConsolidate(b *testing.B) {
	m := buildWorld(b, designScale, true)
	s := m.relays[m.sortedRelays()[0]]
	b.Run("build", func(b *testing.B) {
		for range b.N {
			m.replaceLive(s, nil)
			if len(m.Drain()) != 4 {
				b.Fatal("want 4 commands")
			}
		}
	})
	b.Run("build+encode", func(b *testing.B) {
		size := 0
		for range b.N {
			m.replaceLive(s, nil)
			size = 0
			for _, c := range m.Drain() {
				data, err := proto.Marshal(c)
				if err != nil {
					b.Fatal(err)
				}
				size += len(data)
			}
		}
		b.ReportMetric(float64(size), "payload-bytes")
	})
}
