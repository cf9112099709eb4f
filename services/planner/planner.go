package planner

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sync/errgroup"
	"google.golang.org/protobuf/proto"

	graspv1 "github.com/grasp-sync/grasp-sync/proto/grasp/v1"

	"github.com/grasp-sync/grasp-sync/pkg/bus"
	"github.com/grasp-sync/grasp-sync/pkg/clock"
	"github.com/grasp-sync/grasp-sync/pkg/config"
	"github.com/grasp-sync/grasp-sync/pkg/debounce"
	"github.com/grasp-sync/grasp-sync/pkg/leader"
	"github.com/grasp-sync/grasp-sync/pkg/policy"
)

// Config is the planner's configuration (GRASP_* variables). Fields
// tagged ignored:"true" are not read from the environment: their default
// tag is the value (New fills it; Validate for the fixed Rules), and tests
// set them in code. They are internal names and pacing no operator has a
// reason to change; they were variables once (docs/configuration.md, "No
// longer read").
type Config struct {
	// ID names this planner instance in the leadership lease.
	ID string `envconfig:"PLANNER_ID"`
	// Shards must equal the fetchers' shard count.
	Shards int `envconfig:"SHARDS" default:"16"`
	// RecomputeDelay coalesces the KV updates of one discovery batch into one
	// recompute: the recompute runs once updates have been quiet this long.
	RecomputeDelay time.Duration `envconfig:"PLANNER_RECOMPUTE_DELAY" default:"250ms"`
	// RecomputeMaxDelay caps that wait: updates that never pause for
	// RecomputeDelay are still recomputed this long after the first of them,
	// so a newly hosted repository is planned within it however busy
	// discovery is. A value below RecomputeDelay acts as RecomputeDelay.
	// The default is four quiet periods, so a discovery batch written within
	// a second is still one recompute (see docs/decisions/0004-planner-recompute-debounce.md).
	RecomputeMaxDelay time.Duration `ignored:"true" default:"1s"`
	// BootstrapRelays are kept connected whether or not a repository lists
	// them (union with the list discovery publishes in the index bucket).
	BootstrapRelays []string `envconfig:"BOOTSTRAP_RELAYS"`
	// Consumer is the durable name of the planner's report consumer: an
	// internal name every planner instance shares.
	Consumer string `ignored:"true" default:"planner"`
	// LeaseKey is the leadership role name in the lease bucket: an
	// internal name, like discovery's (discovery.LeaseKey).
	LeaseKey string `ignored:"true" default:"planner"`
	// Rules are the lifecycle constants.
	Rules
	// Archive is the archive settings (GRASP_ARCHIVE_*, GRASP-05), the
	// same the relay, the ingester and discovery read: layer 1 also asks
	// for the relay lists (10002) of the maintainers its whitelist names.
	policy.Archive
}

// Validate fills defaults and checks values. It runs on a Config read
// from the environment (config.Load), whose fixed rules it sets: the
// environment leaves them zero, and a zero ConsolidatePerTick would mean
// "consolidate at once".
func (c *Config) Validate() error {
	if c.ID == "" {
		c.ID = config.InstanceID()
	}
	c.Rules = c.Rules.withFixed()
	if c.Shards < 1 {
		return fmt.Errorf("GRASP_SHARDS=%d: must be at least 1", c.Shards)
	}
	if c.ResyncMax < c.ResyncMin {
		return fmt.Errorf("GRASP_PLANNER_RESYNC_MAX=%s: must not be below GRASP_PLANNER_RESYNC_MIN=%s", c.ResyncMax, c.ResyncMin)
	}
	return nil
}

// Planner is the planner service. All decision state is owned by the
// goroutine running the current leadership term.
type Planner struct {
	cfg     Config
	bus     *bus.Bus
	clock   clock.Clock
	log     *slog.Logger
	metrics *Metrics
}

// New builds a planner. Zero rules are replaced by DefaultRules; other zero
// fields take their default tags, except RecomputeDelay, whose zero in a
// Config built in code means "recompute at once".
func New(cfg Config, b *bus.Bus, clk clock.Clock, log *slog.Logger, reg prometheus.Registerer) *Planner {
	if cfg.Rules == (Rules{}) {
		cfg.Rules = DefaultRules()
	}
	// Rules are complete here (a zero Heartbeat or ConsolidatePerTick
	// means "off"), so the tags fill only the planner's own fields.
	rules, delay := cfg.Rules, cfg.RecomputeDelay
	config.FillDefaults(&cfg)
	cfg.Rules, cfg.RecomputeDelay = rules, delay
	if cfg.ID == "" {
		cfg.ID = config.InstanceID()
	}
	return &Planner{cfg: cfg, bus: b, clock: clk, log: log.With("service", "planner", "planner", cfg.ID), metrics: NewMetrics(reg)}
}

