package policy_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nbd-wtf/go-nostr"

	"github.com/grasp-sync/grasp-sync/pkg/policy"
)

// failingLookup is a store that cannot be read.
type failingLookup struct{ err error }

func (f failingLookup) Query(context.Context, nostr.Filter) ([]*nostr.Event, error) {
	return nil, f.err
}

func TestStoreErrorFailsClosed(t *testing.T) {
	alice := newUser(t)
	boom := errors.New("disk on fire")
	p := &policy.Policy{ServiceURL: service, Store: failingLookup{boom}, Now: func() time.Time { return t0 }}
	tests := []struct {
		name string
		evt  *nostr.Event
	}{
		{"issue", alice.ev(t, 1621, 0, "", nostr.Tag{"a", alice.coord("repo")})},
		{"served announcement", alice.served(t, "repo", 0)},
		{"state", alice.ev(t, 30618, 0, "", nostr.Tag{"d", "repo"})},
		{"deletion", alice.ev(t, 5, 0, "", nostr.Tag{"e", strings.Repeat("a", 64)})},
		{"grasp list", alice.ev(t, 10317, 0, "")},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := p.Evaluate(context.Background(), tt.evt)
			if d.Accept || d.Reason != policy.ReasonStoreError || !strings.HasPrefix(d.Message, "error: ") {
				t.Fatalf("got %+v, want a store-error refusal", d)
			}
			if !errors.Is(d.Err, boom) {
				t.Fatalf("Err = %v, want it to wrap %v", d.Err, boom)
			}
			if strings.Contains(d.Message, boom.Error()) {
				t.Fatalf("message %q leaks the internal error", d.Message)
			}
		})
	}
	// A failure on a later query (not the first) fails closed too.
	e := newEnv(t)
	e.submit(t, alice.served(t, "repo", 0))
	p2 := &policy.Policy{ServiceURL: service, Now: func() time.Time { return t0 }, Store: &flakyLookup{inner: badgerLookup{e.db}, failAt: 2, err: boom}}
	if d := p2.Evaluate(context.Background(), alice.ev(t, 1, 0, "x")); d.Reason != policy.ReasonStoreError {
		t.Fatalf("got %+v, want store error", d)
	}
	if d := (&policy.Policy{ServiceURL: service}).Evaluate(context.Background(), alice.ev(t, 1, 0, "x")); d.Reason != policy.ReasonStoreError {
		t.Fatalf("nil store: got %+v, want store error", d)
	}
}

// flakyLookup fails its failAt-th query (1-based).
type flakyLookup struct {
	inner  policy.Lookup
	failAt int
	n      int
	err    error
}

func (f *flakyLookup) Query(ctx context.Context, flt nostr.Filter) ([]*nostr.Event, error) {
	f.n++
	if f.n == f.failAt {
		return nil, f.err
	}
	return f.inner.Query(ctx, flt)
}

func TestQueriesAreBounded(t *testing.T) {
	e := newEnv(t)
	alice := newUser(t)
	e.submit(t, alice.served(t, "repo", 0))
	rec := &recordingLookup{inner: badgerLookup{e.db}}
	p := &policy.Policy{ServiceURL: service, Store: rec, Now: func() time.Time { return t0 }}
	var tags []nostr.Tag
	for i := 0; i < 1000; i++ {
		tags = append(tags, nostr.Tag{"e", fakeID(i)}, nostr.Tag{"a", alice.coord("r" + strconv.Itoa(i))})
	}
	p.Evaluate(context.Background(), alice.ev(t, 1, 0, "", tags...))
	t.Logf("%d queries", len(rec.filters))
	if len(rec.filters) > 10 {
		t.Errorf("%d queries for one event", len(rec.filters))
	}
	for _, f := range rec.filters {
		if f.Limit <= 0 {
			t.Errorf("filter without limit: %v", f)
		}
		if len(f.IDs) > 100 || len(f.Tags["d"]) > 100 {
			t.Errorf("filter with too many values: %d ids, %d d", len(f.IDs), len(f.Tags["d"]))
		}
	}
}

type recordingLookup struct {
	inner   policy.Lookup
	filters []nostr.Filter
}

func (r *recordingLookup) Query(ctx context.Context, f nostr.Filter) ([]*nostr.Event, error) {
	r.filters = append(r.filters, f)
	return r.inner.Query(ctx, f)
}

// kindsLookup is a store that also answers policy.KindLookup (from the
// same store) and counts the calls.
type kindsLookup struct {
	badgerLookup
	calls int
	err   error
}

func (l *kindsLookup) StoredKinds(ctx context.Context, ids []string) ([]int, error) {
	l.calls++
	if l.err != nil {
		return nil, l.err
	}
	kinds := make([]int, len(ids))
	for n, id := range ids {
		kinds[n] = -1
		found, err := l.Query(ctx, nostr.Filter{IDs: []string{id}, Limit: 1})
		if err != nil {
			return nil, err
		}
		if len(found) > 0 {
			kinds[n] = found[0].Kind
		}
	}
	return kinds, nil
}

