package fetcher

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/coder/websocket"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nbd-wtf/go-nostr"
	"google.golang.org/protobuf/proto"

	graspv1 "github.com/grasp-sync/grasp-sync/proto/grasp/v1"

	"github.com/grasp-sync/grasp-sync/pkg/bus"
	"github.com/grasp-sync/grasp-sync/pkg/relayconn"
	"github.com/grasp-sync/grasp-sync/pkg/relaylimits"
)

// A relay's limits are a property of the relay, never a failure
// (docs/sync.md, "What relays allow"): the fetcher keeps every message and
// every count within the budget in force — what the relay's NIP-11
// document advertises, or defaults every common relay accepts — and a
// refusal of a budget lowers it for that relay, for good, and the refused
// request is sent again within the new budget. None of it counts toward
// the relay's health backoff or its rate-limit cooldown. Why it is built
// this way: docs/decisions/0057-relay-limits-kept-by-the-fetcher.md.

// nip11Refresh is how often a relay's NIP-11 document is read again.
const nip11Refresh = 24 * time.Hour

// nip11Timeout bounds one NIP-11 request.
const nip11Timeout = 10 * time.Second

// readRefusalRetry is how long a read the relay refused (auth-required:,
// restricted:) is left alone before it is asked again: once a day, like
// the resync, never in a loop.
const readRefusalRetry = 24 * time.Hour

// relayLimits is what the fetcher knows of one relay's limits; it
// outlives the relay's worker and sessions (Fetcher.limits) and is kept in
// the RelayLimitsBucket.
type relayLimits struct {
	url string
	mu  sync.Mutex
	rec *graspv1.RelayLimits
	// loaded: rec was read from the bucket (or found absent).
	loaded bool
}

func toLimits(l *graspv1.Limits) relaylimits.Limits {
	return relaylimits.Limits{MaxMessageBytes: int(l.GetMaxMessageBytes()), MaxSubscriptions: int(l.GetMaxSubscriptions()),
		MaxFilters: int(l.GetMaxFilters()), MaxLimit: int(l.GetMaxLimit())}
}

func fromLimits(l relaylimits.Limits) *graspv1.Limits {
	return &graspv1.Limits{MaxMessageBytes: uint32(l.MaxMessageBytes), MaxSubscriptions: uint32(l.MaxSubscriptions),
		MaxFilters: uint32(l.MaxFilters), MaxLimit: uint32(l.MaxLimit)}
}

// effective is the budget in force.
func (r *relayLimits) effective() relaylimits.Limits {
	r.mu.Lock()
	defer r.mu.Unlock()
	return relaylimits.Effective(toLimits(r.rec.GetAdvertised()), toLimits(r.rec.GetLearned()))
}

// learn lowers the learned budget after a refusal; changed says whether
// the budget in force went down.
func (r *relayLimits) learn(kind relaylimits.Refusal, text string, open, filters, size int, now time.Time) (eff relaylimits.Limits, changed bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	before := relaylimits.Effective(toLimits(r.rec.GetAdvertised()), toLimits(r.rec.GetLearned()))
	// Learn from the budget in force, so a refusal at or above it says
	// nothing new and one below it lowers it.
	learned, _ := relaylimits.Learn(before, kind, open, filters, size)
	if n := relaylimits.SizeLimitIn(text); kind == relaylimits.MessageTooLarge && n >= relaylimits.Floors.MaxMessageBytes {
		// The relay named its limit (nostr-rs-relay): take it as said.
		learned.MaxMessageBytes = min(before.MaxMessageBytes, n)
	}
	learned = learned.Min(toLimits(r.rec.GetLearned()))
	// A subscription refusal while the count was only assumed ends the
	// probe past it (liveProbeMax): the count in force becomes a learned
	// one even where it equals the default.
	probed := kind == relaylimits.TooManySubscriptions && r.rec.GetLearned().GetMaxSubscriptions() == 0 &&
		r.rec.GetAdvertised().GetMaxSubscriptions() == 0
	if r.rec.LimitRefusals == nil {
		r.rec.LimitRefusals = map[string]uint64{}
	}
	r.rec.LimitRefusals[kind.String()]++
	eff = relaylimits.Effective(toLimits(r.rec.GetAdvertised()), learned)
	if eff != before || probed {
		// Keep only what lowers the advertised budget (or ends a probe):
		// the rest is noise.
		r.rec.Learned = fromLimits(learned)
		changed = true
	}
	r.rec.UpdatedAt = now.UnixMilli()
	return eff, changed
}

