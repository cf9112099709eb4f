// Package fetcher owns the websocket connections to remote relays. It
// executes the planner's commands for the shards it holds — connect, open
// live subscriptions, fetch history in batches (NIP-77 with REQ+EOSE
// fallback), drop — publishes every event it receives to
// grasp.events.<shard> and every lifecycle fact to
// grasp.fetch.report.<shard>. It decides nothing about what to fetch.
//
// Shards are leased in a KV bucket (leases.go), so a shard, and every relay
// in it, has one live owner; the relays the planner asked for are recorded
// per shard (bus.Names.FetcherRelayBucket) so the replica that takes a shard
// over reconnects them and reports new sessions.
package fetcher

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/protobuf/proto"

	graspv1 "github.com/grasp-sync/grasp-sync/proto/grasp/v1"

	"github.com/grasp-sync/grasp-sync/pkg/bus"
	"github.com/grasp-sync/grasp-sync/pkg/clock"
	"github.com/grasp-sync/grasp-sync/pkg/config"
	"github.com/grasp-sync/grasp-sync/pkg/relayurl"
)

// Config is the fetcher's configuration (GRASP_* variables). Fields
// tagged ignored:"true" are not read from the environment: their default
// tag is the value (New fills it), and tests set them in code. They are
// the protocol's shape and the fetcher's internal bounds, which no
// operator has a reason to change; they were variables once
// (docs/configuration.md, "No longer read").
type Config struct {
	// ID names this replica in reports, leases and logs: <hostname>-<pid>
	// unless set; graspd on its embedded NATS takes EmbeddedID ("graspd"),
	// so after a restart it finds its shard leases under the same name.
	ID string `envconfig:"FETCHER_ID"`
	// Shards is the total shard count (equal in planner and fetchers).
	Shards int `envconfig:"SHARDS" default:"16"`
	// OwnedShards, when set, are exactly the shards this replica serves;
	// empty means the replicas split all shards among themselves.
	OwnedShards []int `envconfig:"FETCHER_SHARDS"`
	// LeaseTTL is how long a dead replica's shards stay orphaned: 15s
	// unless set (DefaultLeaseTTL); graspd on its embedded NATS, where no
	// other replica waits for a shard, takes EmbeddedLeaseTTL (1m).
	LeaseTTL time.Duration `envconfig:"FETCHER_LEASE_TTL"`
	// PageSize is the limit of each historic REQ page: strfry's
	// maxFilterLimit (500), the most the common relay serves; a relay
	// whose known limits are lower gets pages of its max_limit
	// (docs/sync.md, "What relays allow").
	PageSize int `ignored:"true" default:"500"`
	// RelayMinCap is the smallest per-REQ result cap assumed of relays when
	// looking for crowded seconds: a page of at least this many events
	// (or PageSize, if smaller) all in one second makes that second read on
	// its own. It no longer ends a read: a short page does only when the
	// relay has returned a longer one on the connection, otherwise one more
	// page is asked, so relays capping below it are read completely
	// (docs/decisions/0015-fetcher-short-page-min-cap.md,
	// docs/decisions/0021-history-crowded-second.md).
	RelayMinCap int `ignored:"true" default:"100"`
	// MaxPages bounds one historic filter's pagination: 10,000 pages of
	// 500 are five million events, a backstop against a relay that pages
	// forever, not a limit any real read meets.
	MaxPages int `ignored:"true" default:"10000"`
	// IDsPerREQ is the chunk size of the id fetches after NIP-77: a REQ
	// of 100 ids is ~7 KB, within every relay's message budget.
	IDsPerREQ int `ignored:"true" default:"100"`
	// DisableNegentropy turns NIP-77 off: historic sync uses REQ+EOSE only.
	DisableNegentropy bool `envconfig:"FETCHER_DISABLE_NEGENTROPY"`
	// NegentropyFrameSize is the largest NIP-77 frame we send, like
	// strfry's own sync client (negsync.DefaultFrameSize); smaller when
	// the relay's message budget needs it (relayWorker.frameSize).
	NegentropyFrameSize int `ignored:"true" default:"60000"`
	// NegentropyTimeout bounds the wait for each NIP-77 answer; a relay
	// that does not answer in time is read with REQs instead (docs/sync.md).
	NegentropyTimeout time.Duration `ignored:"true" default:"30s"`
	// PageTimeout bounds the wait for each historic REQ's EOSE; a page
	// that takes longer fails its batch, which the planner retries.
	PageTimeout time.Duration `ignored:"true" default:"2m"`
	// ConnectTimeout bounds one connection attempt (DNS, TCP, TLS and the
	// websocket upgrade). It stays a variable: it depends on the operator's
	// own network path, and outbound connections through Tor or a slow
	// proxy can need more.
	ConnectTimeout time.Duration `envconfig:"FETCHER_CONNECT_TIMEOUT" default:"10s"`
	// PingInterval and PongTimeout are the keepalive: a relay that does
	// not answer a ping within PongTimeout is declared dead. Both are far
	// beyond any network's round trip.
	PingInterval time.Duration `ignored:"true" default:"30s"`
	PongTimeout  time.Duration `ignored:"true" default:"20s"`
	// MaxMessageBytes bounds one message from a relay. It stays a
	// variable: an operator who raises GRASP_POLICY_MAX_EVENT_BYTES (and
	// GRASP_RELAY_MAX_MESSAGE_BYTES) past 4 MiB raises it too, or events
	// that large could not arrive from other relays.
	MaxMessageBytes int64 `envconfig:"FETCHER_MAX_MESSAGE_BYTES" default:"4194304"`
	// BackoffBase and BackoffMax shape reconnect backoff: base × 2^(n−1),
	// capped (then one attempt per BackoffMax).
	BackoffBase time.Duration `envconfig:"FETCHER_BACKOFF_BASE" default:"5s"`
	BackoffMax  time.Duration `envconfig:"FETCHER_BACKOFF_MAX" default:"1h"`
	// DeadAfter of continuous failure makes a relay Dead, retried every
	// DeadRetry.
	DeadAfter time.Duration `envconfig:"FETCHER_DEAD_AFTER" default:"24h"`
	DeadRetry time.Duration `envconfig:"FETCHER_DEAD_RETRY" default:"24h"`
	// RateLimitCooldown is the first cooldown after a rate-limit signal;
	// repeats double it up to RateLimitMaxCooldown.
	RateLimitCooldown    time.Duration `envconfig:"FETCHER_RATE_LIMIT_COOLDOWN" default:"65s"`
	RateLimitMaxCooldown time.Duration `envconfig:"FETCHER_RATE_LIMIT_MAX_COOLDOWN" default:"1h"`
	// LiveFiltersPerREQ bounds the filters of one live REQ: strfry's
	// default maxFilters per REQ is 20 (docs/decisions/0057-relay-limits-kept-by-the-fetcher.md).
	LiveFiltersPerREQ int `ignored:"true" default:"20"`
	// MaxConcurrentBatches is how many historic batches run at once per
	// relay; MaxPendingBatches how many may wait (more are failed, and
	// the planner retries them).
	MaxConcurrentBatches int `envconfig:"FETCHER_MAX_CONCURRENT_BATCHES" default:"2"`
	MaxPendingBatches    int `ignored:"true" default:"256"`
	// MaxRunningBatches is how many historic batches run at once in this
	// replica, all relays together; the others wait their turn. Without it
	// a start or a daily resync over hundreds of relays runs a thousand
	// batches at once, each with its publish window, and the process is
	// too busy to renew its own leases (docs/decisions/0049-fetcher-running-batches-bound.md).
	MaxRunningBatches int `envconfig:"FETCHER_MAX_RUNNING_BATCHES" default:"32"`
	// PublishWindow is how many event publishes may await acknowledgement
	// per batch or live subscription; with MaxRunningBatches it bounds
	// the publishes in flight (docs/decisions/0049-fetcher-running-batches-bound.md).
	PublishWindow int `ignored:"true" default:"256"`
	// PublishMaxBytes bounds the bytes of event messages this replica has published and the events stream has not yet acknowledged, all batches and live subscriptions together, such as 8MiB; a publish waits for room. Each batch's window (256 events) bounds events, not bytes, and events range from a few hundred bytes to the policy's largest (docs/decisions/0065-work-in-flight-bounded-by-bytes.md).
	PublishMaxBytes config.ByteSize `envconfig:"FETCHER_PUBLISH_MAX_BYTES" default:"8MiB"`
	// PublishBatch is how many events one events-stream message carries at
	// most: the events of a page (or of a burst on a live subscription)
	// travel together, up to this many and bus.EventBatchMaxBytes, so the
	// stream and the ingesters handle one message, delivery and ack per
	// batch instead of per event (docs/decisions/0053-events-travel-in-batches.md). 1 publishes one message per event, as before
	// (tests set it in code).
	PublishBatch int `ignored:"true" default:"64"`
	// RecentIDs is how many acknowledged event publishes (30 s at most) the
	// fetcher remembers, to skip other relays' copies of the same event and
	// to ask last for ids a reconciliation names that another relay's copy
	// is bringing; about 200 bytes each (3.3 MiB)
	// (docs/decisions/0043-fetcher-copies-already-published.md).
	RecentIDs int `ignored:"true" default:"16384"`
	// AuthKey is the service's nostr secret key (hex or nsec) used to
	// answer NIP-42 AUTH challenges; empty: challenges are not answered.
	AuthKey string `envconfig:"FETCHER_AUTH_KEY"`
	// RelayAllowlist names internal hosts (or host:port) that may be dialled.
	RelayAllowlist []string `envconfig:"RELAY_ALLOWLIST"`
}