// Run campaigns for leadership and plans while leading, until ctx is done.
// Only one planner is active; standbys take over when its lease lapses.
func (p *Planner) Run(ctx context.Context) error {
	kv, err := p.bus.JS.KeyValue(ctx, p.bus.Names.LeaseBucket())
	if err != nil {
		return fmt.Errorf("open lease bucket %s: %w", p.bus.Names.LeaseBucket(), err)
	}
	for {
		err := leader.Run(ctx, leader.Config{KV: kv, Key: p.cfg.LeaseKey, ID: p.cfg.ID, Clock: clock.Real{}, Log: p.log}, p.lead)
		if ctx.Err() != nil {
			return nil
		}
		// A failed term (NATS trouble) is not fatal: campaign again.
		p.log.Error("planner term failed; campaigning again", "err", err)
		select {
		case <-ctx.Done():
			return nil
		case <-p.clock.After(time.Second):
		}
	}
}

// reports is a batch of fetch reports that were waiting together, handed
// from the consumer to the term; done receives the flush's outcome, and the
// batch is acknowledged only after it.
type reports struct {
	rs   []*graspv1.FetchReport
	done chan error
}

// reportBatch is the most reports handled before one flush. A backlog of
// reports is what a slow flush leaves behind (each flush waits for its
// commands' and records' acknowledgements, a quorum round trip in a cluster),
// so handling the backlog together keeps the planner's pace with the fetchers
// (docs/decisions/0072-planner-reports-in-batches.md).
const reportBatch = 128

// term is one leadership term's I/O around a fresh Machine.
type term struct {
	p       *Planner
	m       *Machine
	epoch   uint64
	log     *slog.Logger
	stateKV jetstream.KeyValue
	bootKV  []string
	sent    uint64 // commands published this term, for their Nats-Msg-Id
}

