package fetcher

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nbd-wtf/go-nostr"

	graspv1 "github.com/grasp-sync/grasp-sync/proto/grasp/v1"

	"github.com/grasp-sync/grasp-sync/pkg/bus"
	"github.com/grasp-sync/grasp-sync/pkg/filters"
	"github.com/grasp-sync/grasp-sync/pkg/history"
	"github.com/grasp-sync/grasp-sync/pkg/relayconn"
)

// relayWorker owns one relay: its connection, its session, its live
// subscriptions and its historic batches. Commands for the relay are
// executed in order by its run goroutine.
type relayWorker struct {
	f     *Fetcher
	url   string
	shard int
	log   *slog.Logger
	cmds  chan *graspv1.FetchCommand
	done  chan struct{}

	relay    *relayconn.Conn
	session  string
	failures int
	// sessionCtx ends when the session does; live subscriptions and batches
	// of the session run under it.
	sessionCtx    context.Context
	sessionCancel context.CancelFunc
	live          []*relayconn.Subscription
	tasks         sync.WaitGroup
}

func newRelayWorker(f *Fetcher, url string, shard int) *relayWorker {
	return &relayWorker{
		f:     f,
		url:   url,
		shard: shard,
		log:   f.log.With("relay", url, "shard", shard),
		cmds:  make(chan *graspv1.FetchCommand, 64),
		done:  make(chan struct{}),
	}
}

// run connects and keeps the relay connected until dropped or ctx ends.
func (w *relayWorker) run(ctx context.Context) {
	defer close(w.done)
	defer w.endSession("fetcher stopping", false)
	var retry <-chan time.Time
	want := false
	for {
		var lost <-chan struct{}
		if w.relay != nil {
			lost = w.relay.Context().Done()
		}
		select {
		case <-ctx.Done():
			return
		case <-retry:
			retry = nil
			if want && w.relay == nil {
				retry = w.connect(ctx)
			}
		case <-lost:
			w.endSession(fmt.Sprint(context.Cause(w.relay.Context())), true)
			retry = w.f.clock.After(w.backoff())
		case cmd := <-w.cmds:
			if cmd.GetSessionId() != "" && cmd.GetSessionId() != w.session {
				w.log.Debug("command for another session ignored", "session", cmd.GetSessionId(), "current", w.session)
				continue
			}
			switch c := cmd.GetCommand().(type) {
			case *graspv1.FetchCommand_EnsureConnected:
				want = true
				if w.relay != nil {
					w.report(&graspv1.FetchReport{Report: &graspv1.FetchReport_Connected{Connected: &graspv1.Connected{}}})
				} else if retry == nil {
					retry = w.connect(ctx)
				}
			case *graspv1.FetchCommand_AddFilters:
				w.addFilters(c.AddFilters)
			case *graspv1.FetchCommand_ReplaceLive:
				w.closeLive()
				w.openLive(filters.FromProtos(c.ReplaceLive.GetLiveFilters()))
			case *graspv1.FetchCommand_DropRelay:
				w.log.Info("relay dropped", "reason", c.DropRelay.GetReason())
				return
			}
		}
	}
}

// connect makes one attempt; on failure it returns the retry timer.
func (w *relayWorker) connect(ctx context.Context) <-chan time.Time {
	if err := w.f.guard.CheckURL(w.url); err != nil {
		w.f.connects.WithLabelValues("refused_address").Inc()
		w.log.Warn("relay address refused", "err", err)
		w.failures++
		return w.f.clock.After(w.backoff())
	}
	cctx, cancel := context.WithTimeout(ctx, w.f.cfg.ConnectTimeout)
	defer cancel()
	// The dialled address is vetted as it is dialled, so a name that
	// resolves to an internal address is refused (DNS-rebinding safe).
	r, err := relayconn.Dial(cctx, w.url, relayconn.Options{CheckDial: w.f.guard.CheckDial})
	if err != nil {
		w.f.connects.WithLabelValues("error").Inc()
		w.failures++
		d := w.backoff()
		w.log.Warn("connect failed", "err", err, "retry_in", d.String())
		w.report(&graspv1.FetchReport{Report: &graspv1.FetchReport_Health{Health: &graspv1.Health{
			State:               graspv1.HealthState_HEALTH_STATE_BACKING_OFF,
			ConsecutiveFailures: uint32(w.failures),
			NextAttempt:         w.f.clock.Now().Add(d).UnixMilli(),
			LastError:           err.Error(),
		}}})
		return w.f.clock.After(d)
	}
	w.f.connects.WithLabelValues("ok").Inc()
	w.failures = 0
	w.relay = r
	w.session = newSessionID()
	w.sessionCtx, w.sessionCancel = context.WithCancel(ctx)
	w.log.Info("connected", "session", w.session)
	w.report(&graspv1.FetchReport{Report: &graspv1.FetchReport_Connected{Connected: &graspv1.Connected{}}})
	return nil
}

func (w *relayWorker) backoff() time.Duration {
	n := max(w.failures, 1)
	d := w.f.cfg.BackoffBase
	for i := 1; i < n && d < w.f.cfg.BackoffMax; i++ {
		d *= 2
	}
	return min(d, w.f.cfg.BackoffMax)
}

// endSession closes the connection and everything of the session.
func (w *relayWorker) endSession(reason string, report bool) {
	if w.relay == nil {
		return
	}
	session := w.session
	w.sessionCancel()
	w.closeLive()
	w.relay.Close()
	w.tasks.Wait()
	w.relay = nil
	w.session = ""
	if report {
		w.failures++
		w.log.Warn("disconnected", "session", session, "reason", reason)
		w.reportFor(session, &graspv1.FetchReport{Report: &graspv1.FetchReport_Disconnected{Disconnected: &graspv1.Disconnected{Reason: reason}}})
	}
}

