// Package planner decides what to fetch from which relay. It mirrors the
// RepoSyncIndex from KV, derives per-relay targets, runs ComputeActions once
// per discovery batch, follows each relay's lifecycle from fetcher reports,
// and sends fetch commands to the fetcher owning the relay's shard. It is the
// only place that decides what to subscribe to.
package planner

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/nbd-wtf/go-nostr"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/protobuf/proto"

	graspv1 "github.com/grasp-sync/grasp-sync/proto/grasp/v1"

	"github.com/grasp-sync/grasp-sync/pkg/bus"
	"github.com/grasp-sync/grasp-sync/pkg/clock"
	"github.com/grasp-sync/grasp-sync/pkg/filters"
	"github.com/grasp-sync/grasp-sync/pkg/nip34"
)

// Config is the planner's configuration (GRASP_* variables).
type Config struct {
	// Shards must equal the fetchers' shard count.
	Shards int `envconfig:"SHARDS" default:"16"`
	// RecomputeDelay coalesces the KV updates of one discovery batch into one
	// recompute: the recompute runs once updates have been quiet this long.
	RecomputeDelay time.Duration `envconfig:"PLANNER_RECOMPUTE_DELAY" default:"250ms"`
	// BootstrapRelays are kept connected whether or not a repository lists
	// them.
	BootstrapRelays []string `envconfig:"BOOTSTRAP_RELAYS"`
	// Consumer is the durable name of the planner's report consumer.
	Consumer string `envconfig:"PLANNER_CONSUMER" default:"planner"`
}

// Planner is the planner service. All state is owned by the Run goroutine.
type Planner struct {
	cfg   Config
	bus   *bus.Bus
	clock clock.Clock
	log   *slog.Logger
	epoch uint64

	index  map[string]*graspv1.RepoSyncNeeds
	relays map[string]*RelayState

	commands *prometheus.CounterVec
}

// New builds a planner.
func New(cfg Config, b *bus.Bus, clk clock.Clock, log *slog.Logger, reg prometheus.Registerer) *Planner {
	p := &Planner{
		cfg:    cfg,
		bus:    b,
		clock:  clk,
		log:    log.With("service", "planner"),
		index:  map[string]*graspv1.RepoSyncNeeds{},
		relays: map[string]*RelayState{},
		commands: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "grasp_planner_commands_total",
			Help: "Fetch commands sent, by command.",
		}, []string{"command"}),
	}
	if reg != nil {
		reg.MustRegister(p.commands)
	}
	return p
}

type report struct {
	r    *graspv1.FetchReport
	done chan error
}

// Run plans until ctx is done.
func (p *Planner) Run(ctx context.Context) error {
	epoch, err := p.nextEpoch(ctx)
	if err != nil {
		return err
	}
	p.epoch = epoch
	p.log.Info("planner started", "epoch", epoch)

	kv, err := p.bus.JS.KeyValue(ctx, p.bus.Names.RepoIndexBucket())
	if err != nil {
		return fmt.Errorf("open %s: %w", p.bus.Names.RepoIndexBucket(), err)
	}
	w, err := kv.WatchAll(ctx)
	if err != nil {
		return fmt.Errorf("watch %s: %w", p.bus.Names.RepoIndexBucket(), err)
	}
	defer w.Stop()

	reports := make(chan report)
	consumeErr := make(chan error, 1)
	go func() {
		consumeErr <- p.bus.Consume(ctx, bus.ConsumeConfig{
			Stream: p.bus.Names.FetchReportStream(),
			Consumer: jetstream.ConsumerConfig{
				Durable:       p.cfg.Consumer,
				FilterSubject: p.bus.Names.FetchReportSubjects(),
				DeliverPolicy: jetstream.DeliverNewPolicy,
			},
			Log: p.log,
		}, func(ctx context.Context, msg jetstream.Msg) error {
			var r graspv1.FetchReport
			if err := bus.Decode(msg.Data(), msg.Headers(), &r); err != nil {
				return fmt.Errorf("%w: %v", bus.ErrPermanent, err)
			}
			done := make(chan error, 1)
			select {
			case reports <- report{r: &r, done: done}:
			case <-ctx.Done():
				return ctx.Err()
			}
			return <-done
		})
	}()

	var recompute <-chan time.Time
	for {
		select {
		case <-ctx.Done():
			<-consumeErr
			return nil
		case err := <-consumeErr:
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("report consumer: %w", err)
		case e, ok := <-w.Updates():
			if !ok {
				return errors.New("index watch ended")
			}
			if e != nil {
				p.applyIndex(e)
			}
			// nil marks the end of the initial values: plan right away.
			if e == nil {
				recompute = p.clock.After(0)
			} else if recompute == nil {
				recompute = p.clock.After(p.cfg.RecomputeDelay)
			}
		case <-recompute:
			recompute = nil
			p.recompute(ctx)
		case rep := <-reports:
			rep.done <- p.handleReport(ctx, rep.r)
		}
	}
}