// lead plans for one leadership term. The machine starts from the persisted
// relay records, so a new leader resumes where the previous one stopped.
func (p *Planner) lead(ctx context.Context, epoch uint64) error {
	log := p.log.With("epoch", epoch)
	p.metrics.leader.Set(1)
	p.metrics.epoch.Set(float64(epoch))
	defer p.metrics.forget()

	indexKV, err := p.bus.JS.KeyValue(ctx, p.bus.Names.RepoIndexBucket())
	if err != nil {
		return fmt.Errorf("open %s: %w", p.bus.Names.RepoIndexBucket(), err)
	}
	stateKV, err := p.bus.JS.KeyValue(ctx, p.bus.Names.RelayStateBucket())
	if err != nil {
		return fmt.Errorf("open %s: %w", p.bus.Names.RelayStateBucket(), err)
	}
	w, err := indexKV.WatchAll(ctx)
	if err != nil {
		return fmt.Errorf("watch %s: %w", p.bus.Names.RepoIndexBucket(), err)
	}
	defer func() { _ = w.Stop() }()

	t := &term{p: p, epoch: epoch, log: log, stateKV: stateKV}
	t.m = NewMachine(p.cfg.Rules, NewIndex(), epoch, rand.Float64, p.metrics)
	t.m.SetArchiveAuthors(p.cfg.Archive.Whitelist.Pubkeys())

	// The index's current values, up to the nil marker, before anything is
	// decided: restoring confirmed state needs the roots it refers to.
	var n int
	for initial := true; initial; {
		select {
		case <-ctx.Done():
			return nil
		case e, ok := <-w.Updates():
			if !ok {
				return errors.New("index watch ended")
			}
			if e == nil {
				initial = false
				break
			}
			t.applyIndex(e)
			p.metrics.indexUpdates.Inc()
			n++
		}
	}
	t.m.SetBootstrap(t.bootstrap())
	states, err := t.loadStates(ctx)
	if err != nil {
		return err
	}
	mismatched := t.m.Restore(states)
	log.Info("leading", "repos", n, "relays_restored", len(states), "confirmed_sets_changed", mismatched)
	start := p.clock.Now()
	t.m.Recompute(start, true)
	p.metrics.recompute.Observe(time.Since(start).Seconds())
	if err := t.flush(ctx); err != nil {
		return err
	}

	batches := make(chan reports)
	consumeErr := make(chan error, 1)
	cctx, cancelConsume := context.WithCancel(ctx)
	defer cancelConsume()
	go func() {
		consumeErr <- p.bus.ConsumeBatches(cctx, bus.ConsumeConfig{
			Stream: p.bus.Names.FetchReportStream(),
			Consumer: jetstream.ConsumerConfig{
				Durable:       p.cfg.Consumer,
				FilterSubject: p.bus.Names.FetchReportSubjects(),
				DeliverPolicy: jetstream.DeliverNewPolicy,
			},
			Log: log,
		}, reportBatch, func(ctx context.Context, msgs []jetstream.Msg) error {
			rs := make([]*graspv1.FetchReport, 0, len(msgs))
			for _, msg := range msgs {
				var r graspv1.FetchReport
				if err := bus.Decode(msg.Data(), msg.Headers(), &r); err != nil {
					// Retrying cannot fix it; the rest of the batch is good.
					log.Warn("undecodable report dropped", "subject", msg.Subject(), "err", err)
					continue
				}
				rs = append(rs, &r)
			}
			if len(rs) == 0 {
				return nil
			}
			done := make(chan error, 1)
			select {
			case batches <- reports{rs: rs, done: done}:
			case <-ctx.Done():
				return ctx.Err()
			}
			// Acked only after the resulting commands were sent and state
			// was persisted, so a successor never misses its effect.
			select {
			case err := <-done:
				return err
			case <-ctx.Done():
				return ctx.Err()
			}
		})
	}()
	defer func() { cancelConsume(); <-consumeErr }()

	// recompute fires when the pending index updates are due (debounce);
	// it is armed at a burst's first update and re-armed if more updates
	// arrived meanwhile, so a burst costs a few timers, not one per update.
	var recompute <-chan time.Time
	pending := debounce.New(p.cfg.RecomputeDelay, p.cfg.RecomputeMaxDelay)
	var timer <-chan time.Time
	var timerAt time.Time
	// deadlinesKept is set after an index update: applying one moves no
	// relay's deadline (ApplyIndex only marks what the next recompute
	// diffs), and NextDeadline visits every relay. A sync applies an update
	// per repository and per stored root, so at 1,000 relays that visit was
	// 1.5 % of graspd's CPU (docs/measurements/2026-12-07-issue32-growth-profiles.md).
	deadlinesKept := false
	for {
		if !deadlinesKept {
			if next := t.m.NextDeadline(); !next.Equal(timerAt) {
				timerAt = next
				timer = nil
				if !next.IsZero() {
					timer = p.clock.After(next.Sub(p.clock.Now()))
				}
			}
		}
		deadlinesKept = false
		select {
		case <-ctx.Done():
			return nil
		case err := <-consumeErr:
			consumeErr <- err // for the deferred wait
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("report consumer: %w", err)
		case e, ok := <-w.Updates():
			if !ok {
				return errors.New("index watch ended")
			}
			if e == nil {
				continue
			}
			if t.applyIndex(e) {
				t.m.SetBootstrap(t.bootstrap())
			}
			deadlinesKept = true
			p.metrics.indexUpdates.Inc()
			now := p.clock.Now()
			pending.Updated(now)
			if recompute == nil {
				recompute = p.clock.After(pending.Due().Sub(now))
			}
		case <-recompute:
			recompute = nil
			if now := p.clock.Now(); now.Before(pending.Due()) {
				// Updates arrived since the timer was armed: wait until
				// they have been quiet (or the burst's maximum wait).
				recompute = p.clock.After(pending.Due().Sub(now))
				continue
			}
			pending.Done()
			start := time.Now()
			t.m.Recompute(p.clock.Now(), false)
			p.metrics.recompute.Observe(time.Since(start).Seconds())
			if err := t.flush(ctx); err != nil {
				return err
			}
		case <-timer:
			timer, timerAt = nil, time.Time{}
			t.m.Tick(p.clock.Now())
			if err := t.flush(ctx); err != nil {
				return err
			}
		case batch := <-batches:
			now := p.clock.Now()
			for _, r := range batch.rs {
				t.m.HandleReport(now, r)
			}
			p.metrics.reportBatch.Observe(float64(len(batch.rs)))
			err := t.flush(ctx)
			batch.done <- err
			if err != nil {
				return err
			}
		}
	}
}

