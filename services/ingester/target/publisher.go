package target

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nbd-wtf/go-nostr"
	"github.com/nbd-wtf/go-nostr/nip42"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/tidwall/gjson"

	"github.com/grasp-sync/grasp-sync/pkg/clock"
	"github.com/grasp-sync/grasp-sync/pkg/config"
	"github.com/grasp-sync/grasp-sync/pkg/relayconn"
	"github.com/grasp-sync/grasp-sync/pkg/store"
	"github.com/grasp-sync/grasp-sync/pkg/targetstatus"
)

// ErrUnavailable marks a publish that did not get a definitive answer for
// a reason that is the target's state, not the event's: the connection is
// down or was lost, the OK did not come in time, the target asked us to slow
// down ("rate-limited:") or to authenticate without a key to do so, or our
// own publish rate has no token left. The ingester holds such events (no
// redelivery count, no dead letter) and tries again when Reachable says so.
var ErrUnavailable = errors.New("target relay unavailable")

// Outcome is a definitive answer of the target to one event.
type Outcome int

const (
	// Written: OK true.
	Written Outcome = iota + 1
	// Duplicate: OK false "duplicate:", the target holds the event already.
	Duplicate
)

// RefusedError is the target's definitive refusal of one event, with its
// reason. It wraps store.ErrUnstorable: the event was accepted by our policy
// but cannot be stored where we store, so it is settled (acked) and not
// retried blindly.
type RefusedError struct {
	Target, Reason string
}

// Error says who refused and why.
func (e *RefusedError) Error() string {
	return fmt.Sprintf("target %s refused: %s", e.Target, e.Reason)
}

// Unwrap makes errors.Is(err, store.ErrUnstorable) hold.
func (e *RefusedError) Unwrap() error { return store.ErrUnstorable }

// answer is the target's OK to one event id.
type answer struct {
	ok     bool
	reason string
}

// errAuthRequired is an "auth-required:" answer while we hold a key: the
// publish authenticates and tries once more.
var errAuthRequired = errors.New("auth-required")

// maxTokenWait is the longest a publish waits inline for a token of the
// publish rate; a longer wait returns ErrUnavailable and the ingester holds
// the event instead (keeping its message alive) until Reachable.
const maxTokenWait = time.Second

// backoffStart is the first pause after a "rate-limited:" answer or a failed
// connection.
const backoffStart = time.Second

// Publisher publishes events to the target relay over one connection and
// waits for each OK. Safe for concurrent use.
type Publisher struct {
	cfg     Settings
	sk, pk  string
	clk     clock.Clock
	log     *slog.Logger
	m       *metrics
	sem     chan struct{}
	backlog atomic.Int64

	mu      sync.Mutex
	conn    *relayconn.Conn
	waiters map[string][]chan answer
	// authed is closed once the current connection's AUTH was accepted;
	// authing is set while one is being answered.
	authed  chan struct{}
	authing bool
	// tokens and refilled are the token bucket of the publish rate.
	tokens   float64
	refilled time.Time
	// pause and pauseUntil are the backoff after "rate-limited:" answers
	// and failed connections; a success halves pause.
	pause      time.Duration
	pauseUntil time.Time
	why        string
	lastRefuse string
	rate       rateMeter
	warnedAuth bool
}

// NewPublisher builds a publisher for cfg (Validate it first). reg may be
// nil; clk paces the publish rate, the backoff and the OK timeout.
func NewPublisher(cfg Settings, clk clock.Clock, log *slog.Logger, reg prometheus.Registerer) *Publisher {
	cfg = cfg.withDefaults()
	p := &Publisher{
		cfg: cfg, clk: clk, log: log.With("target", cfg.Relay),
		sem:     make(chan struct{}, cfg.PublishConcurrency),
		waiters: map[string][]chan answer{},
		tokens:  float64(cfg.PublishBurst), refilled: clk.Now(),
		rate: rateMeter{start: clk.Now()},
	}
	if cfg.AuthKey != "" {
		p.sk, _ = config.SecretKey(cfg.AuthKey)
		p.pk, _ = nostr.GetPublicKey(p.sk)
	}
	p.m = newMetrics(p, reg)
	return p
}