func (p *Planner) applyIndex(e jetstream.KeyValueEntry) {
	if e.Operation() != jetstream.KeyValuePut {
		delete(p.index, e.Key())
		return
	}
	var needs graspv1.RepoSyncNeeds
	if err := proto.Unmarshal(e.Value(), &needs); err != nil {
		p.log.Warn("undecodable index entry", "key", e.Key(), "err", err)
		return
	}
	p.index[e.Key()] = &needs
}

// recompute runs ComputeActions over the whole index and sends the commands.
func (p *Planner) recompute(ctx context.Context) {
	targets := DeriveRelayTargets(p.index, p.cfg.BootstrapRelays)
	for _, a := range ComputeActions(targets, p.relays) {
		if err := p.execute(ctx, a); err != nil {
			p.log.Error("command failed", "relay", a.Relay, "err", err)
		}
	}
}

func (p *Planner) execute(ctx context.Context, a Action) error {
	switch a.Kind {
	case ActionEnsureConnected:
		s := NewRelayState(a.Relay)
		s.Status = graspv1.RelayStatus_RELAY_STATUS_CONNECTING
		for _, b := range p.cfg.BootstrapRelays {
			s.Bootstrap = s.Bootstrap || b == a.Relay
		}
		p.relays[a.Relay] = s
		return p.send(ctx, &graspv1.FetchCommand{RelayUrl: a.Relay, Command: &graspv1.FetchCommand_EnsureConnected{EnsureConnected: &graspv1.EnsureConnected{}}})
	case ActionAddFilters:
		return p.addItems(ctx, p.relays[a.Relay], a.Repos, a.Roots)
	case ActionDropRelay:
		delete(p.relays, a.Relay)
		return p.send(ctx, &graspv1.FetchCommand{RelayUrl: a.Relay, Command: &graspv1.FetchCommand_DropRelay{DropRelay: &graspv1.DropRelay{Reason: "no repository lists this relay"}}})
	}
	return fmt.Errorf("unknown action %d", a.Kind)
}

// addItems starts one PendingBatch for new repositories and roots: live
// subscriptions plus their history.
func (p *Planner) addItems(ctx context.Context, s *RelayState, repos, roots []string) error {
	var fs []nostr.Filter
	fs = append(fs, filters.Layer2(repos)...)
	fs = append(fs, filters.States(identifiers(repos))...)
	fs = append(fs, filters.Layer3(roots)...)
	b := &PendingBatch{ID: newBatchID(), Repos: repos, Roots: roots, Started: p.clock.Now()}
	s.Pending[b.ID] = b
	return p.send(ctx, &graspv1.FetchCommand{
		RelayUrl:  s.URL,
		SessionId: s.Session,
		Command: &graspv1.FetchCommand_AddFilters{AddFilters: &graspv1.AddFilters{
			BatchId:         b.ID,
			RepoRefs:        repos,
			RootEventIds:    roots,
			LiveFilters:     filters.ToProtos(filters.Live(fs)),
			HistoricFilters: filters.ToProtos(fs),
		}},
	})
}

func identifiers(repoRefs []string) []string {
	var out []string
	for _, r := range repoRefs {
		if ref, ok := nip34.ParseRepoRef(r); ok {
			out = append(out, ref.Identifier)
		}
	}
	return out
}

func (p *Planner) send(ctx context.Context, cmd *graspv1.FetchCommand) error {
	cmd.Epoch = p.epoch
	subject := p.bus.Names.FetchCmdSubject(bus.ShardOf(cmd.RelayUrl, p.cfg.Shards))
	if err := p.bus.Publish(ctx, subject, cmd); err != nil {
		return err
	}
	name := string(cmd.ProtoReflect().WhichOneof(cmd.ProtoReflect().Descriptor().Oneofs().ByName("command")).Name())
	p.commands.WithLabelValues(name).Inc()
	p.log.Debug("command sent", "relay", cmd.RelayUrl, "session", cmd.SessionId, "command", name)
	return nil
}