func (w *relayWorker) addFilters(c *graspv1.AddFilters) {
	if w.relay == nil {
		return
	}
	w.openLive(filters.FromProtos(c.GetLiveFilters()))
	if c.GetBatchId() == "" {
		return
	}
	hist := filters.FromProtos(c.GetHistoricFilters())
	if c.Since != nil {
		hist = filters.Since(hist, nostr.Timestamp(c.GetSince()))
	}
	relay, session, ctx := w.relay, w.session, w.sessionCtx
	w.tasks.Add(1)
	go func() {
		defer w.tasks.Done()
		w.runBatch(ctx, relay, session, c.GetBatchId(), hist)
	}()
}

// runBatch fetches a batch's history with REQ+EOSE and until pagination and
// reports it done.
func (w *relayWorker) runBatch(ctx context.Context, r *relayconn.Conn, session, batch string, hist []nostr.Filter) {
	var received, bytes uint64
	var err error
	for _, f := range hist {
		f.Limit = w.f.cfg.PageSize
		_, err = history.Read(ctx, r, f, w.f.cfg.MaxPages, func(evts []*nostr.Event) error {
			for _, e := range evts {
				n, err := w.publish(ctx, e, session, batch, "historic")
				if err != nil {
					return err
				}
				received++
				bytes += uint64(n)
			}
			return nil
		})
		if err != nil {
			break
		}
	}
	if ctx.Err() != nil {
		return // the session ended: its batches die with it, unreported
	}
	done := &graspv1.BatchDone{BatchId: batch, Outcome: graspv1.BatchOutcome_BATCH_OUTCOME_OK,
		Method: graspv1.SyncMethod_SYNC_METHOD_REQ, EventsReceived: received, BytesReceived: bytes}
	if err != nil {
		done.Outcome = graspv1.BatchOutcome_BATCH_OUTCOME_FAILED
		done.Error = err.Error()
	}
	w.log.Info("batch done", "session", session, "batch", batch, "events", received, "err", err)
	w.reportFor(session, &graspv1.FetchReport{Report: &graspv1.FetchReport_BatchDone{BatchDone: done}})
}

func (w *relayWorker) openLive(fs []nostr.Filter) {
	if w.relay == nil || len(fs) == 0 {
		return
	}
	sub, err := w.relay.Subscribe(w.sessionCtx, nostr.Filters(fs))
	if err != nil {
		w.log.Warn("live subscription failed", "err", err)
		return
	}
	w.live = append(w.live, sub)
	session, ctx := w.session, w.sessionCtx
	w.tasks.Add(1)
	go func() {
		defer w.tasks.Done()
		for {
			select {
			case evt := <-sub.Events():
				if _, err := w.publish(ctx, evt, session, "", "live"); err != nil && ctx.Err() == nil {
					w.log.Warn("publish live event", "id", evt.ID, "err", err)
				}
			case reason := <-sub.Closed():
				w.log.Warn("live subscription closed by relay", "reason", reason)
				return
			case <-sub.Done():
				return
			}
		}
	}()
}

func (w *relayWorker) closeLive() {
	for _, sub := range w.live {
		sub.Close()
	}
	w.live = nil
}

// publish checks an event's structure and id (the signature is the
// ingester's job) and publishes it for the ingesters. Nats-Msg-Id = event id,
// so the same event from many relays is ingested once.
func (w *relayWorker) publish(ctx context.Context, evt *nostr.Event, session, batch, mode string) (int, error) {
	if !evt.CheckID() {
		w.log.Debug("event with wrong id dropped", "id", evt.ID)
		return 0, nil
	}
	data, err := json.Marshal(evt)
	if err != nil {
		return 0, err
	}
	msg := nats.NewMsg(w.f.bus.Names.EventsSubject(w.shard))
	msg.Data = data
	msg.Header.Set(nats.MsgIdHdr, evt.ID)
	msg.Header.Set(bus.HeaderRelay, w.url)
	msg.Header.Set(bus.HeaderSession, session)
	msg.Header.Set(bus.HeaderMode, mode)
	if batch != "" {
		msg.Header.Set(bus.HeaderBatch, batch)
	}
	if err := w.f.publishEvent(ctx, msg); err != nil {
		return 0, err
	}
	w.f.events.WithLabelValues(mode).Inc()
	return len(data), nil
}

func (w *relayWorker) report(r *graspv1.FetchReport) { w.reportFor(w.session, r) }

func (w *relayWorker) reportFor(session string, r *graspv1.FetchReport) {
	r.RelayUrl = w.url
	r.SessionId = session
	r.Shard = uint32(w.shard)
	r.FetcherId = w.f.cfg.ID
	r.At = w.f.clock.Now().UnixMilli()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := w.f.bus.Publish(ctx, w.f.bus.Names.FetchReportSubject(w.shard), r); err != nil {
		w.log.Error("report lost", "err", err)
	}
}

// publishEvent publishes asynchronously with a bounded window: when the
// window is full it waits for acknowledgements instead of queueing more.
func (f *Fetcher) publishEvent(ctx context.Context, msg *nats.Msg) error {
	for {
		_, err := f.bus.JS.PublishMsgAsync(msg)
		if err == nil {
			return nil
		}
		if !errors.Is(err, nats.ErrTooManyStalledMsgs) && !errors.Is(err, errStalled) {
			return fmt.Errorf("publish event: %w", err)
		}
		select {
		case <-f.bus.JS.PublishAsyncComplete():
		case <-time.After(time.Second):
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

var errStalled = errors.New("stalled")

func newSessionID() string {
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
