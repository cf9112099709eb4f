package fetcher_test

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	graspv1 "github.com/grasp-sync/grasp-sync/proto/grasp/v1"

	"github.com/grasp-sync/grasp-sync/pkg/testkit"

	"github.com/grasp-sync/grasp-sync/pkg/testkit/faultrelay"

	"github.com/grasp-sync/grasp-sync/pkg/testkit/testrelay"
	"github.com/grasp-sync/grasp-sync/services/fetcher"
)

// Two replicas split the shards; one is stopped (killed, or gracefully)
// in the middle of a historic batch. The other takes its shards over,
// reconnects the relay with a new session naming the old one, the batch
// redone on it delivers every event, and the relay never has two
// connections from us for longer than the lease TTL.
func TestReplicaStopsMidHistoricSync(t *testing.T) {
	for _, mode := range []string{"killed", "graceful"} {
		t.Run(mode, func(t *testing.T) {
			const shards = 4
			e := newEnv(t)
			cfgA, cfgB := baseConfig("fetcher-a"), baseConfig("fetcher-b")
			for _, c := range []*fetcher.Config{&cfgA, &cfgB} {
				// Small pages and id fetches, so events flow before the stall.
				c.Shards, c.IDsPerREQ, c.PageSize, c.RelayMinCap = shards, 10, 10, 10
			}
			a := e.start(cfgA, nil)
			b := e.start(cfgB, nil)
			e.waitFor("shards split between the replicas", func() bool {
				sa, sb := a.Shards(), b.Shards()
				for _, s := range sa {
					if slices.Contains(sb, s) {
						return false
					}
				}
				return len(sa) > 0 && len(sb) > 0 && len(sa)+len(sb) == shards
			})
			// A relay in one of A's shards.
			var r *faultrelay.Relay
			for r == nil || !slices.Contains(a.Shards(), shardOf(r.URL, shards)) {
				r = faultrelay.Start(t, testrelay.Options{})
			}
			shard := shardOf(r.URL, shards)
			evts := notes(testkit.NewKey(), 400, 1, 1000)
			r.Add(t, evts...)
			r.Set(faultrelay.Faults{StallAfterEvents: 50}) // A's batch hangs half-way
			e.send(shard, &graspv1.FetchCommand{RelayUrl: r.URL,
				Command: &graspv1.FetchCommand_EnsureConnected{EnsureConnected: &graspv1.EnsureConnected{}}})
			c1 := e.connected(r.URL)
			if c1.GetFetcherId() != "fetcher-a" {
				t.Fatalf("connected by %s", c1.GetFetcherId())
			}
			e.addFilters(shard, r.URL, c1.GetSessionId(), "b1", kind1, nil)
			e.waitFor("A mid-batch", func() bool { return e.eventCount() >= 20 })

			stopped := time.Now()
			if mode == "killed" {
				a.kill()
			} else {
				a.stop()
			}
			r.Set(faultrelay.Faults{})
			c2 := e.connected(r.URL, c1.GetSessionId())
			takeover := time.Since(stopped)
			t.Logf("%s: shard %d taken over, relay reconnected by %s after %s", mode, shard, c2.GetFetcherId(), takeover)
			if c2.GetFetcherId() != "fetcher-b" || c2.GetConnected().GetPreviousSessionId() != c1.GetSessionId() ||
				c2.GetConnected().GetPreviousFetcherId() != "fetcher-a" {
				t.Fatalf("takeover report %v", c2)
			}
			if takeover > 30*time.Second {
				t.Fatalf("takeover took %s", takeover)
			}
			if !slices.Contains(b.Shards(), shard) {
				t.Fatalf("B serves %v, not shard %d", b.Shards(), shard)
			}
			e.addFilters(shard, r.URL, c2.GetSessionId(), "b2", kind1, nil)
			if d := e.batchDone(r.URL, "b2"); d.GetOutcome() != graspv1.BatchOutcome_BATCH_OUTCOME_OK {
				t.Fatalf("batch %v", d)
			}
			e.waitEvents(evts)
			if done := e.reportsMatching(r.URL, func(r *graspv1.FetchReport) bool { return r.GetBatchDone().GetBatchId() == "b1" }); len(done) != 0 {
				t.Fatalf("the stopped replica's batch was reported done: %v", done)
			}
			assertNoLongOverlap(t, r.Spans(), cfgA.LeaseTTL)
		})
	}
}

// assertNoLongOverlap fails if two connections were open at once for
// longer than ttl.
func assertNoLongOverlap(t *testing.T, spans []faultrelay.ConnSpan, ttl time.Duration) {
	t.Helper()
	now := time.Now()
	for i, a := range spans {
		for _, b := range spans[i+1:] {
			aEnd, bEnd := a.Closed, b.Closed
			if aEnd.IsZero() {
				aEnd = now
			}
			if bEnd.IsZero() {
				bEnd = now
			}
			start, end := a.Opened, aEnd
			if b.Opened.After(start) {
				start = b.Opened
			}
			if bEnd.Before(end) {
				end = bEnd
			}
			if overlap := end.Sub(start); overlap > ttl {
				t.Fatalf("two connections open together for %s (TTL %s); connections (opened, closed after the first opened):%s",
					overlap, ttl, describeSpans(spans))
			}
		}
	}
}

// describeSpans lists connection spans relative to the first one's start,
// so a failure says which connections overlapped and when.
func describeSpans(spans []faultrelay.ConnSpan) string {
	if len(spans) == 0 {
		return " none"
	}
	var sb strings.Builder
	t0 := spans[0].Opened
	for i, s := range spans {
		closed := "open"
		if !s.Closed.IsZero() {
			closed = s.Closed.Sub(t0).String()
		}
		fmt.Fprintf(&sb, " #%d %s–%s;", i, s.Opened.Sub(t0), closed)
	}
	return sb.String()
}

func TestRendezvousShards(t *testing.T) {
	members := []string{"a", "b", "c"}
	seen := map[int]string{}
	for _, m := range members {
		for _, s := range fetcher.RendezvousShards(members, m, 16) {
			if o, dup := seen[s]; dup {
				t.Fatalf("shard %d owned by %s and %s", s, o, m)
			}
			seen[s] = m
		}
	}
	if len(seen) != 16 {
		t.Fatalf("%d of 16 shards assigned", len(seen))
	}
	// Removing a member moves only its shards.
	for s, owner := range seen {
		if owner == "c" {
			continue
		}
		if !slices.Contains(fetcher.RendezvousShards([]string{"a", "b"}, owner, 16), s) {
			t.Fatalf("shard %d moved from %s although %s stayed", s, owner, owner)
		}
	}
}