// TestKindLookupDecidesAsQuery: a store that can tell stored kinds by id
// (policy.KindLookup) is asked for rule 5's referenced ids instead of
// Query, and every decision (reason, message, missing) is the one Query
// gives: a stored anchor accepts, a deleted event, a stored deletion and an
// unknown id do not, and a failure fails closed.
func TestKindLookupDecidesAsQuery(t *testing.T) {
	e := newEnv(t)
	alice, bob := newUser(t), newUser(t)
	repo := nostr.Tag{"a", alice.coord("repo")}
	issue := alice.ev(t, 1621, time.Second, "issue", repo)
	doomed := alice.ev(t, 1621, 2*time.Second, "doomed", repo)
	del := alice.ev(t, 5, 3*time.Second, "", nostr.Tag{"e", doomed.ID})
	run(t, e, []step{
		{"announcement", alice.served(t, "repo", 0), policy.ReasonAccepted},
		{"issue", issue, policy.ReasonAccepted},
		{"doomed issue", doomed, policy.ReasonAccepted},
		{"its deletion", del, policy.ReasonAccepted},
	})
	if e.stored(t, doomed.ID) || !e.stored(t, del.ID) {
		t.Fatal("the deletion was not applied")
	}
	unknown := strings.Repeat("f", 64)
	reply := func(ids ...string) *nostr.Event {
		var tags []nostr.Tag
		for _, id := range ids {
			tags = append(tags, nostr.Tag{"e", id})
		}
		return bob.ev(t, 1111, 4*time.Second, "reply", tags...)
	}
	tests := []struct {
		name   string
		evt    *nostr.Event
		reason policy.Reason
	}{
		{"stored parent", reply(issue.ID), policy.ReasonAccepted},
		{"unknown then stored parent", reply(unknown, issue.ID), policy.ReasonAccepted},
		{"deleted parent", reply(doomed.ID), policy.ReasonNoReference},
		{"a deletion does not anchor", reply(del.ID), policy.ReasonNoReference},
		{"unknown parent", reply(unknown), policy.ReasonNoReference},
		{"none of several", reply(unknown, doomed.ID, del.ID), policy.ReasonNoReference},
	}
	kl := &kindsLookup{badgerLookup: badgerLookup{e.db}}
	byKinds := &policy.Policy{ServiceURL: service, Store: kl, Now: func() time.Time { return t0 }}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			want := e.p.Evaluate(context.Background(), tt.evt)
			calls := kl.calls
			got := byKinds.Evaluate(context.Background(), tt.evt)
			if kl.calls == calls {
				t.Fatal("StoredKinds was not asked")
			}
			if got.Reason != tt.reason || want.Reason != tt.reason {
				t.Fatalf("reason %q by kinds, %q by Query; want %q", got.Reason, want.Reason, tt.reason)
			}
			if got.Message != want.Message || strings.Join(got.Missing, ",") != strings.Join(want.Missing, ",") {
				t.Fatalf("by kinds %q missing %v; by Query %q missing %v", got.Message, got.Missing, want.Message, want.Missing)
			}
		})
	}
	boom := errors.New("disk on fire")
	kl.err = boom
	if d := byKinds.Evaluate(context.Background(), reply(issue.ID)); d.Reason != policy.ReasonStoreError || !errors.Is(d.Err, boom) {
		t.Fatalf("a failing StoredKinds: got %+v, want a store error", d)
	}
}

// TestReferenceLookupsAreRule5Reads: ReferenceLookups returns exactly the
// reads rule 5 makes (for a caller answering them ahead, the ingester's
// batch prefetch), in its order, for an event every read of which comes
// back empty; and nothing for a kind with a rule of its own.
func TestReferenceLookupsAreRule5Reads(t *testing.T) {
	e := newEnv(t)
	alice, bob := newUser(t), newUser(t)
	for _, evt := range []*nostr.Event{
		bob.ev(t, 1111, time.Second, "reply", nostr.Tag{"a", alice.coord("nowhere")}, nostr.Tag{"e", fakeID(1)}, nostr.Tag{"q", fakeID(2)}),
		bob.ev(t, 30023, time.Second, "article", nostr.Tag{"d", "x"}, nostr.Tag{"e", fakeID(3)}),
		bob.ev(t, 1, time.Second, "note"),
	} {
		rec := &recordingLookup{inner: badgerLookup{e.db}}
		p := &policy.Policy{ServiceURL: service, Store: rec, Now: func() time.Time { return t0 }}
		if d := p.Evaluate(context.Background(), evt); d.Reason != policy.ReasonNoReference {
			t.Fatalf("kind %d: %s, want no-reference", evt.Kind, d.Reason)
		}
		coords, ids, forward, ok := p.ReferenceLookups(evt)
		if !ok {
			t.Fatalf("kind %d: not decided by rule 5", evt.Kind)
		}
		want := append([]nostr.Filter{}, coords...)
		if len(ids) > 0 {
			want = append(want, nostr.Filter{IDs: ids, Limit: len(ids)})
		}
		want = append(want, forward...)
		// Rule 0 reads first: the id, and the deletions by id (and by
		// coordinate and the versions, for a keyed event).
		got := rec.filters[len(rec.filters)-len(want):]
		if a, b := fmt.Sprint(got), fmt.Sprint(want); a != b {
			t.Errorf("kind %d: rule 5 read\n%s\nReferenceLookups returned\n%s", evt.Kind, a, b)
		}
		if n := len(forward); n != 3 && !(evt.Kind == 30023 && n == 5) {
			t.Errorf("kind %d: %d forward reads", evt.Kind, n)
		}
	}
	p := &policy.Policy{ServiceURL: service, Store: badgerLookup{e.db}}
	for _, kind := range []int{30617, 30618, 5, 10317} {
		if _, _, _, ok := p.ReferenceLookups(alice.ev(t, kind, 0, "", nostr.Tag{"d", "repo"})); ok {
			t.Errorf("kind %d: ReferenceLookups says rule 5 decides it", kind)
		}
	}
}
