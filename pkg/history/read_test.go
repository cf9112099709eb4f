package history_test

import (
	"context"
	"testing"
	"time"

	"github.com/nbd-wtf/go-nostr"

	"github.com/grasp-sync/grasp-sync/pkg/history"
	"github.com/grasp-sync/grasp-sync/pkg/relayconn"
	"github.com/grasp-sync/grasp-sync/pkg/testkit"
)

// A relay that caps every REQ at 7 results still yields every event, even
// with ties on created_at across page boundaries.
func TestReadThroughCappedRelay(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	r := testkit.StartRelay(t, testkit.RelayOptions{MaxLimit: 7})
	k := testkit.NewKey()
	want := map[string]bool{}
	for i := range 60 {
		evt := k.Note("n", testkit.At(nostr.Timestamp(1000+i/3))) // three per second
		r.Add(t, evt)
		want[evt.ID] = true
	}
	c, err := relayconn.Dial(ctx, r.URL, relayconn.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	got := map[string]bool{}
	st, err := history.Read(ctx, c, nostr.Filter{Kinds: []int{1}, Limit: 500}, 100, func(evts []*nostr.Event) error {
		for _, e := range evts {
			if got[e.ID] {
				t.Errorf("event %s delivered twice", e.ID)
			}
			got[e.ID] = true
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(want) {
		t.Fatalf("read %d of %d events in %d pages", len(got), len(want), st.Pages)
	}
}
