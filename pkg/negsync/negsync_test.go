package negsync_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/nbd-wtf/go-nostr"

	"github.com/grasp-sync/grasp-sync/pkg/negsync"
	"github.com/grasp-sync/grasp-sync/pkg/relayconn"
	"github.com/grasp-sync/grasp-sync/pkg/testkit"
	"github.com/grasp-sync/grasp-sync/pkg/testkit/faultrelay"
	"github.com/grasp-sync/grasp-sync/pkg/testkit/testrelay"
)

func notes(k testkit.Key, n int, from nostr.Timestamp) []*nostr.Event {
	out := make([]*nostr.Event, n)
	for i := range out {
		out[i] = k.Note(fmt.Sprintf("note %d", i), testkit.At(from+nostr.Timestamp(i/4))) // ties on created_at
	}
	return out
}

func items(evts []*nostr.Event) []negsync.Item {
	out := make([]negsync.Item, len(evts))
	for i, e := range evts {
		out[i] = negsync.Item{ID: e.ID, CreatedAt: e.CreatedAt}
	}
	return out
}

func dial(t *testing.T, ctx context.Context, url string) *relayconn.Conn {
	t.Helper()
	c, err := relayconn.Dial(ctx, url, relayconn.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// The relay holds 600 events; we hold 450 of them plus 40 it lacks. We need
// exactly the 150 missing, each once, with a frame limit that forces
// several rounds.
func TestReconcileFindsExactlyTheMissingIDs(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	r := testrelay.Start(t, testrelay.Options{Negentropy: true})
	k := testkit.NewKey()
	remote := notes(k, 600, 1000)
	r.Add(t, remote...)
	local := append(items(remote[:450]), items(notes(k, 40, 5000))...)
	res, err := negsync.Reconcile(ctx, dial(t, ctx, r.URL), nostr.Filter{Kinds: []int{1}}, local, negsync.Options{FrameSize: 4096})
	if err != nil {
		t.Fatal(err)
	}
	var want []string
	for _, e := range remote[450:] {
		want = append(want, e.ID)
	}
	got := slices.Clone(res.Need)
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Fatalf("need %d ids, want the %d missing ones", len(got), len(want))
	}
	if res.Rounds < 2 || res.BytesIn == 0 || res.BytesOut == 0 {
		t.Fatalf("rounds %d, bytes in %d out %d", res.Rounds, res.BytesIn, res.BytesOut)
	}
}

// Every way a relay says "no NIP-77" ends the reconciliation with
// ErrUnsupported instead of hanging, and the connection stays usable.
func TestReconcileUnsupported(t *testing.T) {
	for name, faults := range map[string]faultrelay.Faults{
		"NEG-ERR":       {NegOpenAnswer: "NEG-ERR", NegOpenText: "blocked: too many query results"},
		"NEG-ERROR":     {NegOpenAnswer: "NEG-ERROR", NegOpenText: "invalid limit 0"},
		"notice":        {NegOpenAnswer: "NOTICE", NegOpenText: "ERROR: bad msg: negentropy disabled"},
		"khatru notice": {NegOpenAnswer: "NOTICE", NegOpenText: "failed to parse envelope: unknown envelope label"},
		"silence":       {NegOpenAnswer: "SILENT"},
	} {
		t.Run(name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			f := faultrelay.Start(t, testrelay.Options{Negentropy: true})
			k := testkit.NewKey()
			f.Add(t, notes(k, 3, 1000)...)
			f.Set(faults)
			c := dial(t, ctx, f.URL)
			_, err := negsync.Reconcile(ctx, c, nostr.Filter{Kinds: []int{1}}, nil, negsync.Options{RoundTimeout: 300 * time.Millisecond})
			if !errors.Is(err, negsync.ErrUnsupported) {
				t.Fatalf("err = %v, want ErrUnsupported", err)
			}
			evts := 0
			sub, err := c.Subscribe(ctx, nostr.Filters{{Kinds: []int{1}}})
			if err != nil {
				t.Fatal(err)
			}
			for {
				select {
				case <-sub.Events():
					evts++
					continue
				case <-sub.EOSE():
					evts += len(sub.Events()) // delivered before EOSE, still buffered
				case <-ctx.Done():
					t.Fatal("connection unusable after the NIP-77 failure")
				}
				break
			}
			if evts != 3 {
				t.Fatalf("REQ after the failure got %d events, want 3", evts)
			}
		})
	}
}

// A relay without NIP-77 (khatru's own NOTICE) is recognised too.
func TestReconcileAgainstRelayWithoutNIP77(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	r := testrelay.Start(t, testrelay.Options{})
	_, err := negsync.Reconcile(ctx, dial(t, ctx, r.URL), nostr.Filter{Kinds: []int{1}}, nil, negsync.Options{})
	if !errors.Is(err, negsync.ErrUnsupported) {
		t.Fatalf("err = %v, want ErrUnsupported", err)
	}
}

// A connection lost mid-reconciliation is an error, not "unsupported".
func TestReconcileConnectionLost(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	f := faultrelay.Start(t, testrelay.Options{Negentropy: true})
	f.Add(t, notes(testkit.NewKey(), 100, 1000)...)
	f.Set(faultrelay.Faults{DropMidNegentropy: true})
	_, err := negsync.Reconcile(ctx, dial(t, ctx, f.URL), nostr.Filter{Kinds: []int{1}}, nil, negsync.Options{})
	if err == nil || errors.Is(err, negsync.ErrUnsupported) {
		t.Fatalf("err = %v, want a connection error", err)
	}
}

func TestNoticeMeansNoNIP77(t *testing.T) {
	for notice, want := range map[string]bool{
		"ERROR: bad msg: negentropy disabled":              true,
		"failed to parse envelope: unknown envelope label": true,
		"NEG-OPEN not supported":                           true,
		"unsupported command":                              true,
		"rate-limited: slow down":                          false,
		"welcome!":                                         false,
	} {
		if got := negsync.NoticeMeansNoNIP77(notice); got != want {
			t.Errorf("%q: %v, want %v", notice, got, want)
		}
	}
}
