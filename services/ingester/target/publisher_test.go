package target

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fiatjaf/khatru"
	"github.com/nbd-wtf/go-nostr"

	"github.com/grasp-sync/grasp-sync/pkg/clock"
	"github.com/grasp-sync/grasp-sync/pkg/store"
	"github.com/grasp-sync/grasp-sync/pkg/testkit"
	"github.com/grasp-sync/grasp-sync/pkg/testkit/testrelay"
)

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// newPublisher returns a publisher to url on a fake clock.
func newPublisher(t *testing.T, s Settings) (*Publisher, *clock.Fake) {
	t.Helper()
	clk := clock.NewFake(time.Unix(1_800_000_000, 0))
	p := NewPublisher(s, clk, quiet(), nil)
	t.Cleanup(p.Close)
	return p, clk
}

func has(t *testing.T, r *testrelay.Relay, id string) bool {
	t.Helper()
	ok, err := r.Has(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	return ok
}

// The three definitive answers: written, duplicate (stored already) and a
// refusal carrying the target's reason.
func TestPublishAnswers(t *testing.T) {
	ctx := testCtx(t)
	r := testrelay.Start(t, testrelay.Options{})
	r.Khatru.RejectEvent = append(r.Khatru.RejectEvent, func(_ context.Context, e *nostr.Event) (bool, string) {
		if e.Kind == 1 {
			return true, "blocked: only NIP-34 events here"
		}
		return false, ""
	})
	p, _ := newPublisher(t, Settings{Relay: r.URL})
	k := testkit.NewKey()
	issue := k.Issue(testkit.RepoRef(k.PubKey, "r"), "hello")

	if out, err := p.Publish(ctx, issue); err != nil || out != Written {
		t.Fatalf("first publish: %v, %v; want written", out, err)
	}
	if !has(t, r, issue.ID) {
		t.Fatal("the target does not hold the event it said OK to")
	}
	// khatru answers a duplicate with a bare OK true; NIP-01 relays say
	// "duplicate:" (either OK value): both are stored.
	if out, err := p.Publish(ctx, issue); err != nil || out == 0 {
		t.Fatalf("second publish: %v, %v; want stored", out, err)
	}
	for _, a := range []answer{{false, "duplicate: have it"}, {true, "duplicate: already have this event"}} {
		if out, err := p.classify(issue, a); err != nil || out != Duplicate {
			t.Fatalf("answer %+v: %v, %v; want duplicate", a, out, err)
		}
	}
	_, err := p.Publish(ctx, k.Note("not for a GRASP relay"))
	var re *RefusedError
	if !errors.As(err, &re) || !strings.Contains(re.Reason, "only NIP-34") || !errors.Is(err, store.ErrUnstorable) {
		t.Fatalf("refused publish: %v; want a RefusedError with the target's reason, an ErrUnstorable", err)
	}
	st := p.Status()
	if st.Written+st.Duplicates != 4 || st.Duplicates < 2 || st.Refused != 1 || st.LastRefusal != "blocked: only NIP-34 events here" {
		t.Fatalf("status %+v", st)
	}
}

// A "rate-limited:" answer pauses publishing (nothing is sent during the
// pause), a second one doubles the pause, and publishing resumes after it.
func TestRateLimitedPausesThenResumes(t *testing.T) {
	ctx := testCtx(t)
	r := testrelay.Start(t, testrelay.Options{})
	var limited atomic.Bool
	var attempts atomic.Int64
	r.Khatru.RejectEvent = append(r.Khatru.RejectEvent, func(context.Context, *nostr.Event) (bool, string) {
		attempts.Add(1)
		if limited.Load() {
			return true, "rate-limited: slow down"
		}
		return false, ""
	})
	p, clk := newPublisher(t, Settings{Relay: r.URL})
	k := testkit.NewKey()
	ref := testkit.RepoRef(k.PubKey, "r")

	limited.Store(true)
	e1 := k.Issue(ref, "one")
	if _, err := p.Publish(ctx, e1); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("publish while limited: %v; want ErrUnavailable", err)
	}
	if err := p.Reachable(ctx); err == nil || !strings.Contains(err.Error(), "paused") {
		t.Fatalf("Reachable during the pause: %v", err)
	}
	before := attempts.Load()
	if _, err := p.Publish(ctx, e1); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("publish during the pause: %v", err)
	}
	if attempts.Load() != before {
		t.Fatal("an event was sent during the pause")
	}
	clk.Advance(backoffStart)
	if _, err := p.Publish(ctx, e1); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("publish while still limited: %v", err)
	}
	if got := p.Status().Paused; got != 2*backoffStart {
		t.Fatalf("second pause %s, want %s (doubled)", got, 2*backoffStart)
	}
	limited.Store(false)
	clk.Advance(2 * backoffStart)
	if err := p.Reachable(ctx); err != nil {
		t.Fatalf("Reachable after the pause: %v", err)
	}
	if out, err := p.Publish(ctx, e1); err != nil || out != Written {
		t.Fatalf("publish after the pause: %v, %v", out, err)
	}
	if st := p.Status(); st.RateLimited != 2 || st.Written != 1 {
		t.Fatalf("status %+v", st)
	}
}