// URL is the target relay's URL.
func (p *Publisher) URL() string { return p.cfg.Relay }

// SetBacklog records how many events wait to be written (the ingester's
// consumer lag), for the expected time in Status and the metrics.
func (p *Publisher) SetBacklog(n int64) { p.backlog.Store(n) }

// Publish sends evt to the target and waits for its answer. A definitive
// answer is an Outcome (written or duplicate) or a *RefusedError; any other
// error wraps ErrUnavailable (hold and retry when Reachable) or is a
// transient failure of this event ("error:" answers), retried like a store
// error.
func (p *Publisher) Publish(ctx context.Context, evt *nostr.Event) (Outcome, error) {
	for attempt := 0; ; attempt++ {
		select {
		case p.sem <- struct{}{}:
		case <-ctx.Done():
			return 0, ctx.Err()
		}
		out, err := p.publishOnce(ctx, evt)
		<-p.sem
		if errors.Is(err, errAuthRequired) && attempt == 0 {
			if err := p.waitAuth(ctx); err != nil {
				return 0, err
			}
			continue
		}
		return out, err
	}
}

func (p *Publisher) publishOnce(ctx context.Context, evt *nostr.Event) (Outcome, error) {
	if err := p.take(ctx); err != nil {
		return 0, err
	}
	conn, err := p.connect(ctx)
	if err != nil {
		return 0, err
	}
	// An AUTH being answered (the target challenged at connect): send the
	// EVENT after it, so the target sees it authenticated rather than
	// refusing it "auth-required:" (which costs a token of its limit).
	p.mu.Lock()
	authing, authed := p.authing, p.authed
	p.mu.Unlock()
	if authing {
		select {
		case <-authed:
		case <-conn.Context().Done():
		case <-p.clk.After(p.cfg.Timeout):
		case <-ctx.Done():
			return 0, ctx.Err()
		}
	}
	ch := make(chan answer, 1)
	p.mu.Lock()
	p.waiters[evt.ID] = append(p.waiters[evt.ID], ch)
	p.mu.Unlock()
	defer p.forget(evt.ID, ch)
	start := p.clk.Now()
	p.m.inFlight.Inc()
	defer p.m.inFlight.Dec()
	if err := conn.Write(ctx, []any{"EVENT", evt}); err != nil {
		p.drop(conn, "write failed")
		return 0, fmt.Errorf("%w: send %s: %v", ErrUnavailable, evt.ID, err)
	}
	var a answer
	select {
	case a = <-ch:
	case <-conn.Context().Done():
		p.m.answer("lost")
		p.drop(conn, "connection lost")
		return 0, fmt.Errorf("%w: connection lost waiting for the OK to %s: %v", ErrUnavailable, evt.ID, context.Cause(conn.Context()))
	case <-p.clk.After(p.cfg.Timeout):
		p.m.answer("timeout")
		p.drop(conn, "no OK in time")
		return 0, fmt.Errorf("%w: no OK to %s within %s", ErrUnavailable, evt.ID, p.cfg.Timeout)
	case <-ctx.Done():
		return 0, ctx.Err()
	}
	p.m.latency.Observe(p.clk.Now().Sub(start).Seconds())
	return p.classify(evt, a)
}