// advertise records a NIP-11 answer, its limits and software (or why
// there was none).
func (r *relayLimits) advertise(l relaylimits.Limits, software string, err error, now time.Time) relaylimits.Limits {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.rec.Nip11At = now.UnixMilli()
	if err != nil {
		r.rec.Nip11Error = err.Error()
	} else {
		r.rec.Nip11Error = ""
		r.rec.Advertised = fromLimits(l)
		r.rec.Software = software
	}
	r.rec.UpdatedAt = now.UnixMilli()
	return relaylimits.Effective(toLimits(r.rec.GetAdvertised()), toLimits(r.rec.GetLearned()))
}

// subscriptionsAssumed says whether the subscription count in force is
// only the default: the relay neither advertised one nor refused one.
func (r *relayLimits) subscriptionsAssumed() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.rec.GetAdvertised().GetMaxSubscriptions() == 0 && r.rec.GetLearned().GetMaxSubscriptions() == 0
}

// capsEachFilter says whether the relay's NIP-11 software is known to cap
// each filter of a REQ apart (relaylimits.CapsEachFilter).
func (r *relayLimits) capsEachFilter() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return relaylimits.CapsEachFilter(r.rec.GetSoftware())
}

// nip11Due says whether the NIP-11 document should be read now.
func (r *relayLimits) nip11Due(now time.Time) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return now.Sub(time.UnixMilli(r.rec.GetNip11At())) >= nip11Refresh
}

// refusedRead returns the remembered refusal of reads of kind, while it
// holds ("" otherwise).
func (r *relayLimits) refusedRead(kind string, now time.Time) string {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, rf := range r.rec.GetRefusals() {
		if rf.GetFilterKind() == kind && now.UnixMilli() < rf.GetRetryAt() {
			return rf.GetReason()
		}
	}
	return ""
}

// refuse remembers that reads of kind are refused, until a day from now.
func (r *relayLimits) refuse(kind, reason string, now time.Time) time.Time {
	r.mu.Lock()
	defer r.mu.Unlock()
	retry := now.Add(readRefusalRetry)
	for _, rf := range r.rec.Refusals {
		if rf.GetFilterKind() == kind {
			rf.Reason, rf.At, rf.RetryAt = reason, now.UnixMilli(), retry.UnixMilli()
			r.rec.UpdatedAt = now.UnixMilli()
			return retry
		}
	}
	r.rec.Refusals = append(r.rec.Refusals, &graspv1.ReadRefusal{FilterKind: kind, Reason: reason, At: now.UnixMilli(), RetryAt: retry.UnixMilli()})
	r.rec.UpdatedAt = now.UnixMilli()
	return retry
}

// clearRefusal forgets a refusal of kind once a read of it succeeded.
func (r *relayLimits) clearRefusal(kind string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := len(r.rec.Refusals)
	r.rec.Refusals = slices.DeleteFunc(r.rec.Refusals, func(rf *graspv1.ReadRefusal) bool { return rf.GetFilterKind() == kind })
	return len(r.rec.Refusals) != n
}

func (r *relayLimits) snapshot() *graspv1.RelayLimits {
	r.mu.Lock()
	defer r.mu.Unlock()
	return proto.Clone(r.rec).(*graspv1.RelayLimits)
}

// limitsFor returns the relay's limits record, read from the bucket the
// first time (a restart or a shard move starts from what was learned).
func (f *Fetcher) limitsFor(ctx context.Context, url string) *relayLimits {
	f.mu.Lock()
	r := f.limits[url]
	if r == nil {
		r = &relayLimits{url: url, rec: &graspv1.RelayLimits{RelayUrl: url}}
		f.limits[url] = r
	}
	kv := f.limitsKV
	f.mu.Unlock()
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.loaded || kv == nil {
		return r
	}
	gctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	entry, err := kv.Get(gctx, bus.RelayLimitsKey(url))
	switch {
	case err == nil:
		var rec graspv1.RelayLimits
		if err := proto.Unmarshal(entry.Value(), &rec); err == nil {
			r.rec = &rec
			r.rec.RelayUrl = url
		}
		r.loaded = true
	case errors.Is(err, jetstream.ErrKeyNotFound):
		r.loaded = true
	default:
		// Not loaded: defaults for now, asked again next session.
		f.log.Warn("relay limits not read", "relay", url, "err", err)
	}
	return r
}

// saveLimits stores the relay's record; a failure is logged and the next
// change stores it again (the record is a cache of what can be learned
// again).
func (f *Fetcher) saveLimits(r *relayLimits) {
	f.mu.Lock()
	kv := f.limitsKV
	f.mu.Unlock()
	if kv == nil {
		return
	}
	data, err := proto.Marshal(r.snapshot())
	if err != nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := kv.Put(ctx, bus.RelayLimitsKey(r.url), data); err != nil {
		f.log.Warn("relay limits not saved", "relay", r.url, "err", err)
	}
}

// liveReserve is how many of a relay's subscriptions live ones leave free
// for reads that end: each running batch reads one page or NIP-77 session
// at a time.
func (w *relayWorker) liveReserve(subs int) int {
	return min(w.f.cfg.MaxConcurrentBatches, max(subs/2, 1))
}

