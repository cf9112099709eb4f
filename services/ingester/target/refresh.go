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
	"github.com/grasp-sync/grasp-sync/pkg/negsync"
	"github.com/grasp-sync/grasp-sync/pkg/nip34"
	"github.com/grasp-sync/grasp-sync/pkg/relayconn"
	"github.com/grasp-sync/grasp-sync/pkg/store"
	"github.com/grasp-sync/grasp-sync/pkg/verify"
)

// MirrorKinds are the kinds a mirror refresh reconciles: what sync fetches
// (docs/sync.md, "Filters") — announcements, states, user grasp lists,
// patches, pull requests and their updates, issues, NIP-34 statuses
// (1630-1633) and NIP-22 comments. Deletions (kind 5) are left out: saving
// one into the mirror would not apply it. No tag constraint: everything on
// a GRASP relay is about the repositories it hosts.
var MirrorKinds = []int{
	nip34.KindRepoAnnouncement, nip34.KindRepoState, nip34.KindUserGraspList,
	nip34.KindPatch, nip34.KindPullRequest, nip34.KindPullRequestUpdate, nip34.KindIssue,
	1630, 1631, 1632, 1633, nip34.KindComment,
}

// DefaultRefreshMaxFetch bounds the events one refresh downloads from the
// target: a mirror far behind (a fresh data directory next to a full
// target) catches up over several refreshes instead of in one unbounded
// download; meanwhile what is missing costs what it cost before the refresh
// existed (a duplicate publish).
const DefaultRefreshMaxFetch = 50_000

// refreshChunk is the most ids one REQ asks for (strfry's per-filter cap).
const refreshChunk = 500

// refreshStartDelay is the wait before the first refresh, so it does not
// compete with the start of the services.
const refreshStartDelay = time.Minute

// refreshRetry is the wait after a failed refresh (not the whole interval).
const refreshRetry = 10 * time.Minute

// RefreshResult is what one refresh did.
type RefreshResult struct {
	// Fetched is how many events the target sent that the mirror lacked
	// and were saved into it.
	Fetched int
	// MissingOnTarget is how many ids the mirror holds that the target
	// lacks (counted, never deleted).
	MissingOnTarget int
	// Unsupported is set when the target does not offer NIP-77: nothing
	// was changed.
	Unsupported bool
	// Partial is set when more ids were missing than MaxFetch.
	Partial bool
}

// Refresher reconciles the mirror with the target by NIP-77, so events
// others wrote to the target directly are known to be there (and not
// fetched from remotes and published again). Ids the mirror has and the
// target lacks are counted, not deleted. One goroutine runs it (Run, or
// Refresh calls one after the other).
type Refresher struct {
	relay    string
	sk, pk   string
	interval time.Duration
	// MaxFetch bounds the events one refresh downloads
	// (DefaultRefreshMaxFetch).
	MaxFetch int
	// StartDelay is the wait before the first refresh.
	StartDelay time.Duration
	mirror     Mirror
	authWait   time.Duration
	clk        clock.Clock
	log        *slog.Logger
	m          refreshMetrics
	warnedNo77 bool
}

type refreshMetrics struct {
	result  *prometheus.CounterVec
	fetched prometheus.Counter
	missing prometheus.Gauge
}

// NewRefresher builds the mirror refresh for cfg (Validate it first); reg
// may be nil. Run does nothing when cfg.RefreshInterval is 0.
func NewRefresher(cfg Settings, mirror Mirror, clk clock.Clock, log *slog.Logger, reg prometheus.Registerer) *Refresher {
	r := &Refresher{
		relay: cfg.Relay, interval: cfg.RefreshInterval, authWait: cfg.withDefaults().Timeout, MaxFetch: DefaultRefreshMaxFetch, StartDelay: refreshStartDelay,
		mirror: mirror, clk: clk, log: log.With("target", cfg.Relay),
		m: refreshMetrics{
			result: prometheus.NewCounterVec(prometheus.CounterOpts{
				Name: "grasp_target_mirror_refresh_total",
				Help: "Refreshes of the mirror from the target relay by NIP-77, by result: ok, partial (more missing than one refresh fetches), unsupported (no NIP-77 on the target), error.",
			}, []string{"result"}),
			fetched: prometheus.NewCounter(prometheus.CounterOpts{
				Name: "grasp_target_mirror_fetched_total",
				Help: "Events the mirror refresh downloaded from the target relay (written there by others) and saved into the mirror.",
			}),
			missing: prometheus.NewGauge(prometheus.GaugeOpts{
				Name: "grasp_target_mirror_missing_on_target",
				Help: "Events the mirror holds that the target relay lacked at the last refresh (the target dropped them, or the mirror belongs to another target).",
			}),
		},
	}
	if cfg.AuthKey != "" {
		r.sk, _ = config.SecretKey(cfg.AuthKey)
		r.pk, _ = nostr.GetPublicKey(r.sk)
	}
	for _, l := range []string{"ok", "partial", "unsupported", "error"} {
		r.m.result.WithLabelValues(l)
	}
	if reg != nil {
		reg.MustRegister(r.m.result, r.m.fetched, r.m.missing)
	}
	return r
}