// classify turns the target's OK into an outcome (NIP-01 machine-readable
// prefixes).
func (p *Publisher) classify(evt *nostr.Event, a answer) (Outcome, error) {
	prefix, _, _ := strings.Cut(a.reason, ":")
	switch {
	case prefix == "duplicate":
		// Either OK value: khatru answers true, NIP-01 shows false.
		p.m.answer("duplicate")
		p.succeeded()
		return Duplicate, nil
	case a.ok:
		p.m.answer("ok")
		p.succeeded()
		return Written, nil
	case prefix == "rate-limited":
		p.m.answer("rate_limited")
		d := p.backoff("rate-limited: " + a.reason)
		p.log.Info("target asks us to slow down: pausing", "id", evt.ID, "reason", a.reason, "pause", d)
		return 0, fmt.Errorf("%w: %s", ErrUnavailable, a.reason)
	case prefix == "auth-required":
		p.m.answer("auth_required")
		if p.sk != "" {
			return 0, errAuthRequired
		}
		p.mu.Lock()
		warn := !p.warnedAuth
		p.warnedAuth = true
		p.mu.Unlock()
		if warn {
			p.log.Warn("target requires NIP-42 authentication to write and GRASP_TARGET_AUTH_KEY is not set: holding events", "reason", a.reason)
		}
		p.backoff("auth-required without GRASP_TARGET_AUTH_KEY")
		return 0, fmt.Errorf("%w: %s", ErrUnavailable, a.reason)
	case prefix == "error":
		p.m.answer("error")
		return 0, fmt.Errorf("target %s failed to store %s: %s", p.cfg.Relay, evt.ID, a.reason)
	default:
		p.m.answer("refused")
		p.mu.Lock()
		p.lastRefuse = a.reason
		p.mu.Unlock()
		return 0, &RefusedError{Target: p.cfg.Relay, Reason: a.reason}
	}
}

// take takes a token of the publish rate, waiting up to maxTokenWait.
func (p *Publisher) take(ctx context.Context) error {
	for {
		p.mu.Lock()
		now := p.clk.Now()
		if err := p.pausedAt(now); err != nil {
			p.mu.Unlock()
			return err
		}
		p.refill(now)
		if p.tokens >= 1 {
			p.tokens--
			p.mu.Unlock()
			return nil
		}
		wait := p.untilToken()
		p.mu.Unlock()
		if wait > maxTokenWait {
			return fmt.Errorf("%w: publish rate %.4g/s: next event in %s", ErrUnavailable, p.cfg.PublishRate, wait.Round(time.Millisecond))
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-p.clk.After(wait):
		}
	}
}

// pausedAt is the error of a publish at now while publishing is paused
// (after rate-limited: or a lost target), nil otherwise (mu held).
func (p *Publisher) pausedAt(now time.Time) error {
	if !now.Before(p.pauseUntil) {
		return nil
	}
	return fmt.Errorf("%w: paused for %s (%s)", ErrUnavailable, p.pauseUntil.Sub(now).Round(time.Millisecond), p.why)
}

// refill adds the tokens earned since the last refill (mu held).
func (p *Publisher) refill(now time.Time) {
	if el := now.Sub(p.refilled); el > 0 {
		p.tokens = min(float64(p.cfg.PublishBurst), p.tokens+el.Seconds()*p.cfg.PublishRate)
		p.refilled = now
	}
}

// untilToken is how long until the bucket holds a whole token (mu held).
func (p *Publisher) untilToken() time.Duration {
	if p.tokens >= 1 {
		return 0
	}
	return time.Duration((1 - p.tokens) / p.cfg.PublishRate * float64(time.Second))
}

// Reachable reports why a publish now would not be tried (nil: it would):
// a pause, an empty publish rate bucket, or a target that cannot be
// connected to. The ingester asks it before holding or retrying events.
func (p *Publisher) Reachable(ctx context.Context) error {
	p.mu.Lock()
	now := p.clk.Now()
	if err := p.pausedAt(now); err != nil {
		p.mu.Unlock()
		return err
	}
	p.refill(now)
	wait := p.untilToken()
	p.mu.Unlock()
	if wait > maxTokenWait {
		return fmt.Errorf("%w: publish rate %.4g/s: next event in %s", ErrUnavailable, p.cfg.PublishRate, wait.Round(time.Millisecond))
	}
	_, err := p.connect(ctx)
	return err
}

// backoff starts (or doubles) the pause; it returns its length.
func (p *Publisher) backoff(why string) time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.pause = min(max(2*p.pause, backoffStart), p.cfg.BackoffMax)
	p.pauseUntil = p.clk.Now().Add(p.pause)
	p.why = why
	p.tokens = 0
	p.refilled = p.clk.Now()
	return p.pause
}