// handleReport advances a relay's lifecycle. Reports for a session other
// than the relay's current one are ignored: an EOSE from a dead connection
// must not confirm a batch whose subscriptions no longer exist.
func (p *Planner) handleReport(ctx context.Context, r *graspv1.FetchReport) error {
	s, ok := p.relays[r.GetRelayUrl()]
	if !ok {
		return nil
	}
	log := p.log.With("relay", s.URL, "session", r.GetSessionId())
	switch rep := r.GetReport().(type) {
	case *graspv1.FetchReport_Connected:
		return p.freshStart(ctx, s, r.GetSessionId())
	case *graspv1.FetchReport_Disconnected:
		if r.GetSessionId() != s.Session {
			return nil
		}
		log.Info("relay disconnected", "reason", rep.Disconnected.GetReason())
		s.Status = graspv1.RelayStatus_RELAY_STATUS_DISCONNECTED
		s.Session = ""
		s.DisconnectedAt = p.clock.Now()
		clear(s.Pending)
	case *graspv1.FetchReport_BatchDone:
		if r.GetSessionId() != s.Session {
			return nil
		}
		b, ok := s.Pending[rep.BatchDone.GetBatchId()]
		if !ok {
			return nil
		}
		delete(s.Pending, b.ID)
		if rep.BatchDone.GetOutcome() != graspv1.BatchOutcome_BATCH_OUTCOME_OK {
			s.BatchFailures++
			log.Warn("batch failed", "batch", b.ID, "err", rep.BatchDone.GetError())
		} else {
			for _, r := range b.Repos {
				s.ConfirmedRepos[r] = struct{}{}
			}
			for _, r := range b.Roots {
				s.ConfirmedRoots[r] = struct{}{}
			}
		}
		log.Info("batch done", "batch", b.ID, "outcome", rep.BatchDone.GetOutcome().String(),
			"events", rep.BatchDone.GetEventsReceived(), "pending", len(s.Pending))
		if len(s.Pending) == 0 {
			s.Status = graspv1.RelayStatus_RELAY_STATUS_CONNECTED
			if s.BatchFailures > 0 {
				s.Status = graspv1.RelayStatus_RELAY_STATUS_CONNECTED_HISTORIC_SYNC_FAILURES
			}
		}
	}
	return nil
}

// freshStart begins a relay's sync from nothing on a new session: layer 1
// live and historic, then everything its target needs.
func (p *Planner) freshStart(ctx context.Context, s *RelayState, session string) error {
	if session == s.Session && s.connected() {
		return nil // the same session reported again
	}
	p.log.Info("relay connected: fresh start", "relay", s.URL, "session", session)
	*s = *NewRelayState(s.URL)
	s.Session = session
	s.Status = graspv1.RelayStatus_RELAY_STATUS_SYNCING
	s.LastConnected = p.clock.Now()

	targets := DeriveRelayTargets(p.index, p.cfg.BootstrapRelays)
	var ids []string
	if t := targets[s.URL]; t != nil {
		for r := range t.Repos {
			ids = append(ids, r)
		}
	}
	l1 := filters.Layer1(identifiers(ids))
	b := &PendingBatch{ID: newBatchID(), Layer1: true, Started: p.clock.Now()}
	s.Pending[b.ID] = b
	if err := p.send(ctx, &graspv1.FetchCommand{
		RelayUrl:  s.URL,
		SessionId: session,
		Command: &graspv1.FetchCommand_AddFilters{AddFilters: &graspv1.AddFilters{
			BatchId:         b.ID,
			Layer1:          true,
			LiveFilters:     filters.ToProtos(filters.Live(l1)),
			HistoricFilters: filters.ToProtos(l1),
		}},
	}); err != nil {
		return err
	}
	for _, a := range ComputeActions(map[string]*RelayTarget{s.URL: targets[s.URL]}, map[string]*RelayState{s.URL: s}) {
		if a.Kind == ActionAddFilters {
			if err := p.addItems(ctx, s, a.Repos, a.Roots); err != nil {
				return err
			}
		}
	}
	return nil
}

// nextEpoch increments the planner epoch in KV (compare-and-set), so every
// command of this planner instance carries an epoch newer than any before.
func (p *Planner) nextEpoch(ctx context.Context) (uint64, error) {
	kv, err := p.bus.JS.KeyValue(ctx, p.bus.Names.RelayStateBucket())
	if err != nil {
		return 0, fmt.Errorf("open %s: %w", p.bus.Names.RelayStateBucket(), err)
	}
	const key = "planner-epoch"
	for range 10 {
		e, err := kv.Get(ctx, key)
		var rec graspv1.PlannerEpoch
		var rev uint64
		switch {
		case errors.Is(err, jetstream.ErrKeyNotFound):
		case err != nil:
			return 0, fmt.Errorf("read planner epoch: %w", err)
		default:
			rev = e.Revision()
			if err := proto.Unmarshal(e.Value(), &rec); err != nil {
				return 0, fmt.Errorf("decode planner epoch: %w", err)
			}
		}
		rec.Epoch++
		data, _ := proto.Marshal(&rec)
		if rev == 0 {
			_, err = kv.Create(ctx, key, data)
		} else {
			_, err = kv.Update(ctx, key, data, rev)
		}
		if err == nil {
			return rec.Epoch, nil
		}
	}
	return 0, errors.New("planner epoch: too many concurrent updates")
}

func newBatchID() string {
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