// WithClock replaces the clock that paces the refreshes (call before Run).
func (r *Refresher) WithClock(c clock.Clock) *Refresher {
	r.clk = c
	return r
}

// Run refreshes after StartDelay and then every interval until ctx ends; a
// failed refresh is retried after refreshRetry (at most the interval).
// Failures are logged, never returned: the index alone keeps working.
func (r *Refresher) Run(ctx context.Context) error {
	if r.interval <= 0 {
		return nil
	}
	wait := r.StartDelay
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-r.clk.After(wait):
		}
		wait = r.interval
		if _, err := r.Refresh(ctx); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			wait = min(refreshRetry, r.interval)
			r.log.Warn("mirror refresh from the target failed", "err", err, "retry_in", wait)
		}
	}
}

// Refresh reconciles the mirror with the target once: what the target has
// and the mirror lacks is downloaded (at most MaxFetch), verified and
// saved into the mirror; what the mirror has and the target lacks is
// counted. A target without NIP-77 gives Unsupported and no error.
func (r *Refresher) Refresh(ctx context.Context) (RefreshResult, error) {
	res, err := r.refresh(ctx)
	switch {
	case err != nil:
		r.m.result.WithLabelValues("error").Inc()
	case res.Unsupported:
		r.m.result.WithLabelValues("unsupported").Inc()
	case res.Partial:
		r.m.result.WithLabelValues("partial").Inc()
	default:
		r.m.result.WithLabelValues("ok").Inc()
	}
	return res, err
}

func (r *Refresher) refresh(ctx context.Context) (RefreshResult, error) {
	var res RefreshResult
	filter := nostr.Filter{Kinds: MirrorKinds}
	local, err := r.localItems(ctx, filter)
	if err != nil {
		return res, err
	}
	auth := &refreshAuth{challenges: make(chan string, 1), authed: make(chan struct{})}
	conn, err := relayconn.Dial(ctx, r.relay, relayconn.Options{OnMessage: auth.onMessage})
	if err != nil {
		return res, fmt.Errorf("mirror refresh: %w", err)
	}
	defer conn.Close()
	if r.sk != "" {
		go r.answerAuth(conn, auth)
	}
	opts := negsync.Options{Have: true}
	rec, err := negsync.Reconcile(ctx, conn, filter, local, opts)
	if err != nil && r.sk != "" && strings.Contains(err.Error(), "auth-required") {
		// The target reads only for authenticated clients and our
		// NEG-OPEN overtook our AUTH: once it is accepted, once more.
		select {
		case <-auth.authed:
			rec, err = negsync.Reconcile(ctx, conn, filter, local, opts)
		case <-r.clk.After(r.authWait):
			return res, fmt.Errorf("mirror refresh: %s requires NIP-42 authentication to read and did not accept ours: %w", r.relay, err)
		case <-ctx.Done():
			return res, ctx.Err()
		}
	}
	if err != nil && r.sk == "" && strings.Contains(err.Error(), "auth-required") {
		return res, fmt.Errorf("mirror refresh: %s requires NIP-42 authentication to read and GRASP_TARGET_AUTH_KEY is not set: %w", r.relay, err)
	}
	if errors.Is(err, negsync.ErrUnsupported) {
		res.Unsupported = true
		if !r.warnedNo77 {
			r.warnedNo77 = true
			r.log.Info("the target relay offers no NIP-77: the mirror is not refreshed, the index of what we published stays in use", "reason", err)
		}
		return res, nil
	}
	if err != nil {
		return res, fmt.Errorf("mirror refresh: reconcile with %s: %w", r.relay, err)
	}
	need := rec.Need
	if len(need) > r.MaxFetch {
		res.Partial = true
		r.log.Info("more events on the target than one refresh fetches: the rest at the next one", "missing", len(need), "max", r.MaxFetch)
		need = need[:r.MaxFetch]
	}
	for start := 0; start < len(need); start += refreshChunk {
		n, err := r.fetch(ctx, conn, need[start:min(start+refreshChunk, len(need))])
		res.Fetched += n
		r.m.fetched.Add(float64(n))
		if err != nil {
			return res, err
		}
	}
	// Counted after the fetch: an older version of a replaceable event the
	// target replaced is gone from the mirror once the newer one is saved.
	missing := len(rec.Have)
	if res.Fetched > 0 && missing > 0 {
		if missing, err = r.held(ctx, rec.Have); err != nil {
			return res, err
		}
	}
	res.MissingOnTarget = missing
	r.m.missing.Set(float64(missing))
	if missing > 0 {
		r.log.Warn("the mirror holds events the target relay lacks (the target dropped them, or the mirror belongs to another target); kept",
			"count", missing)
	}
	r.log.Info("mirror refreshed from the target relay", "fetched", res.Fetched, "missing_on_target", res.MissingOnTarget, "rounds", rec.Rounds)
	return res, nil
}

