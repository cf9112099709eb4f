package fetcher

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"syscall"
	"testing"
	"time"

	"github.com/nbd-wtf/go-nostr"

	graspv1 "github.com/grasp-sync/grasp-sync/proto/grasp/v1"

	"github.com/grasp-sync/grasp-sync/pkg/clock"
	"github.com/grasp-sync/grasp-sync/pkg/relayconn"
)

func TestBackoffSchedule(t *testing.T) {
	for n, want := range map[int]time.Duration{1: 5 * time.Second, 2: 10 * time.Second, 3: 20 * time.Second,
		10: 2560 * time.Second, 11: time.Hour, 50: time.Hour} {
		if got := Backoff(5*time.Second, time.Hour, n); got != want {
			t.Errorf("attempt %d: %s, want %s", n, got, want)
		}
	}
}

// The health schedule over a day of failures: backing off, hourly after
// the cap, Dead after 24 h with one retry a day; a stable session resets.
func TestRelayHealth(t *testing.T) {
	start := time.Unix(0, 0)
	h := RelayHealth{Policy: DefaultHealthPolicy()}
	now := start
	var d time.Duration
	var st graspv1.HealthState
	for now.Sub(start) < 24*time.Hour {
		d, st = h.Failed(now)
		if st != graspv1.HealthState_HEALTH_STATE_BACKING_OFF || d > time.Hour {
			t.Fatalf("at %s: %s %s", now.Sub(start), st, d)
		}
		now = now.Add(d)
	}
	d, st = h.Failed(now)
	if st != graspv1.HealthState_HEALTH_STATE_DEAD || d != 24*time.Hour {
		t.Fatalf("after a day: %s, retry in %s", st, d)
	}
	// A short-lived session does not end the streak…
	h.Connected(now)
	if _, st = h.Failed(now.Add(time.Second)); st != graspv1.HealthState_HEALTH_STATE_DEAD {
		t.Fatalf("flapping relay: %s", st)
	}
	// …a stable one does.
	h.Connected(now)
	if d, st = h.Failed(now.Add(2 * time.Minute)); st != graspv1.HealthState_HEALTH_STATE_BACKING_OFF || d != 5*time.Second || h.Failures != 1 {
		t.Fatalf("after a stable session: %s %s (%d failures)", st, d, h.Failures)
	}
}

func TestClassifyFailure(t *testing.T) {
	for want, err := range map[string]error{
		ClassDNS:            &relayconn.DialError{URL: "wss://x", Err: &net.DNSError{Err: "no such host", Name: "x"}},
		ClassTLS:            &relayconn.DialError{URL: "wss://x", Err: tls.RecordHeaderError{Msg: "bad"}},
		ClassRefused:        &relayconn.DialError{URL: "wss://x", Err: &net.OpError{Op: "dial", Err: syscall.ECONNREFUSED}},
		ClassTimeout:        &relayconn.DialError{URL: "wss://x", Err: context.DeadlineExceeded},
		ClassHTTPStatus:     &relayconn.DialError{URL: "wss://x", StatusCode: 503, Err: errors.New("expected 101")},
		ClassAddressRefused: fmt.Errorf("%w: 10.0.0.1", errAddressRefused),
		ClassClosed:         fmt.Errorf("read: %w", net.ErrClosed),
		ClassProtocol:       errors.New("read limited at 100001 bytes"),
	} {
		if got := ClassifyFailure(err); got != want {
			t.Errorf("%v: %s, want %s", err, got, want)
		}
	}
	if got := ClassifyFailure(fmt.Errorf("x: %w", relayconn.ErrDead)); got != ClassTimeout {
		t.Errorf("dead connection: %s", got)
	}
}

func TestLogLimiter(t *testing.T) {
	l := logLimiter{window: 12 * time.Hour}
	t0 := time.Unix(0, 0)
	if !l.allow("dns", t0) || l.allow("dns", t0.Add(time.Hour)) || !l.allow("tls", t0.Add(time.Hour)) || !l.allow("dns", t0.Add(12*time.Hour)) {
		t.Fatal("want once per class per 12 h")
	}
}

