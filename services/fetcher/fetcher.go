// Package fetcher owns the websocket connections to remote relays. It
// executes the planner's commands for the shards it owns — connect, open live
// subscriptions, fetch history in batches, drop — publishes every event it
// receives to grasp.events.<shard> and every lifecycle fact to
// grasp.fetch.report.<shard>. It decides nothing about what to fetch.
package fetcher

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sync/errgroup"

	graspv1 "github.com/grasp-sync/grasp-sync/proto/grasp/v1"

	"github.com/grasp-sync/grasp-sync/pkg/bus"
	"github.com/grasp-sync/grasp-sync/pkg/clock"
	"github.com/grasp-sync/grasp-sync/pkg/config"
	"github.com/grasp-sync/grasp-sync/pkg/relayurl"
)

// Config is the fetcher's configuration (GRASP_* variables).
type Config struct {
	// ID names this replica in reports and consumer names.
	ID string `envconfig:"FETCHER_ID"`
	// Shards is the total shard count (equal in planner and fetchers).
	Shards int `envconfig:"SHARDS" default:"16"`
	// OwnedShards are the shards this replica serves; empty means all.
	OwnedShards []int `envconfig:"FETCHER_SHARDS"`
	// PageSize is the limit of each historic REQ page.
	PageSize int `envconfig:"FETCHER_PAGE_SIZE" default:"500"`
	// MaxPages bounds one historic filter's pagination.
	MaxPages int `envconfig:"FETCHER_MAX_PAGES" default:"10000"`
	// ConnectTimeout bounds one connection attempt.
	ConnectTimeout time.Duration `envconfig:"FETCHER_CONNECT_TIMEOUT" default:"10s"`
	// BackoffBase and BackoffMax shape reconnect backoff: base × 2^(n−1),
	// capped.
	BackoffBase time.Duration `envconfig:"FETCHER_BACKOFF_BASE" default:"5s"`
	BackoffMax  time.Duration `envconfig:"FETCHER_BACKOFF_MAX" default:"1h"`
	// RelayAllowlist names internal hosts (or host:port) that may be dialled.
	RelayAllowlist []string `envconfig:"RELAY_ALLOWLIST"`
}

// Validate fills defaults and checks the shard assignment.
func (c *Config) Validate() error {
	if c.Shards < 1 {
		return config.Invalid("SHARDS", c.Shards, "must be at least 1")
	}
	for _, s := range c.OwnedShards {
		if s < 0 || s >= c.Shards {
			return config.Invalid("FETCHER_SHARDS", c.OwnedShards, fmt.Sprintf("shard %d is outside 0..%d", s, c.Shards-1))
		}
	}
	if c.ID == "" {
		host, _ := os.Hostname()
		c.ID = host + "-" + strconv.Itoa(os.Getpid())
	}
	return nil
}

// Fetcher is the fetcher service.
type Fetcher struct {
	cfg   Config
	bus   *bus.Bus
	clock clock.Clock
	log   *slog.Logger
	guard relayurl.Guard

	mu     sync.Mutex
	relays map[string]*relayWorker
	epoch  uint64
	group  *errgroup.Group
	ctx    context.Context

	events   *prometheus.CounterVec
	connects *prometheus.CounterVec
}

// New builds a fetcher.
func New(cfg Config, b *bus.Bus, clk clock.Clock, log *slog.Logger, reg prometheus.Registerer) *Fetcher {
	f := &Fetcher{
		cfg:    cfg,
		bus:    b,
		clock:  clk,
		log:    log.With("service", "fetcher", "fetcher", cfg.ID),
		guard:  relayurl.Guard{Allow: cfg.RelayAllowlist},
		relays: map[string]*relayWorker{},
		events: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "grasp_fetcher_events_received_total",
			Help: "Events received from remote relays, by mode (live, historic).",
		}, []string{"mode"}),
		connects: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "grasp_fetcher_connect_attempts_total",
			Help: "Connection attempts to remote relays, by result.",
		}, []string{"result"}),
	}
	if reg != nil {
		reg.MustRegister(f.events, f.connects)
	}
	return f
}

func (f *Fetcher) ownedShards() []int {
	if len(f.cfg.OwnedShards) > 0 {
		return f.cfg.OwnedShards
	}
	all := make([]int, f.cfg.Shards)
	for i := range all {
		all[i] = i
	}
	return all
}

// Run consumes the commands of the owned shards until ctx is done. Each
// shard has its own durable consumer, so a shard's commands stay in order
// and a shard can move between replicas whole.
func (f *Fetcher) Run(ctx context.Context) error {
	g, ctx := errgroup.WithContext(ctx)
	f.mu.Lock()
	f.group, f.ctx = g, ctx
	f.mu.Unlock()
	for _, shard := range f.ownedShards() {
		g.Go(func() error {
			return f.bus.Consume(ctx, bus.ConsumeConfig{
				Stream: f.bus.Names.FetchCmdStream(),
				Consumer: jetstream.ConsumerConfig{
					Durable:       fmt.Sprintf("fetcher-shard-%d", shard),
					FilterSubject: f.bus.Names.FetchCmdSubject(shard),
				},
				Log: f.log,
			}, func(ctx context.Context, msg jetstream.Msg) error {
				var cmd graspv1.FetchCommand
				if err := bus.Decode(msg.Data(), msg.Headers(), &cmd); err != nil {
					return fmt.Errorf("%w: %v", bus.ErrPermanent, err)
				}
				return f.handle(ctx, shard, &cmd)
			})
		})
	}
	return g.Wait()
}

// handle routes a command to its relay's worker. Commands from an older
// planner epoch are dropped.
func (f *Fetcher) handle(ctx context.Context, shard int, cmd *graspv1.FetchCommand) error {
	f.mu.Lock()
	if cmd.GetEpoch() < f.epoch {
		f.mu.Unlock()
		f.log.Info("command from an old planner epoch ignored", "relay", cmd.GetRelayUrl(), "epoch", cmd.GetEpoch())
		return nil
	}
	f.epoch = cmd.GetEpoch()
	w, ok := f.relays[cmd.GetRelayUrl()]
	if !ok {
		if cmd.GetDropRelay() != nil {
			f.mu.Unlock()
			return nil
		}
		w = newRelayWorker(f, cmd.GetRelayUrl(), shard)
		f.relays[w.url] = w
		f.group.Go(func() error {
			w.run(f.ctx)
			f.mu.Lock()
			if f.relays[w.url] == w {
				delete(f.relays, w.url)
			}
			f.mu.Unlock()
			return nil
		})
	}
	if cmd.GetDropRelay() != nil {
		// Forget the worker now, so a command that follows the drop gets a
		// new worker instead of one that is shutting down.
		delete(f.relays, w.url)
	}
	f.mu.Unlock()
	select {
	case w.cmds <- cmd:
		return nil
	case <-w.done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