// Validate fills defaults and checks the values.
func (c *Config) Validate() error {
	if c.Shards < 1 {
		return config.Invalid("SHARDS", c.Shards, "must be at least 1")
	}
	for _, s := range c.OwnedShards {
		if s < 0 || s >= c.Shards {
			return config.Invalid("FETCHER_SHARDS", c.OwnedShards, fmt.Sprintf("shard %d is outside 0..%d", s, c.Shards-1))
		}
	}
	if c.PublishMaxBytes != 0 && c.PublishMaxBytes < bus.EventBatchMaxBytes {
		return config.Invalid("FETCHER_PUBLISH_MAX_BYTES", c.PublishMaxBytes, fmt.Sprintf("must be at least %s, one batch message", config.ByteSize(bus.EventBatchMaxBytes)))
	}
	if c.MaxRunningBatches < 0 {
		return config.Invalid("FETCHER_MAX_RUNNING_BATCHES", c.MaxRunningBatches, "must be at least 1 (0 takes the default)")
	}
	if c.AuthKey != "" {
		if _, err := config.SecretKey(c.AuthKey); err != nil {
			return config.Invalid("FETCHER_AUTH_KEY", "(secret)", err.Error())
		}
	}
	if c.LeaseTTL != 0 && c.LeaseTTL < time.Second {
		return config.Invalid("FETCHER_LEASE_TTL", c.LeaseTTL, "must be at least 1s")
	}
	return nil
}