func TestIsRateLimit(t *testing.T) {
	for msg, want := range map[string]bool{
		"rate-limited: slow down": true,
		// A refusal of a budget is learned, never a cooldown (limits.go).
		"ERROR: too many concurrent REQs":      false,
		"ERROR: bad req: arr too big":          false,
		"too many requests, try later":         true,
		"you are being throttled":              true,
		"Rate limit exceeded":                  true,
		"please slow down":                     true,
		"blocked: not allowed":                 false,
		"auth-required: please authenticate":   false,
		"error: could not connect to database": false,
	} {
		if got := IsRateLimit(msg); got != want {
			t.Errorf("%q: %v, want %v", msg, got, want)
		}
	}
}

// Cooldowns last 65 s, double when the relay complains again right after
// one ends, and start over after a quiet period; Wait blocks only until the
// end.
func TestCooldown(t *testing.T) {
	clk := clock.NewFake(time.Unix(0, 0))
	c := &Cooldown{Base: 65 * time.Second, Max: time.Hour, Clock: clk}
	until, started := c.Trigger()
	if !started || until.Sub(clk.Now()) != 65*time.Second {
		t.Fatalf("first: %v %s", started, until.Sub(clk.Now()))
	}
	if _, again := c.Trigger(); again {
		t.Fatal("a signal during a cooldown started another")
	}
	waited := make(chan error, 1)
	go func() { waited <- c.Wait(context.Background()) }()
	for clk.Waiters() == 0 {
		time.Sleep(time.Millisecond)
	}
	select {
	case <-waited:
		t.Fatal("Wait returned during the cooldown")
	default:
	}
	clk.Advance(65 * time.Second)
	if err := <-waited; err != nil {
		t.Fatal(err)
	}
	clk.Advance(10 * time.Second)
	if until, _ := c.Trigger(); until.Sub(clk.Now()) != 130*time.Second {
		t.Fatalf("repeat: %s, want doubled", until.Sub(clk.Now()))
	}
	clk.Advance(time.Hour)
	if until, _ := c.Trigger(); until.Sub(clk.Now()) != 65*time.Second {
		t.Fatalf("after quiet: %s", until.Sub(clk.Now()))
	}
}

func TestCheckEvent(t *testing.T) {
	sk := nostr.GeneratePrivateKey()
	good := func() *nostr.Event {
		e := &nostr.Event{Kind: 1, Content: "hi", CreatedAt: 100, Tags: nostr.Tags{{"t", "x"}}}
		if err := e.Sign(sk); err != nil {
			t.Fatal(err)
		}
		return e
	}
	f := nostr.Filters{{Kinds: []int{1}}}
	cases := map[string]struct {
		evt  func() *nostr.Event
		want string
	}{
		"good":         {good, ""},
		"bad sig kept": {func() *nostr.Event { e := good(); e.Sig = e.Sig[:126] + "00"; return e }, ""},
		"tampered":     {func() *nostr.Event { e := good(); e.Content = "changed"; return e }, DropBadID},
		"short pubkey": {func() *nostr.Event { e := good(); e.PubKey = "ab"; return e }, DropShape},
		"upper-hex id": {func() *nostr.Event { e := good(); e.ID = "A" + e.ID[1:]; return e }, DropShape},
		"empty tag":    {func() *nostr.Event { e := good(); e.Tags = nostr.Tags{{}}; return e }, DropShape},
		"not requested": {func() *nostr.Event {
			e := &nostr.Event{Kind: 7, CreatedAt: 1, Tags: nostr.Tags{}}
			_ = e.Sign(sk)
			return e
		}, DropNoMatch},
	}
	for name, c := range cases {
		if got := CheckEvent(c.evt(), f); got != c.want {
			t.Errorf("%s: %q, want %q", name, got, c.want)
		}
	}
}