// Our own publish rate: a burst, then an event per 1/rate; a wait longer
// than maxTokenWait is not waited inline but reported as unavailable.
func TestPublishRateAndBurst(t *testing.T) {
	ctx := testCtx(t)
	r := testrelay.Start(t, testrelay.Options{})
	p, clk := newPublisher(t, Settings{Relay: r.URL, PublishRate: 0.1, PublishBurst: 2})
	k := testkit.NewKey()
	ref := testkit.RepoRef(k.PubKey, "r")
	for i := range 2 {
		if _, err := p.Publish(ctx, k.Issue(ref, "burst "+string(rune('a'+i)))); err != nil {
			t.Fatalf("publish %d of the burst: %v", i, err)
		}
	}
	third := k.Issue(ref, "third")
	if _, err := p.Publish(ctx, third); !errors.Is(err, ErrUnavailable) || !strings.Contains(err.Error(), "publish rate") {
		t.Fatalf("publish past the burst: %v; want the rate's ErrUnavailable", err)
	}
	if has(t, r, third.ID) {
		t.Fatal("the event past the burst was sent")
	}
	clk.Advance(10 * time.Second)
	if _, err := p.Publish(ctx, third); err != nil {
		t.Fatalf("publish after 1/rate: %v", err)
	}
}

// A target that asks for NIP-42 gets our AUTH with the configured key and
// then takes the event; without a key the event is held, not refused.
func TestAuthRequired(t *testing.T) {
	ctx := testCtx(t)
	r := testrelay.Start(t, testrelay.Options{})
	r.Khatru.ServiceURL = r.URL
	r.Khatru.RejectEvent = append(r.Khatru.RejectEvent, func(ctx context.Context, e *nostr.Event) (bool, string) {
		if khatru.GetAuthed(ctx) == "" {
			return true, "auth-required: authenticate to write"
		}
		return false, ""
	})
	k := testkit.NewKey()
	evt := k.Issue(testkit.RepoRef(k.PubKey, "r"), "hello")

	anon, _ := newPublisher(t, Settings{Relay: r.URL})
	if _, err := anon.Publish(ctx, evt); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("publish without a key: %v; want ErrUnavailable (held)", err)
	}
	sk := testkit.NewKey()
	authed, _ := newPublisher(t, Settings{Relay: r.URL, AuthKey: sk.Secret})
	if out, err := authed.Publish(ctx, evt); err != nil || out != Written {
		t.Fatalf("publish with a key: %v, %v", out, err)
	}
	if !has(t, r, evt.ID) {
		t.Fatal("the target does not hold the event")
	}
}

// A target that went away: held (ErrUnavailable), with a pause before the
// next dial.
func TestTargetGone(t *testing.T) {
	ctx := testCtx(t)
	r := testrelay.Start(t, testrelay.Options{})
	p, _ := newPublisher(t, Settings{Relay: r.URL})
	k := testkit.NewKey()
	if _, err := p.Publish(ctx, k.Issue(testkit.RepoRef(k.PubKey, "r"), "one")); err != nil {
		t.Fatal(err)
	}
	r.Close()
	if _, err := p.Publish(ctx, k.Issue(testkit.RepoRef(k.PubKey, "r"), "two")); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("publish to a closed target: %v; want ErrUnavailable", err)
	}
	if err := p.Reachable(ctx); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("Reachable: %v", err)
	}
}