// withDefaults fills zero values from the default tags (tests build Config
// literals).
func (c Config) withDefaults() Config {
	config.FillDefaults(&c)
	if c.ID == "" {
		c.ID = config.InstanceID()
	}
	if c.LeaseTTL == 0 {
		c.LeaseTTL = DefaultLeaseTTL
	}
	return c
}

// DefaultLeaseTTL is a shard lease's TTL when LeaseTTL is not set: a
// replica killed mid-sync leaves its shards idle at most this long
// (docs/decisions/0014-leases-survive-load.md).
const DefaultLeaseTTL = 15 * time.Second

// EmbeddedLeaseTTL and EmbeddedID are what graspd gives its fetcher on
// its embedded NATS when GRASP_FETCHER_LEASE_TTL and GRASP_FETCHER_ID are
// not set. That NATS server lives and dies with the process, so no other
// replica waits for a shard; a graspd killed and started again finds its
// leases under the same ID and takes them back at once. What the TTL
// still costs is renewals: every shard's every TTL/4, each a JetStream
// write the lease watcher reads back, which at 15s were most of graspd's
// NATS traffic at rest (docs/decisions/0079-graspd-fetcher-leases.md).
const (
	EmbeddedLeaseTTL = time.Minute
	EmbeddedID       = "graspd"
)

