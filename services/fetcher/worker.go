package fetcher

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nbd-wtf/go-nostr"

	graspv1 "github.com/grasp-sync/grasp-sync/proto/grasp/v1"

	"github.com/grasp-sync/grasp-sync/pkg/bus"
	"github.com/grasp-sync/grasp-sync/pkg/filters"
	"github.com/grasp-sync/grasp-sync/pkg/history"
	"github.com/grasp-sync/grasp-sync/pkg/relayconn"
	"github.com/grasp-sync/grasp-sync/pkg/relaylimits"
)

// relayWorker owns one relay: its connection, its session, its live
// subscriptions and its historic batches. Commands for the relay are
// executed in order by its run goroutine; everything a session started
// (live groups, batches) runs under the session's context and is waited
// for when the session ends.
type relayWorker struct {
	f     *Fetcher
	url   string
	shard int
	log   *slog.Logger
	cmds  chan *graspv1.FetchCommand
	done  chan struct{}
	// signals carries facts found on other goroutines (rate limits) to run,
	// which reports them; sends never block.
	signals chan signal
	// cooldown outlives sessions: a relay that asked us to slow down is
	// not hammered again by a reconnect.
	cooldown *Cooldown
	// nip77 is what the relay answered to NEG-OPEN, across sessions and
	// workers (Fetcher.nip77).
	nip77 *nip77Support
	// lims is what the relay allows (Fetcher.limits), set at the first
	// connect.
	lims *relayLimits
	// repack carries live groups whose REQ the relay refused for its size
	// or filter count to run, which opens them again within the new
	// budget.
	repack chan *liveGroup
	// checkLive asks run to see whether the live groups fit the relay's
	// subscription budget (a live REQ waited for a slot, or the budget
	// went down); sends never block.
	checkLive chan struct{}
	// previous is the session another replica held before this one took
	// the shard over (reported once with the first Connected).
	previous *graspv1.FetcherRelay
	// held ends when the worker's shard is released: reports are retried
	// until then (reportFor).
	held context.Context

	// Owned by run.
	want     bool
	sess     *session
	health   RelayHealth
	logLimit logLimiter
	live     map[*liveGroup]struct{}
	tasks    sync.WaitGroup
}

type signal struct {
	rateLimit string
	until     time.Time
}

// session is one connection's state shared with its goroutines.
type session struct {
	id     string
	conn   *relayconn.Conn
	ctx    context.Context
	cancel context.CancelFunc
	// histSem bounds concurrent batches; pending counts batches started
	// (waiting or running).
	histSem chan struct{}
	pending chan struct{}
	auth    *authState
	// relayCap is the largest REQ page the relay has returned on this
	// connection: a shorter page is proven complete (docs/decisions/0021-history-crowded-second.md).
	relayCap history.Cap

	// saving stores the relay's limits record on demand
	// (saveLimitsAsync); authing answers AUTH challenges on demand, once
	// ready (the connection and context set) is.
	saving, authing onDemand
	ready           atomic.Bool
	// replaceAskedAt is the subscription budget at which the planner was
	// last asked to replace the live set because it did not fit (fitLive):
	// once per budget, so a set that cannot fit is not replaced in a loop.
	replaceAskedAt int
	// liveProbe is how many subscriptions the session lets itself open on a
	// relay whose count is only assumed, when its live set needs more
	// (fitLive, liveProbeMax); 0 until then. Read by applyLimits from
	// other goroutines.
	liveProbe atomic.Int32

	// looseTags is set once the relay answered a REQ with events that do
	// not match it (khatru v0.19.1 on badger ignores the tag letter): an
	// empty local set then says nothing about what the relay will send, so
	// the session reconciles with NIP-77 even then (batchRun.part).
	looseTags atomic.Bool

	mu       sync.Mutex
	fallback string // why NIP-77 was given up for the session ("" while not)
}

// useNegentropy reports whether NIP-77 is still worth trying this session.
func (s *session) useNegentropy() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.fallback == ""
}

// fallBack remembers the fallback for the session and reports whether this
// was the first time (so it is logged once).
func (s *session) fallBack(reason string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.fallback != "" {
		return false
	}
	s.fallback = reason
	return true
}

func (s *session) fallbackReason() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.fallback
}