// applyIndex applies one KV entry to the machine's index; it reports
// whether the entry was the bootstrap relay list.
func (t *term) applyIndex(e jetstream.KeyValueEntry) (bootstrap bool) {
	idx := t.m.Index()
	if e.Key() == bus.BootstrapRelaysKey {
		t.bootKV = nil
		if e.Operation() == jetstream.KeyValuePut {
			var b graspv1.BootstrapRelays
			if err := proto.Unmarshal(e.Value(), &b); err != nil {
				t.log.Warn("undecodable bootstrap relay list", "err", err)
			} else {
				t.bootKV = b.GetRelays()
			}
		}
		return true
	}
	if e.Operation() != jetstream.KeyValuePut {
		t.m.ApplyIndex([]IndexChange{idx.Delete(e.Key())})
		return false
	}
	var needs graspv1.RepoSyncNeeds
	if err := proto.Unmarshal(e.Value(), &needs); err != nil {
		t.log.Warn("undecodable index entry", "key", e.Key(), "err", err)
		return false
	}
	t.m.ApplyIndex([]IndexChange{idx.Put(e.Key(), &needs)})
	return false
}

func (t *term) bootstrap() []string {
	all := append(slices.Clone(t.p.cfg.BootstrapRelays), t.bootKV...)
	slices.Sort(all)
	return slices.Compact(all)
}

func (t *term) loadStates(ctx context.Context) ([]*graspv1.RelayState, error) {
	lister, err := t.stateKV.ListKeys(ctx)
	if err != nil {
		return nil, fmt.Errorf("list relay states: %w", err)
	}
	var out []*graspv1.RelayState
	for key := range lister.Keys() {
		if !strings.HasPrefix(key, bus.RelayStateKeyPrefix) {
			continue
		}
		e, err := t.stateKV.Get(ctx, key)
		if errors.Is(err, jetstream.ErrKeyNotFound) || errors.Is(err, jetstream.ErrKeyDeleted) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("read relay state %s: %w", key, err)
		}
		var st graspv1.RelayState
		if err := proto.Unmarshal(e.Value(), &st); err != nil {
			t.log.Warn("undecodable relay state ignored", "key", key, "err", err)
			continue
		}
		out = append(out, &st)
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	return out, nil
}

// flush sends the machine's commands, then persists the relay records that
// changed. Commands first: a record never claims more than what was asked of
// the fetchers.
//
// A fetcher sees the commands of one relay in the order the machine made
// them, because a relay's commands all go to its shard's subject and each
// shard's commands are published one after another, each waiting for its
// acknowledgement; different shards' commands, which no fetcher orders
// against each other, are published side by side, and the records are
// written side by side (each relay's once), so a flush waits for about as
// many round trips as its busiest shard has commands rather than for one per
// command and one per record (docs/decisions/0072-planner-reports-in-batches.md).
func (t *term) flush(ctx context.Context) error {
	start := time.Now()
	defer func() { t.p.metrics.flush.Observe(time.Since(start).Seconds()) }()
	cmds := t.m.Drain()
	// Commands are encoded as their turn to be published comes, not all
	// before the first is sent: a flush during an initial sync carries
	// hundreds of batches, and their encoded copies were 16–24 MB of
	// graspd's live heap at the target world's peak
	// (docs/decisions/0075-what-waits-is-kept-small.md). Message ids are
	// numbered in the order drained.
	type pending struct {
		cmd *graspv1.FetchCommand
		seq uint64
	}
	var shards []string
	byShard := map[string][]pending{}
	for _, cmd := range cmds {
		subject := t.p.bus.Names.FetchCmdSubject(bus.ShardOf(cmd.GetRelayUrl(), t.p.cfg.Shards))
		t.sent++
		if _, ok := byShard[subject]; !ok {
			shards = append(shards, subject)
		}
		byShard[subject] = append(byShard[subject], pending{cmd, t.sent})
	}
	if err := t.eachConcurrently(ctx, len(shards), func(ctx context.Context, i int) error {
		for _, c := range byShard[shards[i]] {
			msg, err := bus.NewMsg(shards[i], c.cmd)
			if err != nil {
				return fmt.Errorf("encode command to %s: %w", c.cmd.GetRelayUrl(), err)
			}
			msg.Header.Set(nats.MsgIdHdr, fmt.Sprintf("planner-%d-%d", t.epoch, c.seq))
			if err := t.publish(ctx, msg); err != nil {
				return err
			}
			t.p.metrics.commandBytes.WithLabelValues(commandName(c.cmd)).Add(float64(len(msg.Data)))
		}
		return nil
	}); err != nil {
		return err
	}
	for _, cmd := range cmds {
		name := commandName(cmd)
		t.p.metrics.commands.WithLabelValues(name).Inc()
		attrs := []any{"relay", cmd.GetRelayUrl(), "session", cmd.GetSessionId(), "command", name}
		if add := cmd.GetAddFilters(); add != nil {
			attrs = append(attrs, "batch", add.GetBatchId(), "repos", len(add.GetRepoRefs()), "roots", add.RootCount(),
				"live", add.LiveLen(), "historic", len(add.GetHistoricFilters()), "since", add.GetSince())
		}
		if rl := cmd.GetReplaceLive(); rl != nil {
			attrs = append(attrs, "live", len(rl.GetLiveFilters()))
		}
		t.log.Debug("command sent", attrs...)
	}
	t.p.metrics.queue(t.m)
	changed, dropped := t.m.TakeDirty()
	now := t.p.clock.Now()
	records := make([][]byte, len(changed))
	for i, s := range changed {
		data, err := proto.Marshal(t.m.Snapshot(s, now))
		if err != nil {
			return fmt.Errorf("encode relay state %s: %w", s.URL, err)
		}
		records[i] = data
	}
	if err := t.eachConcurrently(ctx, len(changed), func(ctx context.Context, i int) error {
		if _, err := t.stateKV.Put(ctx, bus.RelayStateKey(changed[i].URL), records[i]); err != nil {
			return fmt.Errorf("persist relay state %s: %w", changed[i].URL, err)
		}
		return nil
	}); err != nil {
		return err
	}
	for _, s := range changed {
		t.p.metrics.relayChanged(s)
	}
	if err := t.eachConcurrently(ctx, len(dropped), func(ctx context.Context, i int) error {
		if err := t.stateKV.Delete(ctx, bus.RelayStateKey(dropped[i])); err != nil && !errors.Is(err, jetstream.ErrKeyNotFound) {
			return fmt.Errorf("delete relay state %s: %w", dropped[i], err)
		}
		return nil
	}); err != nil {
		return err
	}
	for _, url := range dropped {
		t.p.metrics.relayDropped(url)
		t.log.Info("relay dropped", "relay", url)
	}
	if len(changed) > 0 || len(dropped) > 0 {
		t.p.metrics.totals(t.m.Relays())
	}
	return nil
}