// succeeded halves the pause: a target that limits us keeps being probed
// near the rate it allows instead of starting from 1 s again.
func (p *Publisher) succeeded() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.pause /= 2
	if p.pause < backoffStart {
		p.pause = 0
	}
	p.rate.add(p.clk.Now())
}

// connect returns the live connection, dialling one if needed.
func (p *Publisher) connect(ctx context.Context) (*relayconn.Conn, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.conn != nil && p.conn.Context().Err() == nil {
		return p.conn, nil
	}
	if now := p.clk.Now(); now.Before(p.pauseUntil) {
		return nil, fmt.Errorf("%w: paused for %s (%s)", ErrUnavailable, p.pauseUntil.Sub(now).Round(time.Millisecond), p.why)
	}
	dctx, cancel := context.WithTimeout(ctx, p.cfg.Timeout)
	defer cancel()
	// onMessage takes mu, held here until p.conn is set: a challenge sent
	// at once waits for it.
	conn, err := relayconn.Dial(dctx, p.cfg.Relay, relayconn.Options{OnMessage: p.onMessage})
	if err != nil {
		p.pause = min(max(2*p.pause, backoffStart), p.cfg.BackoffMax)
		p.pauseUntil = p.clk.Now().Add(p.pause)
		p.why = "cannot connect"
		p.m.connected.Set(0)
		p.log.Warn("cannot connect to the target relay: holding events", "err", err, "retry_in", p.pause)
		return nil, fmt.Errorf("%w: %v", ErrUnavailable, err)
	}
	p.conn, p.authed, p.authing = conn, make(chan struct{}), false
	p.m.connected.Set(1)
	p.log.Info("connected to the target relay")
	return conn, nil
}

// drop closes a connection that failed (a later publish dials again).
func (p *Publisher) drop(conn *relayconn.Conn, why string) {
	p.mu.Lock()
	if p.conn == conn {
		p.conn = nil
		p.m.connected.Set(0)
		p.log.Warn("dropping the target connection", "why", why)
	}
	p.mu.Unlock()
	_ = conn.Close()
}

// onMessage receives OK and AUTH messages (on the read goroutine).
func (p *Publisher) onMessage(label string, raw []byte) {
	switch label {
	case "OK":
		id := gjson.GetBytes(raw, "1").String()
		a := answer{ok: gjson.GetBytes(raw, "2").Bool(), reason: gjson.GetBytes(raw, "3").String()}
		p.mu.Lock()
		for _, ch := range p.waiters[id] {
			select {
			case ch <- a:
			default:
			}
		}
		p.mu.Unlock()
	case "AUTH":
		if p.sk == "" {
			return
		}
		challenge := gjson.GetBytes(raw, "1").String()
		p.mu.Lock()
		conn := p.conn
		if p.authing || conn == nil {
			p.mu.Unlock()
			return
		}
		p.authing = true
		authed := p.authed
		p.mu.Unlock()
		go p.authenticate(conn, challenge, authed)
	}
}

// authenticate answers a NIP-42 challenge and closes authed when the
// target accepts.
func (p *Publisher) authenticate(conn *relayconn.Conn, challenge string, authed chan struct{}) {
	defer func() {
		p.mu.Lock()
		p.authing = false
		p.mu.Unlock()
	}()
	evt := nip42.CreateUnsignedAuthEvent(challenge, p.pk, p.cfg.Relay)
	if err := evt.Sign(p.sk); err != nil {
		p.log.Error("sign AUTH event", "err", err)
		return
	}
	ch := make(chan answer, 1)
	p.mu.Lock()
	p.waiters[evt.ID] = append(p.waiters[evt.ID], ch)
	p.mu.Unlock()
	defer p.forget(evt.ID, ch)
	ctx := conn.Context()
	if err := conn.Write(ctx, []any{"AUTH", evt}); err != nil {
		return
	}
	select {
	case a := <-ch:
		if a.ok {
			close(authed)
			p.log.Info("authenticated to the target relay with NIP-42", "pubkey", p.pk)
		} else {
			p.log.Warn("the target relay refused our AUTH", "reason", a.reason)
		}
	case <-ctx.Done():
	case <-p.clk.After(p.cfg.Timeout):
		p.log.Warn("no answer to our AUTH")
	}
}