func newRelayWorker(f *Fetcher, url string, shard int) *relayWorker {
	return &relayWorker{
		f:         f,
		url:       url,
		shard:     shard,
		log:       f.log.With("relay", url, "shard", shard),
		cmds:      make(chan *graspv1.FetchCommand, 256),
		done:      make(chan struct{}),
		signals:   make(chan signal, 16),
		repack:    make(chan *liveGroup, 64),
		checkLive: make(chan struct{}, 1),
		cooldown:  &Cooldown{Base: f.cfg.RateLimitCooldown, Max: f.cfg.RateLimitMaxCooldown, Clock: f.clock},
		health: RelayHealth{Policy: HealthPolicy{Base: f.cfg.BackoffBase, Max: f.cfg.BackoffMax,
			DeadAfter: f.cfg.DeadAfter, DeadRetry: f.cfg.DeadRetry, StableAfter: time.Minute}},
		logLimit: logLimiter{window: 12 * time.Hour},
		live:     map[*liveGroup]struct{}{},
		nip77:    &nip77Support{},
	}
}

// run connects and keeps the relay connected until dropped or ctx ends.
func (w *relayWorker) run(ctx context.Context) {
	defer close(w.done)
	defer w.f.m.forget(w.url)
	var retry <-chan time.Time
	for {
		var lost <-chan struct{}
		if w.sess != nil {
			lost = w.sess.conn.Context().Done()
		}
		select {
		case <-ctx.Done():
			w.endSession("shard released or fetcher stopping", "", true)
			return
		case <-retry:
			retry = nil
			if w.want && w.sess == nil {
				retry = w.connect(ctx)
			}
		case <-lost:
			cause := context.Cause(w.sess.conn.Context())
			if size := w.droppedForSize(cause); size > 0 {
				// The relay's message limit is below what we sent: learn
				// it and reconnect at once, not as a failure (the planner
				// resends what the session carried).
				s := w.sess
				w.onLimit(s, relaylimits.MessageTooLarge, cause.Error(), 0, 0, size)
				w.f.saveLimits(w.lims)
				w.endSession(cause.Error(), ClassLimit, true)
				retry = w.f.clock.After(0)
				continue
			}
			class := ClassifyFailure(cause)
			w.endSession(cause.Error(), class, true)
			retry = w.failed(cause, class, false)
		case <-w.checkLive:
			w.fitLive()
		case g := <-w.repack:
			if _, ok := w.live[g]; ok && w.sess != nil {
				// Opened again under its name within the budget in force;
				// the refused group ends once they are live.
				delete(w.live, g)
				before := map[*liveGroup]struct{}{}
				for h := range w.live {
					before[h] = struct{}{}
				}
				w.openLive(g.filters.filters(), g.id, "live_repack")
				var fresh []*liveGroup
				for h := range w.live {
					if _, old := before[h]; !old {
						fresh = append(fresh, h)
					}
				}
				w.retire(map[*liveGroup]struct{}{g: {}}, fresh)
			}
		case sig := <-w.signals:
			w.reportRateLimit(sig)
		case cmd := <-w.cmds:
			session := ""
			if w.sess != nil {
				session = w.sess.id
			}
			if cmd.GetSessionId() != "" && cmd.GetSessionId() != session {
				w.log.Debug("command for another session ignored", "session", cmd.GetSessionId(), "current", session)
				continue
			}
			switch c := cmd.GetCommand().(type) {
			case *graspv1.FetchCommand_EnsureConnected:
				if !w.want {
					w.want = true
					w.f.recordRelay(w.shard, w.url, w.record())
				}
				if w.sess != nil {
					w.report(&graspv1.FetchReport{Report: &graspv1.FetchReport_Connected{Connected: w.connectedReport()}})
				} else if retry == nil {
					retry = w.connect(ctx)
				}
			case *graspv1.FetchCommand_AddFilters:
				w.addFilters(c.AddFilters)
			case *graspv1.FetchCommand_ReplaceLive:
				w.replaceLive(filters.FromProtos(c.ReplaceLive.GetLiveFilters()), c.ReplaceLive.GetLiveId())
			case *graspv1.FetchCommand_CloseLive:
				if w.sess != nil {
					w.closeLiveSets(c.CloseLive.GetLiveIds(), c.CloseLive.GetAfterLiveId())
				}
			case *graspv1.FetchCommand_DropRelay:
				w.log.Info("relay dropped", "reason", c.DropRelay.GetReason())
				w.endSession("dropped: "+c.DropRelay.GetReason(), "", true)
				w.f.recordRelay(w.shard, w.url, nil)
				w.f.mu.Lock()
				delete(w.f.nip77, w.url)
				w.f.mu.Unlock()
				return
			}
		}
	}
}