// fullFilterBytes is the size of a live filter of 100 ids (the planner's
// chunks, pkg/filters), what the live filter budget is counted in.
const fullFilterBytes = 100*67 + 40

// liveFilterBudget is how many live filters the relay's limits let the
// fetcher keep open: its subscriptions less those kept for reads, times
// the full filters one REQ carries (by bytes, by filter count). The
// planner consolidates within it (Connected.live_filter_budget).
func (w *relayWorker) liveFilterBudget(l relaylimits.Limits) uint32 {
	reqs := max(l.MaxSubscriptions-w.liveReserve(l.MaxSubscriptions), 1)
	per := min(l.MaxFilters, w.f.cfg.LiveFiltersPerREQ, max((l.MaxMessageBytes-relaylimits.ReqOverhead)/fullFilterBytes, 1))
	return uint32(reqs * max(per, 1))
}

// applyLimits makes the session's connection keep to the budget in force.
func (w *relayWorker) applyLimits(s *session, l relaylimits.Limits) {
	subs := l.MaxSubscriptions
	if w.lims.subscriptionsAssumed() {
		subs = max(subs, int(s.liveProbe.Load()))
	}
	s.conn.SetLimits(l.MaxMessageBytes, subs, w.liveReserve(l.MaxSubscriptions))
}

// liveProbeMax bounds how many subscriptions a session opens on a relay
// whose count is only assumed (Defaults: 20) when its live set needs more:
// 200, what current strfry releases allow and advertise. A relay that did
// not say its limit may have none (khatru has none); a refusal costs a
// NOTICE or a CLOSED, never the connection, and teaches the real count
// (relayLimits.learn), after which the live set is fitted to it. Without
// the probe, a live set larger than the assumed count left some REQs
// waiting for a slot for the whole session, and what they would have
// brought live waited for the daily resync (docs/sync.md, "What relays
// allow").
const liveProbeMax = 200

// onLimit is the connection's OnLimit hook: a refusal of a budget lowers
// it for the relay, for good. It runs on the connection's read goroutine.
func (w *relayWorker) onLimit(s *session, kind relaylimits.Refusal, text string, open, filters, size int) {
	w.f.m.limitRefusals.WithLabelValues(kind.String()).Inc()
	eff, changed := w.lims.learn(kind, text, open, filters, size, w.f.clock.Now())
	if changed {
		w.applyLimits(s, eff)
		w.askFitLive()
		w.log.Info("relay limit learned", "session", s.id, "refusal", kind.String(), "open", open, "filters", filters, "size", size,
			"max_message_bytes", eff.MaxMessageBytes, "max_subscriptions", eff.MaxSubscriptions, "max_filters", eff.MaxFilters)
	} else {
		w.log.Debug("relay refused within a known limit", "session", s.id, "refusal", kind.String(), "open", open, "filters", filters, "size", size)
	}
	w.saveLimitsAsync(s)
}

// droppedForSize says whether a lost connection was the relay refusing a
// message for its size, and returns that message's size (0: it was not):
// khatru closes with status 1009; strfry and nostr-rs-relay drop the
// connection without a close frame (docs/dependencies.md, "What relays
// enforce"), which is read as a refusal of size only when a message over
// 16 KiB, larger than the floor of the budget, went out in the seconds
// before. That guess lowers the budget at most down to the floor
// (relaylimits.Floors); below it every message is smaller than the guess
// needs, so a relay that keeps dropping us is a failure again.
func (w *relayWorker) droppedForSize(cause error) int {
	c := w.sess.conn
	if websocket.CloseStatus(cause) == websocket.StatusMessageTooBig {
		return max(c.MaxWritten(), 1)
	}
	if websocket.CloseStatus(cause) != -1 || errors.Is(cause, relayconn.ErrClosed) || errors.Is(cause, relayconn.ErrDead) {
		return 0 // a close frame of another kind, our own close, a dead peer
	}
	size := c.RecentLargeWrite(time.Now(), 5*time.Second)
	if size <= relaylimits.Floors.MaxMessageBytes || size > w.lims.effective().MaxMessageBytes {
		return 0
	}
	return size
}

// askFitLive has run check the live groups against the budget (fitLive).
func (w *relayWorker) askFitLive() {
	select {
	case w.checkLive <- struct{}{}:
	default:
	}
}