// held counts the ids the mirror still holds.
func (r *Refresher) held(ctx context.Context, ids []string) (int, error) {
	n := 0
	for start := 0; start < len(ids); start += refreshChunk {
		evts, err := r.mirror.Query(ctx, nostr.Filter{IDs: ids[start:min(start+refreshChunk, len(ids))]})
		if err != nil {
			return 0, fmt.Errorf("mirror refresh: query the mirror: %w", err)
		}
		n += len(evts)
	}
	return n, nil
}

// localItems is the mirror's side: its complete id listing when it has one
// (pkg/store's Items), else a Query (capped by the store's query limit;
// ids beyond it are fetched again, harmlessly).
func (r *Refresher) localItems(ctx context.Context, f nostr.Filter) ([]negsync.Item, error) {
	if il, ok := r.mirror.(interface {
		Items(ctx context.Context, f nostr.Filter) ([]store.Item, error)
	}); ok {
		items, err := il.Items(ctx, f)
		if err != nil {
			return nil, fmt.Errorf("mirror refresh: list the mirror: %w", err)
		}
		out := make([]negsync.Item, len(items))
		for i, it := range items {
			out[i] = negsync.Item{ID: it.ID, CreatedAt: it.CreatedAt}
		}
		return out, nil
	}
	evts, err := r.mirror.Query(ctx, f)
	if err != nil {
		return nil, fmt.Errorf("mirror refresh: query the mirror: %w", err)
	}
	out := make([]negsync.Item, len(evts))
	for i, e := range evts {
		out[i] = negsync.Item{ID: e.ID, CreatedAt: e.CreatedAt}
	}
	return out, nil
}

// fetch downloads ids (at most refreshChunk) from the target, asking again
// for those a capped answer left out, verifies them and saves them into
// the mirror. It returns how many were saved.
func (r *Refresher) fetch(ctx context.Context, conn *relayconn.Conn, ids []string) (int, error) {
	want := make(map[string]bool, len(ids))
	for _, id := range ids {
		want[id] = true
	}
	saved := 0
	for len(want) > 0 {
		rest := make([]string, 0, len(want))
		for id := range want {
			rest = append(rest, id)
		}
		sub, err := conn.Subscribe(ctx, nostr.Filters{{IDs: rest}})
		if err != nil {
			return saved, fmt.Errorf("mirror refresh: fetch from %s: %w", r.relay, err)
		}
		var got []*nostr.Event
		progress := false
		take := func(evt *nostr.Event) {
			if !want[evt.ID] {
				return
			}
			delete(want, evt.ID)
			progress = true
			if !evt.CheckID() {
				r.log.Warn("the target sent an event whose id does not match its content: skipped", "id", evt.ID)
				return
			}
			if ok, err := verify.Signature(evt); !ok {
				r.log.Warn("the target sent an event with a bad signature: skipped", "id", evt.ID, "err", err)
				return
			}
			got = append(got, evt)
		}
	read:
		for {
			select {
			case evt := <-sub.Events():
				take(evt)
			case <-sub.EOSE():
				for _, evt := range sub.Buffered() {
					take(evt)
				}
				break read
			case reason := <-sub.Closed():
				sub.Close()
				return saved, fmt.Errorf("mirror refresh: the target closed our REQ: %s", reason)
			case <-conn.Context().Done():
				return saved, fmt.Errorf("mirror refresh: connection to %s lost: %w", r.relay, context.Cause(conn.Context()))
			case <-ctx.Done():
				sub.Close()
				return saved, ctx.Err()
			}
		}
		sub.Close()
		if len(got) > 0 {
			for k, sr := range r.mirror.SaveBatch(ctx, got) {
				if sr.Err != nil {
					return saved, fmt.Errorf("mirror refresh: save %s: %w", got[k].ID, sr.Err)
				}
				saved++
			}
		}
		if !progress {
			break // the target no longer has the rest
		}
	}
	return saved, nil
}

// refreshAuth is the NIP-42 state of one refresh connection.
type refreshAuth struct {
	challenges chan string
	authID     atomic.Value // string: the id of our AUTH event
	authed     chan struct{}
	once       sync.Once
}

// onMessage receives AUTH challenges and the OK to our AUTH (on the read
// goroutine: it does not block).
func (a *refreshAuth) onMessage(label string, raw []byte) {
	switch label {
	case "AUTH":
		select {
		case a.challenges <- gjson.GetBytes(raw, "1").String():
		default:
		}
	case "OK":
		if id, _ := a.authID.Load().(string); id != "" && gjson.GetBytes(raw, "1").String() == id && gjson.GetBytes(raw, "2").Bool() {
			a.once.Do(func() { close(a.authed) })
		}
	}
}

// answerAuth answers the target's NIP-42 challenges with
// GRASP_TARGET_AUTH_KEY until conn ends.
func (r *Refresher) answerAuth(conn *relayconn.Conn, a *refreshAuth) {
	for {
		select {
		case <-conn.Context().Done():
			return
		case challenge := <-a.challenges:
			evt := nip42.CreateUnsignedAuthEvent(challenge, r.pk, r.relay)
			if err := evt.Sign(r.sk); err != nil {
				r.log.Error("sign AUTH event", "err", err)
				return
			}
			a.authID.Store(evt.ID)
			_ = conn.Write(conn.Context(), []any{"AUTH", evt})
		}
	}
}