// answerAuth answers the session's waiting AUTH challenges in a goroutine
// of its tasks.
func (w *relayWorker) answerAuth(s *session) {
	s.authing.ask(&w.tasks, func() { s.auth.answer(s.ctx, s.conn, w.url, w.log) })
}

// record is the relay's entry in the relay bucket.
func (w *relayWorker) record() *graspv1.FetcherRelay {
	rec := &graspv1.FetcherRelay{RelayUrl: w.url, Shard: uint32(w.shard), FetcherId: w.f.cfg.ID,
		UpdatedAt: w.f.clock.Now().UnixMilli()}
	if w.sess != nil {
		rec.SessionId = w.sess.id
	}
	return rec
}

// connect makes one attempt; on failure it returns the retry timer.
func (w *relayWorker) connect(ctx context.Context) <-chan time.Time {
	if err := w.f.guard.CheckURL(w.url); err != nil {
		return w.failed(fmt.Errorf("%w: %v", errAddressRefused, err), ClassAddressRefused, true)
	}
	if w.lims == nil {
		w.lims = w.f.limitsFor(ctx, w.url)
	}
	cctx, cancel := context.WithTimeout(ctx, w.f.cfg.ConnectTimeout)
	defer cancel()
	s := &session{id: newSessionID(),
		histSem: make(chan struct{}, w.f.cfg.MaxConcurrentBatches),
		pending: make(chan struct{}, w.f.cfg.MaxPendingBatches)}
	s.auth = newAuthState(w.f.authKey)
	opts := relayconn.Options{
		// The dialled address is vetted as it is dialled, so a name that
		// resolves to an internal address is refused (DNS-rebinding safe).
		CheckDial:       w.f.guard.CheckDial,
		MaxMessageBytes: w.f.cfg.MaxMessageBytes,
		PingInterval:    w.f.cfg.PingInterval,
		PongTimeout:     w.f.cfg.PongTimeout,
		OnLimit: func(r relaylimits.Refusal, text string, open, filters, size int) {
			w.onLimit(s, r, text, open, filters, size)
		},
		OnSent: func(purpose string, n int) {
			w.f.m.sentBytes.WithLabelValues(purpose).Add(float64(n))
			w.f.m.sentMessages.WithLabelValues(purpose).Inc()
		},
		OnNotice: func(msg string) {
			if IsRateLimit(msg) {
				w.rateLimited("NOTICE: " + msg)
			}
		},
		OnMessage: func(label string, raw []byte) {
			switch label {
			case "AUTH":
				s.auth.challenge(raw)
				if s.ready.Load() {
					// The read goroutine is one Close waits for before
					// endSession waits for the tasks.
					w.answerAuth(s)
				}
			case "OK":
				s.auth.ok(raw)
				if reason := okReason(raw); IsRateLimit(reason) {
					w.rateLimited("OK: " + reason)
				}
			}
		},
	}
	c, err := relayconn.Dial(cctx, w.url, opts)
	if err != nil {
		return w.failed(err, ClassifyFailure(err), true)
	}
	s.conn = c
	s.ctx, s.cancel = context.WithCancel(ctx)
	w.applyLimits(s, w.lims.effective())
	w.sess = s
	w.health.Connected(w.f.clock.Now())
	w.f.m.attempts.WithLabelValues(w.url, "ok").Inc()
	w.f.m.connected.WithLabelValues(w.url).Set(1)
	w.f.m.health.WithLabelValues(w.url).Set(float64(graspv1.HealthState_HEALTH_STATE_HEALTHY))
	w.f.m.failures.WithLabelValues(w.url).Set(0)
	w.log.Info("connected", "session", s.id)
	s.ready.Store(true)
	w.answerAuth(s) // a challenge that came before ready
	w.tasks.Add(1)
	go func() {
		defer w.tasks.Done()
		w.readNIP11(s)
	}()
	connected := w.connectedReport()
	if w.previous != nil {
		connected.PreviousSessionId = w.previous.GetSessionId()
		connected.PreviousFetcherId = w.previous.GetFetcherId()
		w.previous = nil
	}
	w.f.recordRelay(w.shard, w.url, w.record())
	w.report(&graspv1.FetchReport{Report: &graspv1.FetchReport_Connected{Connected: connected}})
	return nil
}