// Store: what the target took is mirrored, in one batch; what it refused
// is neither mirrored nor retried.
func TestStoreMirrorsWhatTheTargetTook(t *testing.T) {
	ctx := testCtx(t)
	r := testrelay.Start(t, testrelay.Options{})
	r.Khatru.RejectEvent = append(r.Khatru.RejectEvent, func(_ context.Context, e *nostr.Event) (bool, string) {
		if e.Kind == 1 {
			return true, "blocked: no notes"
		}
		return false, ""
	})
	mirror, err := store.Open(filepath.Join(t.TempDir(), "mirror"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { mirror.Close() })
	p, _ := newPublisher(t, Settings{Relay: r.URL, PublishConcurrency: 2})
	s := &Store{Mirror: mirror, Pub: p}
	k := testkit.NewKey()
	ref := testkit.RepoRef(k.PubKey, "r")
	evts := []*nostr.Event{k.Issue(ref, "a"), k.Note("refused"), k.Issue(ref, "b"), k.Issue(ref, "c")}
	res := s.SaveBatch(ctx, evts)
	for n, e := range evts {
		inMirror, err := mirror.Query(ctx, nostr.Filter{IDs: []string{e.ID}})
		if err != nil {
			t.Fatal(err)
		}
		if e.Kind == 1 {
			var re *RefusedError
			if !errors.As(res[n].Err, &re) || len(inMirror) != 0 || has(t, r, e.ID) {
				t.Fatalf("refused event: result %+v, mirrored %d", res[n], len(inMirror))
			}
			continue
		}
		if res[n].Err != nil || !res[n].Stored || len(inMirror) != 1 || !has(t, r, e.ID) {
			t.Fatalf("event %d: result %+v, mirrored %d", n, res[n], len(inMirror))
		}
	}
}

// An event of a batch is sent after the events of the batch it references:
// a comment never overtakes its root, nor an issue its announcement.
func TestDependenciesWithinBatch(t *testing.T) {
	k := testkit.NewKey()
	ann := k.Announcement("r", nil, nil, nil)
	ref := testkit.RepoRef(k.PubKey, "r")
	issue := k.Issue(ref, "root")
	comment := k.Comment(issue, issue, "on it")
	other := k.Issue(testkit.RepoRef(k.PubKey, "elsewhere"), "unrelated")
	deps := dependencies([]*nostr.Event{ann, issue, other, comment})
	if len(deps[0]) != 0 || !slices.Equal(deps[1], []int{0}) || len(deps[2]) != 0 || !slices.Contains(deps[3], 1) {
		t.Fatalf("dependencies %v", deps)
	}
}

// An event whose batch-mate it references could not be published now is
// held with it, not sent ahead (where a strict target would refuse it).
func TestDependentHeldWithItsRoot(t *testing.T) {
	ctx := testCtx(t)
	r := testrelay.Start(t, testrelay.Options{})
	k := testkit.NewKey()
	ref := testkit.RepoRef(k.PubKey, "r")
	issue := k.Issue(ref, "root")
	comment := k.Comment(issue, issue, "on it")
	r.Khatru.RejectEvent = append(r.Khatru.RejectEvent, func(_ context.Context, e *nostr.Event) (bool, string) {
		if e.ID == issue.ID {
			return true, "rate-limited: slow down"
		}
		return false, ""
	})
	mirror, err := store.Open(filepath.Join(t.TempDir(), "mirror"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { mirror.Close() })
	p, _ := newPublisher(t, Settings{Relay: r.URL, PublishConcurrency: 4})
	res := (&Store{Mirror: mirror, Pub: p}).SaveBatch(ctx, []*nostr.Event{issue, comment})
	if !errors.Is(res[0].Err, ErrUnavailable) || !errors.Is(res[1].Err, ErrUnavailable) {
		t.Fatalf("results %+v: want both held (ErrUnavailable)", res)
	}
	if has(t, r, comment.ID) {
		t.Fatal("the comment was sent ahead of its root")
	}
}