// Fetcher is the fetcher service.
type Fetcher struct {
	cfg     Config
	bus     *bus.Bus
	clock   clock.Clock
	log     *slog.Logger
	guard   relayurl.Guard
	m       *metrics
	local   LocalSet
	authKey string

	// reportNonce and reportSeq make each report's Nats-Msg-Id, unique to
	// this Fetcher's life: a retried report that was stored the first time
	// is dropped by the stream as a duplicate (relayWorker.reportFor).
	reportNonce string
	reportSeq   atomic.Uint64

	// localHoldsStore: local holds the store's ids, not only refusals, so
	// a NIP-77 catch-up can reconcile its whole filters (batchRun.part).
	localHoldsStore bool

	// running holds a token for each historic batch running in this
	// replica (Config.MaxRunningBatches).
	running chan struct{}

	// recent is the acknowledged publishes, shared by every relay worker;
	// recentByID the same by event id alone (batchRun.deferPublished).
	recent, recentByID *recentIDs
	// claims is what its publishers have on the way to the events stream
	// (copyClaims), settled by pubJS's acknowledgement handler.
	claims *copyClaims
	// pubJS publishes events: its acknowledgement handlers give their
	// bytes back to pubBytes (Config.PublishMaxBytes), which every
	// windowPublisher takes from before a publish.
	pubJS    jetstream.JetStream
	pubBytes *bus.ByteGate

	mu     sync.Mutex
	relays map[string]*relayWorker
	// nip77 is what each relay answered to NEG-OPEN: it outlives the
	// relay's worker, which ends with a lost shard; a dropped relay's
	// entry is deleted, so it holds at most the relays assigned to us.
	nip77 map[string]*nip77Support
	// limits is what each relay allows (limits.go), kept like nip77 and
	// stored in limitsKV.
	limits   map[string]*relayLimits
	limitsKV jetstream.KeyValue
	shards   map[int]*shardRun
	epoch    uint64
	relaysKV jetstream.KeyValue
	replicas int // of the fetcher's own buckets; 0 is 1
}