// failed records a failed attempt or lost session, logs it (once per class
// per 12 h), reports the health and returns the retry timer.
func (w *relayWorker) failed(err error, class string, attempt bool) <-chan time.Time {
	now := w.f.clock.Now()
	d, state := w.health.Failed(now)
	if attempt {
		w.f.m.attempts.WithLabelValues(w.url, class).Inc()
	}
	w.f.m.failureClasses.WithLabelValues(w.url, class).Inc()
	w.f.m.health.WithLabelValues(w.url).Set(float64(state))
	w.f.m.failures.WithLabelValues(w.url).Set(float64(w.health.Failures))
	attrs := []any{"class", class, "err", err, "failures", w.health.Failures, "retry_in", d.String(), "state", state.String()}
	if w.logLimit.allow(class, now) {
		w.log.Warn("relay failure", attrs...)
	} else {
		w.log.Debug("relay failure (repeat)", attrs...)
	}
	// The timer starts before the report goes out: whoever acts on the
	// report (a test advancing a fake clock) finds the retry already
	// waiting on it.
	retry := w.f.clock.After(d)
	w.report(&graspv1.FetchReport{Report: &graspv1.FetchReport_Health{Health: &graspv1.Health{
		State:               state,
		ConsecutiveFailures: uint32(w.health.Failures),
		NextAttempt:         now.Add(d).UnixMilli(),
		LastError:           err.Error(),
		FailureClass:        class,
	}}})
	return retry
}

// endSession closes the connection and everything of the session.
func (w *relayWorker) endSession(reason, class string, report bool) {
	s := w.sess
	if s == nil {
		return
	}
	s.cancel()
	w.closeLive()
	_ = s.conn.Close()
	w.tasks.Wait()
	w.sess = nil
	w.f.m.connected.WithLabelValues(w.url).Set(0)
	w.f.m.bytesIn.WithLabelValues(w.url).Add(float64(s.conn.BytesIn.Load()))
	if report {
		w.log.Warn("disconnected", "session", s.id, "reason", reason, "class", class)
		w.reportFor(s.id, &graspv1.FetchReport{Report: &graspv1.FetchReport_Disconnected{
			Disconnected: &graspv1.Disconnected{Reason: reason, FailureClass: class}}})
	}
}

// rateLimited starts a cooldown (from any goroutine) and has run report it.
func (w *relayWorker) rateLimited(msg string) {
	until, started := w.cooldown.Trigger()
	if !started {
		return
	}
	select {
	case w.signals <- signal{rateLimit: msg, until: until}:
	default:
	}
}

func (w *relayWorker) reportRateLimit(sig signal) {
	w.f.m.cooldowns.WithLabelValues(w.url).Inc()
	w.log.Warn("rate limited: cooling down", "message", sig.rateLimit, "until", sig.until)
	w.report(&graspv1.FetchReport{Report: &graspv1.FetchReport_RateLimited{RateLimited: &graspv1.RateLimited{
		Message: sig.rateLimit, Until: sig.until.UnixMilli()}}})
}

// connectedReport is what a Connected report says of the session: the
// relay's live filter budget, again when the planner asks again
// (EnsureConnected on a held session: a planner that restarted knows
// neither), and that the fetcher reads AddFilters.live_from_historic.
func (w *relayWorker) connectedReport() *graspv1.Connected {
	return &graspv1.Connected{LiveFilterBudget: w.liveFilterBudget(w.lims.effective()), LiveFromHistoric: true}
}

