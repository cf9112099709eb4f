package planner

import (
	"time"

	"github.com/grasp-sync/grasp-sync/pkg/config"
)

// Rules are the lifecycle constants (docs/sync.md, "Relay lifecycle"). Those
// tagged ignored:"true" are fixed: not read from the environment, their
// default tag is the value (DefaultRules, withFixed), and tests set them in
// code (a zero ConsolidatePerTick there means "at once").
type Rules struct {
	// QuickReconnect is the longest disconnection after which confirmed
	// state is kept (quick reconnect); longer ones start fresh.
	QuickReconnect time.Duration `envconfig:"PLANNER_QUICK_RECONNECT" default:"15m"`
	// SinceBuffer is subtracted from the moment the live stream was lost to
	// get a catch-up's since (propagation buffer).
	SinceBuffer time.Duration `envconfig:"PLANNER_SINCE_BUFFER" default:"15m"`
	// ResyncMin and ResyncMax bound the random daily full resync interval.
	ResyncMin time.Duration `envconfig:"PLANNER_RESYNC_MIN" default:"23h"`
	ResyncMax time.Duration `envconfig:"PLANNER_RESYNC_MAX" default:"25h"`
	// QuietPeriod is how long a relay must have no batch pending before it
	// counts as synced: longer than discovery's batch window, because roots
	// found in a relay's history need their own batches.
	QuietPeriod time.Duration `envconfig:"PLANNER_QUIET_PERIOD" default:"6s"`
	// MaxLiveFilters is the live filter budget per relay; above it the
	// relay's live subscriptions are consolidated.
	MaxLiveFilters int `envconfig:"PLANNER_MAX_LIVE_FILTERS" default:"70"`
	// ConsolidatePerTick and ConsolidateEvery pace deferred consolidations.
	// A relay whose minimal live set alone exceeds MaxLiveFilters cannot
	// meet the budget anyway; when it outgrows its headroom its
	// consolidation (a ReplaceLive with the whole minimal set, ~1 MB at
	// design scale) is queued instead of being built inside the discovery
	// batch's recompute, and Tick builds at most ConsolidatePerTick of them
	// every ConsolidateEvery. 0 consolidates at once, inside the recompute
	// (tests and benchmarks; docs/decisions/0034-planner-closing-live-sets-by-name.md).
	ConsolidatePerTick int `ignored:"true" default:"2"`
	// ConsolidateEvery is the pause between two rounds of deferred
	// consolidations, so reports and recomputes run in between.
	ConsolidateEvery time.Duration `ignored:"true" default:"10ms"`
	// MaxBatchItems bounds one batch (repositories + roots), so a failure
	// or disconnect loses little progress.
	MaxBatchItems int `ignored:"true" default:"1000"`
	// MaxFiltersPerCommand bounds the live filters of one command (one REQ
	// at the fetcher): 50 filters of 100 ids are ~330 KB, under NATS's 1 MiB
	// payload and khatru's 512 KB message limit. A larger consolidated set
	// is sent as ReplaceLive plus live-only AddFilters
	// (docs/decisions/0016-planner-interned-ids-filter-budget.md).
	MaxFiltersPerCommand int `ignored:"true" default:"50"`
	// FailureRetry is how long a relay waits after a failed batch before
	// its items are tried again. Each further failure before the relay is
	// fully synced doubles the wait, up to FailureRetryMax: a batch that
	// fails for good (a crowded second a relay without NIP-77 cannot
	// serve completely) must not reread a whole layer every few minutes
	// (docs/decisions/0032-failed-batches-back-off.md).
	FailureRetry time.Duration `envconfig:"PLANNER_FAILURE_RETRY" default:"5m"`
	// FailureRetryMax bounds the doubled wait after repeated failures; it
	// is also the longest a newly listed repository waits on a relay
	// that keeps failing.
	FailureRetryMax time.Duration `envconfig:"PLANNER_FAILURE_RETRY_MAX" default:"1h"`
	// ChunkQuiet is how long a relay's new roots (and repositories' own
	// parts) that do not fill a filter (filters.ChunkSize, 100 values)
	// wait for more while its items keep coming: they go with the next
	// ones, or once the relay has had no new items for this long. Items
	// that fill filters go at once, and so do the first items after a
	// pause of this length, so only a stream (an initial sync, a bulk
	// import) is held, and its REQs follow the items' number rather than
	// how the stream is spread in time
	// (docs/decisions/0061-planner-roots-in-full-filters.md). A large
	// stream waits ChunkStreamQuiet instead. 0 sends every recompute's
	// items at once.
	ChunkQuiet time.Duration `envconfig:"PLANNER_CHUNK_QUIET" default:"3s"`
	// ChunkStreamQuiet is the quiet of a large stream: once a relay's
	// stream has brought it ChunkStreamItems items, a pause must last this
	// long to end it. It is longer than discovery's batch window
	// (GRASP_DISCOVERY_BATCH_WINDOW, 5 s), the spacing of index batches
	// while a large sync's stored stream never pauses: with ChunkQuiet
	// alone every one of them looked like the first after a pause and went
	// to every relay at once. A small stream (a repository's next root,
	// found in the batch before) keeps ChunkQuiet: holding it longer
	// would save no batch and delay each step of a chain
	// (docs/decisions/0083-chunk-quiet-beyond-discovery-window.md).
	ChunkStreamQuiet time.Duration `ignored:"true" default:"8s"`
	// ChunkStreamItems is how many items make a relay's stream large.
	ChunkStreamItems int `ignored:"true" default:"100"`
	// ChunkMaxWait bounds how long ChunkQuiet holds a root: a trickle that
	// never pauses and never fills a filter still goes this often.
	ChunkMaxWait time.Duration `ignored:"true" default:"10s"`
	// Heartbeat re-sends EnsureConnected to every relay this often, so a
	// relay whose fetcher lost it unreported is reconnected and a session
	// that ended unreported is noticed. It is a backstop: a fetcher that
	// takes over a shard resumes its relays, and one that loses a session
	// reconnects and reports the new one, so it is rare; each round costs
	// a command, an answer and a persisted relay record per relay, which
	// every 30 s was a third of graspd's CPU at rest at 1,000 relays
	// (docs/decisions/0078-quiet-keepalive-and-heartbeat.md). 0 disables it.
	Heartbeat time.Duration `envconfig:"PLANNER_HEARTBEAT" default:"5m"`
}