// fitLive asks the planner to replace the relay's live set when its live
// REQs are more than the subscription budget leaves them (budget less the
// reserve for reads that end): the budget went down under them (learned
// from a refusal) or the planner's sets are many and small. The planner
// answers with one consolidated set, which openLive packs densely, and a
// catch-up from now, so nothing published meanwhile is missed. Asked once
// per budget and session: a set that cannot fit even packed stays partly
// waiting for slots (docs/sync.md, "What relays allow").
func (w *relayWorker) fitLive() {
	s := w.sess
	if s == nil {
		return
	}
	lim := w.lims.effective()
	reserve := w.liveReserve(lim.MaxSubscriptions)
	share := max(lim.MaxSubscriptions-reserve, 1)
	if len(w.live) <= share {
		return
	}
	if w.lims.subscriptionsAssumed() {
		// The relay never said its limit: open the live set past the
		// assumed count, up to liveProbeMax, and learn from a refusal.
		probe := min(len(w.live)+reserve, liveProbeMax)
		if int32(probe) > s.liveProbe.Load() {
			s.liveProbe.Store(int32(probe))
			w.log.Info("live set larger than the assumed subscription budget; opening it past it (the relay did not say its limit)",
				"session", s.id, "live_reqs", len(w.live), "subscriptions", probe)
			w.applyLimits(s, lim)
		}
		if share = probe - reserve; len(w.live) <= share {
			return
		}
	}
	if s.replaceAskedAt == lim.MaxSubscriptions {
		return
	}
	s.replaceAskedAt = lim.MaxSubscriptions
	reason := fmt.Sprintf("live set of %d REQs over the relay's budget of %d (%d subscriptions, %d kept for reads): replace it with one consolidated set",
		len(w.live), share, lim.MaxSubscriptions, lim.MaxSubscriptions-share)
	w.log.Info("live set does not fit the relay's subscription budget; asking for a consolidated set", "session", s.id,
		"live_reqs", len(w.live), "share", share)
	w.reportFor(s.id, &graspv1.FetchReport{Report: &graspv1.FetchReport_SubscriptionClosed{SubscriptionClosed: &graspv1.SubscriptionClosed{
		Reason: reason, Live: true, LiveFilterBudget: w.liveFilterBudget(lim)}}})
}

// saveLimitsAsync stores the record from a goroutine of the session's
// tasks, started on demand (the callers are the read goroutine and hooks
// that must not block; both are done before endSession waits for the
// tasks).
func (w *relayWorker) saveLimitsAsync(s *session) {
	s.saving.ask(&w.tasks, func() {
		if s.ctx.Err() == nil {
			w.f.saveLimits(w.lims)
		}
	})
}

// readNIP11 reads the relay's NIP-11 document at the start of a session
// when it is due, and stores the limits record it changed.
func (w *relayWorker) readNIP11(s *session) {
	if w.lims.nip11Due(w.f.clock.Now()) {
		ctx, cancel := context.WithTimeout(s.ctx, nip11Timeout)
		doc, err := relayconn.FetchInfo(ctx, w.url, w.f.guard.CheckDial)
		cancel()
		var adv relaylimits.Limits
		var software string
		if err == nil {
			adv, software, err = relaylimits.ParseNIP11(doc)
			if err != nil {
				err = fmt.Errorf("NIP-11 of %s: not JSON: %w", w.url, err)
			}
		}
		if s.ctx.Err() != nil {
			return
		}
		eff := w.lims.advertise(adv, software, err, w.f.clock.Now())
		w.applyLimits(s, eff)
		w.log.Debug("relay NIP-11 read", "session", s.id, "advertised", fmt.Sprintf("%+v", adv), "err", err,
			"max_message_bytes", eff.MaxMessageBytes, "max_subscriptions", eff.MaxSubscriptions, "max_filters", eff.MaxFilters)
		w.f.saveLimits(w.lims)
	}
}

// filterKind names what a historic or live filter reads, for remembering
// the reads a relay refuses: layer 1's announcements, a repository's own
// part (coordinates), its states (#d), a root's replies (#e/#E, or #q
// with an id), ids, or other.
func filterKind(f nostr.Filter) string {
	switch {
	case len(f.IDs) > 0:
		return "ids"
	case slices.Contains(f.Kinds, 30617) && len(f.Tags) == 0:
		return "announcements"
	}
	if _, ok := f.Tags["d"]; ok {
		return "states"
	}
	for _, name := range []string{"a", "A"} {
		if _, ok := f.Tags[name]; ok {
			return "repository"
		}
	}
	for _, name := range []string{"e", "E"} {
		if _, ok := f.Tags[name]; ok {
			return "roots"
		}
	}
	if vs, ok := f.Tags["q"]; ok && len(vs) > 0 {
		if strings.Contains(vs[0], ":") {
			return "repository"
		}
		return "roots"
	}
	return "other"
}

// readRefusal says whether a CLOSED reason refuses the read itself
// (auth-required: we cannot answer, restricted:): it is remembered for the
// filter's kind and asked again a day later, never in a loop.
func readRefusal(reason string) bool {
	r := relaylimits.Classify(reason)
	return r == relaylimits.AuthRequired || r == relaylimits.Restricted
}