// waitAuth waits (up to Timeout) for the current connection's AUTH.
func (p *Publisher) waitAuth(ctx context.Context) error {
	p.mu.Lock()
	authed, conn := p.authed, p.conn
	p.mu.Unlock()
	if conn == nil {
		return fmt.Errorf("%w: not connected", ErrUnavailable)
	}
	select {
	case <-authed:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-conn.Context().Done():
		return fmt.Errorf("%w: connection lost while authenticating", ErrUnavailable)
	case <-p.clk.After(p.cfg.Timeout):
		p.backoff("NIP-42 authentication did not complete")
		return fmt.Errorf("%w: the target asked for NIP-42 authentication and did not accept ours", ErrUnavailable)
	}
}

func (p *Publisher) forget(id string, ch chan answer) {
	p.mu.Lock()
	defer p.mu.Unlock()
	ws := p.waiters[id]
	for i, w := range ws {
		if w == ch {
			ws = append(ws[:i], ws[i+1:]...)
			break
		}
	}
	if len(ws) == 0 {
		delete(p.waiters, id)
	} else {
		p.waiters[id] = ws
	}
}

// Close closes the connection.
func (p *Publisher) Close() {
	p.mu.Lock()
	conn := p.conn
	p.conn = nil
	p.mu.Unlock()
	if conn != nil {
		_ = conn.Close()
	}
}

// Status is how publishing stands, for the status page and graspctl.
func (p *Publisher) Status() targetstatus.Status {
	p.mu.Lock()
	now := p.clk.Now()
	connected := p.conn != nil && p.conn.Context().Err() == nil
	var paused time.Duration
	if now.Before(p.pauseUntil) {
		paused = p.pauseUntil.Sub(now)
	}
	last := p.lastRefuse
	rate := p.rate.perSecond(now)
	p.mu.Unlock()
	t := targetstatus.Status{
		URL: p.cfg.Relay, Connected: connected,
		Rate: p.cfg.PublishRate, Burst: p.cfg.PublishBurst, Concurrency: p.cfg.PublishConcurrency,
		Written: p.m.count("ok"), Duplicates: p.m.count("duplicate"), Refused: p.m.count("refused"), RateLimited: p.m.count("rate_limited"),
		WriteRate: rate, Backlog: p.backlog.Load(), Paused: paused, LastRefusal: last,
	}
	t.ETA = eta(t.Backlog, rate, p.cfg.PublishRate)
	return t
}

// eta is the time a backlog needs at the measured rate, or the configured
// one before anything was measured (never faster than configured).
func eta(backlog int64, measured, configured float64) time.Duration {
	if backlog <= 0 {
		return 0
	}
	r := configured
	if measured > 0 && measured < r {
		r = measured
	}
	return time.Duration(float64(backlog) / r * float64(time.Second))
}

// rateMeter measures events per second over windows of about a minute.
type rateMeter struct {
	start time.Time
	n     int64
	last  float64
}

const rateWindow = time.Minute

func (r *rateMeter) add(now time.Time) {
	r.roll(now)
	r.n++
}

func (r *rateMeter) roll(now time.Time) {
	if el := now.Sub(r.start); el >= rateWindow {
		r.last = float64(r.n) / el.Seconds()
		r.start, r.n = now, 0
	}
}

// perSecond is the last whole window's rate, or the current window's once
// it is a few seconds old and nothing whole was measured yet.
func (r *rateMeter) perSecond(now time.Time) float64 {
	r.roll(now)
	if r.last > 0 {
		return r.last
	}
	if el := now.Sub(r.start); el >= 5*time.Second {
		return float64(r.n) / el.Seconds()
	}
	return 0
}