// flushConcurrency is the most publishes or record writes one flush has
// waiting for their acknowledgements at once.
const flushConcurrency = 32

// eachConcurrently runs do for 0..n-1, at most flushConcurrency at once,
// and returns the first error; the others' context is cancelled by it.
func (t *term) eachConcurrently(ctx context.Context, n int, do func(ctx context.Context, i int) error) error {
	if n == 1 {
		return do(ctx, 0)
	}
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(flushConcurrency)
	for i := range n {
		g.Go(func() error { return do(gctx, i) })
	}
	return g.Wait()
}

// Retries of a command the stream did not acknowledge: waits of 100 ms
// doubling, so about 3 s of waiting (plus each attempt's own timeout) before
// the term gives up.
const (
	commandPublishAttempts = 6
	commandRetryFirstWait  = 100 * time.Millisecond
)

// publish sends one command and waits for the stream's acknowledgement,
// retrying what a busy or restarting NATS recovers from. Giving up ends the
// term, and a new term starts by catching up every relay, so a single
// acknowledgement lost under load must not cost that (docs/decisions/0038-planner-lost-ack-retried.md). Each command
// carries a Nats-Msg-Id unique to the term (epoch, sequence): when a publish
// was stored but its acknowledgement lost, the retry is a duplicate the
// stream drops, so a fetcher never runs a command twice.
func (t *term) publish(ctx context.Context, msg *nats.Msg) error {
	wait := commandRetryFirstWait
	for attempt := 1; ; attempt++ {
		_, err := t.p.bus.JS.PublishMsg(ctx, msg)
		if err == nil {
			return nil
		}
		if ctx.Err() != nil || !bus.Transient(err) || attempt == commandPublishAttempts {
			return fmt.Errorf("publish to %s (attempt %d): %w", msg.Subject, attempt, err)
		}
		t.log.Warn("command not acknowledged; retrying", "subject", msg.Subject, "attempt", attempt, "wait", wait, "err", err)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.p.clock.After(wait):
		}
		wait *= 2
	}
}

func commandName(cmd *graspv1.FetchCommand) string {
	r := cmd.ProtoReflect()
	if f := r.WhichOneof(r.Descriptor().Oneofs().ByName("command")); f != nil {
		return string(f.Name())
	}
	return "unknown"
}