// shardRun is one shard this replica serves: its command consumer and its
// relays run under ctx, which ends when the shard is lost.
type shardRun struct {
	shard  int
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// New builds a fetcher.
func New(cfg Config, b *bus.Bus, clk clock.Clock, log *slog.Logger, reg prometheus.Registerer) *Fetcher {
	cfg = cfg.withDefaults()
	sk, _ := config.SecretKey(cfg.AuthKey)
	m := newMetrics(reg)
	pubBytes := bus.NewByteGate(int64(cfg.PublishMaxBytes))
	pubJS := b.JS
	claims := newCopyClaims()
	if b.Conn != nil {
		// Acknowledged or failed (a failure is retried synchronously by
		// its publisher, outside the bound): the bytes are no longer
		// awaiting the stream.
		release := func(msg *nats.Msg) {
			pubBytes.Release(int64(len(msg.Data)))
			m.publishBytes.Set(float64(pubBytes.Used()))
		}
		js, err := jetstream.New(b.Conn, jetstream.WithPublishAsyncMaxPending(4096),
			jetstream.WithPublishAsyncAckHandler(func(_ jetstream.JetStream, m *nats.Msg, _ *jetstream.PubAck) { release(m); claims.acked(m) }),
			jetstream.WithPublishAsyncErrHandler(func(_ jetstream.JetStream, m *nats.Msg, _ error) { release(m) }))
		if err != nil {
			panic(fmt.Sprintf("fetcher: jetstream for events: %v", err)) // only invalid options fail
		}
		pubJS = js
	}
	return &Fetcher{
		pubJS:       pubJS,
		claims:      claims,
		pubBytes:    pubBytes,
		cfg:         cfg,
		bus:         b,
		clock:       clk,
		log:         log.With("service", "fetcher", "fetcher", cfg.ID),
		guard:       relayurl.Guard{Allow: cfg.RelayAllowlist},
		m:           m,
		authKey:     sk,
		reportNonce: newSessionID(),
		running:     make(chan struct{}, cfg.MaxRunningBatches),
		recent:      newRecentIDs(cfg.RecentIDs, recentTTL),
		recentByID:  newRecentIDs(cfg.RecentIDs, recentTTL),
		relays:      map[string]*relayWorker{},
		nip77:       map[string]*nip77Support{},
		limits:      map[string]*relayLimits{},
		shards:      map[int]*shardRun{},
	}
}

// WithReplicas sets the replicas of the fetcher's own buckets (shard leases,
// relays to keep connected) to those of the contract's streams
// (GRASP_NATS_REPLICAS): on a NATS cluster an R1 lease bucket would stop
// every fetcher from holding its shards while the one node storing it is down.
func (f *Fetcher) WithReplicas(n int) *Fetcher {
	f.replicas = n
	return f
}

// WithLocalSet sets what the service already holds (store ids ∪ rejected
// ids), the local side of NIP-77. Without it the local set is empty and
// reconciliation costs the relay's full id list.
func (f *Fetcher) WithLocalSet(ls LocalSet) *Fetcher {
	f.local, f.localHoldsStore = f.shareLocalSet(ls), true
	return f
}

// WithRefusalsLocalSet sets a local set that holds only the ids the policy
// refused, not the store's (a fetcher run without GRASP_STORE_URL). NIP-77
// still skips refused events, but a catch-up keeps its since on NIP-77
// relays too: reconciling whole filters against refusals alone would
// download everything the relay holds for them at every reconnect. Nor are
// a daily resync's missed events counted: nothing tells which we lacked
// (docs/sync.md, "Catch-ups and back-dated events").
func (f *Fetcher) WithRefusalsLocalSet(ls LocalSet) *Fetcher {
	f.local, f.localHoldsStore = f.shareLocalSet(ls), false
	return f
}

// shareLocalSet has the relays reconciling the same filter at once share
// one read of ls (sharedLocalSet).
func (f *Fetcher) shareLocalSet(ls LocalSet) LocalSet {
	if ls == nil {
		return nil
	}
	reads := f.m.localSetReads
	return newSharedLocalSet(ls, sharedLocalSetTTL, sharedLocalSetMaxItems, f.clock.Now,
		func(source string) { reads.WithLabelValues(source).Inc() })
}

// Run serves the shards this replica holds until ctx is done, then releases
// them.
func (f *Fetcher) Run(ctx context.Context) error {
	// EnsureKeyValue: replicas starting together in a cluster race on these
	// buckets, and a lost answer must not end the process. It creates or
	// updates (a changed lease TTL applies at the next start), so the
	// fetcher's NATS user may create, update and read these two buckets'
	// streams, and no other service may (deploy/validate derives this from
	// the bus.Names methods named here).
	leasesKV, err := bus.EnsureKeyValue(ctx, f.bus.JS, jetstream.KeyValueConfig{
		Bucket: f.bus.Names.FetcherLeaseBucket(), Description: "fetcher shard leases and members", TTL: f.cfg.LeaseTTL, History: 1, Replicas: f.replicas})
	if err != nil {
		return fmt.Errorf("lease bucket: %w", err)
	}
	relaysKV, err := bus.EnsureKeyValue(ctx, f.bus.JS, jetstream.KeyValueConfig{
		Bucket: f.bus.Names.FetcherRelayBucket(), Description: "relays the planner asked fetchers to keep connected, per shard", History: 1, Replicas: f.replicas})
	if err != nil {
		return fmt.Errorf("relay bucket: %w", err)
	}
	limitsKV, err := bus.EnsureKeyValue(ctx, f.bus.JS, jetstream.KeyValueConfig{
		Bucket: f.bus.Names.RelayLimitsBucket(), Description: "what each remote relay allows: NIP-11, learned limits, refused reads", History: 1, Replicas: f.replicas})
	if err != nil {
		return fmt.Errorf("relay limits bucket: %w", err)
	}
	f.mu.Lock()
	f.relaysKV = relaysKV
	f.limitsKV = limitsKV
	f.mu.Unlock()
	leases := newShardLeases(leasesKV, f.cfg.ID, ShardLeaseConfig{TTL: f.cfg.LeaseTTL, Shards: f.cfg.Shards, Fixed: f.cfg.OwnedShards},
		f.log, func(s int) { f.gainShard(ctx, s) }, f.loseShard)
	leases.run(ctx)
	return nil
}

// Shards returns the shards this replica serves now.
func (f *Fetcher) Shards() []int {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []int
	for s := range f.shards {
		out = append(out, s)
	}
	return out
}

func (f *Fetcher) gainShard(parent context.Context, shard int) {
	ctx, cancel := context.WithCancel(parent)
	sr := &shardRun{shard: shard, ctx: ctx, cancel: cancel}
	f.mu.Lock()
	f.shards[shard] = sr
	f.mu.Unlock()
	f.m.shards.Inc()
	f.log.Info("shard acquired", "shard", shard)
	sr.wg.Add(1)
	go func() {
		defer sr.wg.Done()
		f.resumeRelays(sr)
		// The consumer is attached again whenever it stops (a NATS node
		// lost, the stream recreated) for as long as the shard is held:
		// a held shard without a consumer would stall its relays, and no
		// other replica would take it over.
		_ = f.bus.ConsumeRestarting(ctx, f.clock, bus.RestartBackoff{Min: time.Second, Max: 30 * time.Second}, bus.ConsumeConfig{
			Stream: f.bus.Names.FetchCmdStream(),
			Consumer: jetstream.ConsumerConfig{
				Durable:       fmt.Sprintf("fetcher-shard-%d", shard),
				FilterSubject: f.bus.Names.FetchCmdSubject(shard),
				// Replicated, its state lives in memory (bus.WorkQueueStateInMemory).
				MemoryStorage: bus.WorkQueueStateInMemory(f.replicas),
			},
			Log: f.log.With("shard", shard),
		}, func(ctx context.Context, msg jetstream.Msg) error {
			var cmd graspv1.FetchCommand
			if err := bus.Decode(msg.Data(), msg.Headers(), &cmd); err != nil {
				return fmt.Errorf("%w: %v", bus.ErrPermanent, err)
			}
			return f.handle(ctx, sr, &cmd)
		})
	}()
}

// loseShard stops serving a shard: its consumer stops and its relays'
// connections close before the lease is given up.
func (f *Fetcher) loseShard(shard int, reason string) {
	f.mu.Lock()
	sr := f.shards[shard]
	delete(f.shards, shard)
	f.mu.Unlock()
	if sr == nil {
		return
	}
	f.log.Info("shard released", "shard", shard, "reason", reason)
	sr.cancel()
	sr.wg.Wait()
	f.m.shards.Dec()
	f.m.shardReleases.WithLabelValues(releaseLabel(reason)).Inc()
}

// resumeRelays starts a worker, wanting a connection, for every relay of
// the shard recorded by a previous owner.
func (f *Fetcher) resumeRelays(sr *shardRun) {
	lister, err := f.relaysKV.ListKeysFiltered(sr.ctx, bus.FetcherRelayKeys(sr.shard))
	if err != nil {
		f.log.Warn("relays of shard not listed", "shard", sr.shard, "err", err)
		return
	}
	for k := range lister.Keys() {
		e, err := f.relaysKV.Get(sr.ctx, k)
		if err != nil {
			continue
		}
		var rec graspv1.FetcherRelay
		if err := proto.Unmarshal(e.Value(), &rec); err != nil || rec.GetRelayUrl() == "" {
			continue
		}
		w := f.worker(sr, rec.GetRelayUrl(), true)
		if w == nil {
			continue
		}
		if rec.GetFetcherId() != f.cfg.ID {
			w.previous = &rec
		}
		select {
		case w.cmds <- &graspv1.FetchCommand{RelayUrl: rec.GetRelayUrl(),
			Command: &graspv1.FetchCommand_EnsureConnected{EnsureConnected: &graspv1.EnsureConnected{}}}:
		case <-sr.ctx.Done():
			return
		}
	}
}

// recordRelay writes (or with rec nil removes) a relay's record.
func (f *Fetcher) recordRelay(shard int, url string, rec *graspv1.FetcherRelay) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	key := bus.FetcherRelayKey(shard, url)
	var err error
	if rec == nil {
		err = f.relaysKV.Delete(ctx, key)
	} else {
		data, _ := proto.Marshal(rec)
		_, err = f.relaysKV.Put(ctx, key, data)
	}
	if err != nil {
		f.log.Warn("relay record not written", "relay", url, "shard", shard, "err", err)
	}
}