// DefaultRules are the defaults docs/sync.md describes: the default tags.
func DefaultRules() Rules {
	var r Rules
	config.FillDefaults(&r)
	return r
}

// withFixed returns r with the fixed rules (ignored:"true") at their
// values: what the environment cannot set.
func (r Rules) withFixed() Rules {
	d := DefaultRules()
	r.ConsolidatePerTick, r.ConsolidateEvery = d.ConsolidatePerTick, d.ConsolidateEvery
	r.MaxBatchItems, r.MaxFiltersPerCommand = d.MaxBatchItems, d.MaxFiltersPerCommand
	r.ChunkMaxWait = d.ChunkMaxWait
	r.ChunkStreamQuiet, r.ChunkStreamItems = d.ChunkStreamQuiet, d.ChunkStreamItems
	return r
}

// ReconnectKind classifies how a session started.
type ReconnectKind string

// Reconnect kinds, as counted in metrics.
const (
	KindFresh  ReconnectKind = "fresh"  // first connect
	KindQuick  ReconnectKind = "quick"  // disconnected ≤ QuickReconnect
	KindLong   ReconnectKind = "long"   // disconnected longer: fresh start, counted as a disconnect
	KindDaily  ReconnectKind = "daily"  // daily resync: fresh start, not a disconnect
	KindResume ReconnectKind = "resume" // a new planner took over a live session
)

// Observer receives lifecycle facts for metrics. Methods are called from the
// machine's goroutine.
type Observer interface {
	BatchStarted(relay string, kind BatchKind)
	BatchFinished(relay string, kind BatchKind, ok bool, took time.Duration)
	// BatchAbandoned is a batch that will never report: its session ended
	// or a resync started over. Started = finished + abandoned + in flight.
	BatchAbandoned(relay string, kind BatchKind)
	// BatchIncomplete is a batch the fetcher read as far as the relay
	// allows but not completely (a crowded second it could not split); it
	// is also finished as failed.
	BatchIncomplete(relay string, kind BatchKind)
	Consolidated(relay string)
	Reconnected(relay string, kind ReconnectKind)
	// ResyncMissed is n events a daily resync found on the relay that live
	// subscriptions and catch-ups had missed.
	ResyncMissed(relay string, n uint64)
}

type nopObserver struct{}

func (nopObserver) BatchStarted(string, BatchKind)                       {}
func (nopObserver) BatchFinished(string, BatchKind, bool, time.Duration) {}
func (nopObserver) BatchAbandoned(string, BatchKind)                     {}
func (nopObserver) BatchIncomplete(string, BatchKind)                    {}
func (nopObserver) Consolidated(string)                                  {}
func (nopObserver) Reconnected(string, ReconnectKind)                    {}
func (nopObserver) ResyncMissed(string, uint64)                          {}

// failureHold is the wait after the nth failed batch since the relay was
// last fully synced: FailureRetry, doubled for each failure before, at
// most FailureRetryMax (when that is set and not below FailureRetry).
func (r Rules) failureHold(n int) time.Duration {
	d := r.FailureRetry
	for i := 1; i < n && d < r.FailureRetryMax; i++ {
		d *= 2
	}
	if r.FailureRetryMax >= r.FailureRetry && d > r.FailureRetryMax {
		d = r.FailureRetryMax
	}
	return d
}