func (w *relayWorker) addFilters(c *graspv1.AddFilters) {
	if w.sess == nil {
		return
	}
	// A live set with a batch opens what is new; one without is a
	// consolidation's merge of sets already live (decision 0034).
	purpose := "live_new"
	if c.GetBatchId() == "" {
		purpose = "live_merge"
	}
	historic := filters.FromProtos(c.GetHistoricFilters())
	var live []nostr.Filter
	if from, ok := c.LiveFrom(); ok {
		live = filters.Live(historic[from:])
	} else {
		live = filters.FromProtos(c.GetLiveFilters())
	}
	// The live REQ carries the batch's history where it is read with REQ,
	// and waits for the batch's turn (combined.go).
	combine := w.combinable(c, historic, live)
	waiting := w.openLiveGroups(live, c.GetLiveId(), purpose, combine)
	if c.GetBatchId() == "" {
		return
	}
	spec := batchSpecOf(c, historic)
	spec.combined = waiting
	s := w.sess
	select {
	case s.pending <- struct{}{}:
	default:
		if waiting != nil {
			w.openWaiting(s, waiting, nil, nil)
		}
		w.log.Warn("too many pending batches; batch failed", "session", s.id, "batch", c.GetBatchId())
		w.reportFor(s.id, &graspv1.FetchReport{Report: &graspv1.FetchReport_BatchDone{BatchDone: &graspv1.BatchDone{
			BatchId: c.GetBatchId(), Outcome: graspv1.BatchOutcome_BATCH_OUTCOME_FAILED, Error: "too many pending batches on this relay"}}})
		return
	}
	w.tasks.Add(1)
	go func() {
		defer w.tasks.Done()
		defer func() { <-s.pending }()
		w.runBatch(s, spec)
	}()
}

func (w *relayWorker) report(r *graspv1.FetchReport) {
	session := ""
	if w.sess != nil {
		session = w.sess.id
	}
	w.reportFor(session, r)
}

// reportFor publishes a report for a session (safe from any goroutine).
func (w *relayWorker) reportFor(session string, r *graspv1.FetchReport) {
	r.RelayUrl = w.url
	r.SessionId = session
	r.Shard = uint32(w.shard)
	r.FetcherId = w.f.cfg.ID
	r.At = w.f.clock.Now().UnixMilli()
	subject := w.f.bus.Names.FetchReportSubject(w.shard)
	msg, err := bus.NewMsg(subject, r)
	if err != nil {
		w.log.Error("report lost", "session", session, "err", err)
		return
	}
	msg.Header.Set(nats.MsgIdHdr, fmt.Sprintf("fetcher-%s-%s-%d", w.f.cfg.ID, w.f.reportNonce, w.f.reportSeq.Add(1)))
	// A lost report (above all a BatchDone or a Connected) leaves the
	// planner waiting on a batch until the session ends, so a publish NATS
	// did not acknowledge is tried again for as long as the worker's shard
	// is held, and at least reportPublishAttempts times; the Nats-Msg-Id
	// makes a retry of a stored report a duplicate the stream drops
	// (docs/decisions/0048-fetcher-reports-retried.md, amended by
	// docs/decisions/0067-reports-retried-while-shard-held.md). The waits
	// are real time: they wait on the server, as the leases do.
	held := w.held
	if held == nil {
		held = context.Background()
	}
	wait := reportRetryFirstWait
	for attempt := 1; ; attempt++ {
		ctx, cancel := context.WithTimeout(context.Background(), reportAttemptTimeout)
		_, err = w.f.bus.JS.PublishMsg(ctx, msg)
		cancel()
		if err == nil {
			if attempt > reportPublishAttempts {
				w.log.Info("report acknowledged after retries", "session", session, "attempts", attempt)
			}
			return
		}
		if !bus.Transient(err) || (attempt >= reportPublishAttempts && held.Err() != nil) {
			w.log.Error("report lost", "session", session, "attempt", attempt, "err", fmt.Errorf("publish to %s: %w", subject, err))
			return
		}
		w.log.Warn("report not acknowledged; retrying", "session", session, "attempt", attempt, "wait", wait, "err", err)
		time.Sleep(wait)
		wait = min(2*wait, reportRetryMaxWait)
	}
}

// A report is tried until NATS acknowledges it while the worker's shard is
// held (a stream electing a leader after a node's loss can take longer
// than any fixed count of attempts on a loaded host), and
// reportPublishAttempts times when it is not (the Disconnected of a shard
// released). Each attempt waits up to reportAttemptTimeout for the
// stream's acknowledgement; the waits between them start at
// reportRetryFirstWait and double up to reportRetryMaxWait.
var (
	reportPublishAttempts = 5
	reportAttemptTimeout  = 5 * time.Second
	reportRetryFirstWait  = 250 * time.Millisecond
	reportRetryMaxWait    = 5 * time.Second
)

func newSessionID() string {
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
