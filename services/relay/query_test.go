package relay

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/nbd-wtf/go-nostr"
	"github.com/nbd-wtf/go-nostr/nip77"

	"github.com/grasp-sync/grasp-sync/pkg/history"
	"github.com/grasp-sync/grasp-sync/pkg/relayconn"
	"github.com/grasp-sync/grasp-sync/pkg/testkit"
)

// Reading over the websocket: the result cap with pagination, and negentropy.

// TestNegentropy: reconciliation works, and errors come as NEG-ERR (not
// khatru's NEG-ERROR) with NIP-77 reason prefixes.
func TestNegentropy(t *testing.T) {
	s := startServer(t, serverOpts{})
	c := dial(t, s.url)
	alice := testkit.NewKey()
	if ok, msg := c.publish(served(alice, "repo")); !ok {
		t.Fatal(msg)
	}
	isNeg := func(id string) func(nostr.Envelope, string) bool {
		return func(_ nostr.Envelope, raw string) bool {
			return strings.HasPrefix(raw, `["NEG-`) && strings.Contains(raw, `"`+id+`"`)
		}
	}
	// An empty local set: the relay answers with a NEG-MSG naming what it has.
	c.write([]any{"NEG-OPEN", "n1", nostr.Filter{Kinds: []int{30617}}, "6100000200"})
	if _, raw := c.next(isNeg("n1")); !strings.HasPrefix(raw, `["NEG-MSG","n1",`) {
		t.Fatalf("NEG-OPEN answered %s", raw)
	}

	tests := []struct {
		name   string
		msg    []any
		prefix string
	}{
		{"unsupported filter", []any{"NEG-OPEN", "n2", nostr.Filter{Search: "x"}, "6100000200"}, "unsupported: "},
		{"message for a closed session", []any{"NEG-MSG", "gone", "6100000200"}, "closed: "},
		{"bad negentropy message", []any{"NEG-OPEN", "n3", nostr.Filter{}, "zz"}, "error: "},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			id := tt.msg[1].(string)
			c.write(tt.msg)
			env, raw := c.next(isNeg(id))
			if !strings.HasPrefix(raw, `["NEG-ERR",`) {
				t.Fatalf("got %s, want NEG-ERR", raw)
			}
			e, ok := env.(*nip77.ErrorEnvelope)
			if !ok || !strings.HasPrefix(e.Reason, tt.prefix) {
				t.Fatalf("got %s, want reason prefix %q", raw, tt.prefix)
			}
		})
	}
}

// TestResultCapAndPagination: a REQ returns at most MaxLimit events, the
// newest, so paging with until reads everything, also when many events
// share one created_at.
func TestResultCapAndPagination(t *testing.T) {
	s := startServer(t, serverOpts{cfg: Config{MaxLimit: 100}})
	ctx := context.Background()
	k := testkit.NewKey()
	base := time.Now().Add(-time.Hour).Unix()
	want := map[string]bool{}
	for i := 0; i < 450; i++ {
		// 150 events share one timestamp: more than a page.
		ts := base + int64(i)
		if i < 150 {
			ts = base
		}
		e := k.Note("n", testkit.At(nostr.Timestamp(ts)), testkit.WithTags(nostr.Tag{"t", "page"}))
		if _, err := s.store.Save(ctx, e); err != nil {
			t.Fatal(err)
		}
		want[e.ID] = true
	}
	c := dial(t, s.url)
	for _, f := range []nostr.Filter{{Kinds: []int{1}}, {Kinds: []int{1}, Limit: 5000}} {
		got := c.query(f)
		if len(got) != 100 {
			t.Fatalf("REQ %v returned %d events, want the cap 100", f, len(got))
		}
		for i := 1; i < len(got); i++ {
			if got[i].CreatedAt > got[i-1].CreatedAt {
				t.Fatal("not newest first")
			}
		}
		if got[0].CreatedAt != nostr.Timestamp(base+449) {
			t.Fatal("first page does not start with the newest event")
		}
	}
	if got := c.query(nostr.Filter{Kinds: []int{1}, Limit: 7}); len(got) != 7 {
		t.Fatalf("limit 7 returned %d", len(got))
	}

	rc, err := relayconn.Dial(ctx, s.url, relayconn.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	seen := map[string]bool{}
	pctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	_, err = history.Read(pctx, rc, nostr.Filter{Kinds: []int{1}, Tags: nostr.TagMap{"t": {"page"}}}, 100, 100, func(evts []*nostr.Event) error {
		for _, e := range evts {
			seen[e.ID] = true
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(seen) != len(want) {
		t.Fatalf("paging read %d of %d events", len(seen), len(want))
	}
}