// worker returns the relay's worker, starting one under the shard if
// needed (create false: only an existing one).
func (f *Fetcher) worker(sr *shardRun, url string, create bool) *relayWorker {
	f.mu.Lock()
	defer f.mu.Unlock()
	if w, ok := f.relays[url]; ok {
		return w
	}
	if !create || sr.ctx.Err() != nil {
		return nil
	}
	w := newRelayWorker(f, url, sr.shard)
	w.held = sr.ctx
	if f.nip77[url] == nil {
		f.nip77[url] = &nip77Support{}
	}
	w.nip77 = f.nip77[url]
	f.relays[url] = w
	sr.wg.Add(1)
	go func() {
		defer sr.wg.Done()
		w.run(sr.ctx)
		f.mu.Lock()
		if f.relays[url] == w {
			delete(f.relays, url)
		}
		f.mu.Unlock()
	}()
	return w
}

// handle routes a command to its relay's worker. Commands from an older
// planner epoch are dropped.
func (f *Fetcher) handle(ctx context.Context, sr *shardRun, cmd *graspv1.FetchCommand) error {
	f.mu.Lock()
	if cmd.GetEpoch() < f.epoch {
		f.mu.Unlock()
		f.log.Info("command from an old planner epoch ignored", "relay", cmd.GetRelayUrl(), "epoch", cmd.GetEpoch())
		return nil
	}
	f.epoch = cmd.GetEpoch()
	f.mu.Unlock()
	if cmd.GetRelayUrl() == "" {
		return fmt.Errorf("%w: command without relay", bus.ErrPermanent)
	}
	drop := cmd.GetDropRelay() != nil
	w := f.worker(sr, cmd.GetRelayUrl(), !drop)
	if w == nil {
		if drop {
			f.recordRelay(sr.shard, cmd.GetRelayUrl(), nil)
		}
		return nil
	}
	if drop {
		// Forget the worker now, so a command that follows the drop gets a
		// new worker instead of one that is shutting down.
		f.mu.Lock()
		if f.relays[w.url] == w {
			delete(f.relays, w.url)
		}
		f.mu.Unlock()
	}
	select {
	case w.cmds <- cmd:
		return nil
	case <-w.done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
