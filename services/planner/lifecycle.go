package planner

import (
	"bytes"
	"encoding/hex"
	"hash/fnv"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/nbd-wtf/go-nostr"

	graspv1 "github.com/grasp-sync/grasp-sync/proto/grasp/v1"

	"github.com/grasp-sync/grasp-sync/pkg/filters"
)

// Rules are the lifecycle constants (docs/sync.md, "Relay lifecycle"), all configurable.
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
	// every ConsolidateEvery. 0 consolidates at once, inside the recompute.
	ConsolidatePerTick int `envconfig:"PLANNER_CONSOLIDATE_PER_TICK" default:"2"`
	// ConsolidateEvery is the pause between two rounds of deferred
	// consolidations, so reports and recomputes run in between.
	ConsolidateEvery time.Duration `envconfig:"PLANNER_CONSOLIDATE_EVERY" default:"10ms"`
	// MaxBatchItems bounds one batch (repositories + roots), so a failure
	// or disconnect loses little progress.
	MaxBatchItems int `envconfig:"PLANNER_MAX_BATCH_ITEMS" default:"1000"`
	// MaxFiltersPerCommand bounds the live filters of one command (one REQ
	// at the fetcher): 50 filters of 100 ids are ~330 KB, under NATS's 1 MiB
	// payload and khatru's 512 KB message limit. A larger consolidated set
	// is sent as ReplaceLive plus live-only AddFilters.
	MaxFiltersPerCommand int `envconfig:"PLANNER_MAX_FILTERS_PER_COMMAND" default:"50"`
	// FailureRetry is how long a relay waits after a failed batch before
	// its items are tried again.
	FailureRetry time.Duration `envconfig:"PLANNER_FAILURE_RETRY" default:"5m"`
	// Heartbeat re-sends EnsureConnected to every relay this often, so a
	// relay whose fetcher died (and whose shard moved) is reconnected and a
	// session that ended unreported is noticed. 0 disables it.
	Heartbeat time.Duration `envconfig:"PLANNER_HEARTBEAT" default:"30s"`
}

// DefaultRules are the defaults docs/sync.md describes.
func DefaultRules() Rules {
	return Rules{
		QuickReconnect:       15 * time.Minute,
		SinceBuffer:          15 * time.Minute,
		ResyncMin:            23 * time.Hour,
		ResyncMax:            25 * time.Hour,
		QuietPeriod:          6 * time.Second,
		MaxLiveFilters:       70,
		ConsolidatePerTick:   2,
		ConsolidateEvery:     10 * time.Millisecond,
		MaxBatchItems:        1000,
		MaxFiltersPerCommand: 50,
		FailureRetry:         5 * time.Minute,
		Heartbeat:            30 * time.Second,
	}
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
}

type nopObserver struct{}

func (nopObserver) BatchStarted(string, BatchKind)                       {}
func (nopObserver) BatchFinished(string, BatchKind, bool, time.Duration) {}
func (nopObserver) BatchAbandoned(string, BatchKind)                     {}
func (nopObserver) BatchIncomplete(string, BatchKind)                    {}
func (nopObserver) Consolidated(string)                                  {}
func (nopObserver) Reconnected(string, ReconnectKind)                    {}

// Machine is the planner's whole decision state: the index mirror, every
// relay's lifecycle and its batches. It is pure: inputs are index changes,
// fetcher reports and the time, passed in; outputs are fetch commands
// (Drain) and changed relay records (TakeDirty). No I/O, no goroutines, no
// clock of its own, so table tests can assert exact commands.
type Machine struct {
	rules  Rules
	idx    *Index
	relays map[RelayID]*RelayState
	epoch  uint64
	seq    uint64
	// jitter returns a number in [0,1) for the daily resync spread.
	jitter func() float64
	obs    Observer

	out     []*graspv1.FetchCommand
	dirty   map[RelayID]bool
	dropped []string
	// affected: relays touched since the last Recompute, each with the
	// repositories whose items may have changed (nil: all of them). Bounded
	// by the relays and the repositories listing them.
	affected      map[RelayID]map[RepoID]struct{}
	nextHeartbeat time.Time

	// deferred is the queue of relays with a consolidation due, oldest
	// first; queued holds its members, so a relay is in it at most once and
	// the queue is bounded by the tracked relays. Whether a member still
	// needs it is decided when it is built (RelayState.deferredFor).
	deferred      []RelayID
	queued        map[RelayID]bool
	consolidateAt time.Time
}

// NewMachine returns a machine for one leadership epoch. jitter must return
// values in [0,1); obs may be nil.
func NewMachine(rules Rules, idx *Index, epoch uint64, jitter func() float64, obs Observer) *Machine {
	if obs == nil {
		obs = nopObserver{}
	}
	return &Machine{
		rules: rules, idx: idx, relays: map[RelayID]*RelayState{}, epoch: epoch,
		jitter: jitter, obs: obs, dirty: map[RelayID]bool{}, affected: map[RelayID]map[RepoID]struct{}{}, queued: map[RelayID]bool{},
	}
}

// Index returns the machine's index mirror.
func (m *Machine) Index() *Index { return m.idx }

// Relays returns the tracked relays (read only).
func (m *Machine) Relays() map[RelayID]*RelayState { return m.relays }

// Drain returns the commands decided since the last call, in order.
func (m *Machine) Drain() []*graspv1.FetchCommand {
	out := m.out
	m.out = nil
	return out
}

// TakeDirty returns the relays whose persisted record changed and the URLs
// of relays dropped since the last call.
func (m *Machine) TakeDirty() (changed []*RelayState, dropped []string) {
	ids := make([]RelayID, 0, len(m.dirty))
	for id := range m.dirty {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	for _, id := range ids {
		if s, ok := m.relays[id]; ok {
			changed = append(changed, s)
		}
	}
	clear(m.dirty)
	dropped, m.dropped = m.dropped, nil
	return changed, dropped
}

// ApplyIndex records index changes: removed relays and roots leave the
// relays' confirmed and pending state at once (removal), and every relay
// the changes touch is recomputed by the next Recompute.
func (m *Machine) ApplyIndex(changes []IndexChange) {
	for _, ch := range changes {
		for _, r := range ch.Relays {
			m.touch(r, ch.Repo)
		}
		for _, r := range ch.RemovedRelays {
			if s, ok := m.relays[r]; ok {
				if p, had := s.Pairs[ch.Repo]; had {
					delete(s.Pairs, ch.Repo)
					s.trimLive = true
					s.lowerMin(1, len(p.Confirmed)+len(p.Pending))
					m.dirty[r] = true
				}
				stripBatches(s, ch.Repo, nil)
			}
		}
		if ch.Regained {
			m.refetchRepo(ch.Repo)
		}
		if len(ch.RemovedRoots) == 0 {
			continue
		}
		for _, r := range m.idx.Repo(ch.Repo).Relays {
			s, ok := m.relays[r]
			if !ok {
				continue
			}
			stripBatches(s, ch.Repo, ch.RemovedRoots)
			p := s.Pairs[ch.Repo]
			if p == nil {
				continue
			}
			c, q := minus(p.Confirmed, ch.RemovedRoots), minus(p.Pending, ch.RemovedRoots)
			if gone := len(p.Confirmed) + len(p.Pending) - len(c) - len(q); gone > 0 {
				p.Confirmed, p.Pending = c, q
				s.trimLive = true
				s.lowerMin(0, gone)
				m.dirty[r] = true
			}
		}
	}
}

// refetchRepo makes a repository's own part (layer 2 with its maintainers'
// coordinates, its states, its maintainers' announcements and states) due
// again on every relay listing it: it gained a maintainer or a maintainer's
// coordinate, whose events were never asked for — or were refused and
// remembered while the author maintained nothing we serve. A batch in flight
// for it asked without them, so its completion must not confirm it.
func (m *Machine) refetchRepo(repo RepoID) {
	for _, r := range m.idx.Repo(repo).Relays {
		s, ok := m.relays[r]
		if !ok {
			continue
		}
		p := s.Pairs[repo]
		if p == nil || (!p.RepoConfirmed && !p.RepoPending) {
			continue
		}
		p.RepoConfirmed, p.RepoPending = false, false
		for _, b := range s.Batches {
			for i := range b.Items {
				if b.Items[i].Repo == repo {
					b.Items[i].NeedRepo = false
				}
			}
		}
		s.lowerMin(1, 0)
		m.dirty[r] = true
	}
}

// stripBatches removes a repository (roots nil) or some of its roots from
// the relay's batches in flight. Their live subscriptions are dropped by the
// consolidation that follows a removal, so if the items are listed again
// before the batch ends, its completion must not confirm them: they get a
// new batch, live and full history.
func stripBatches(s *RelayState, repo RepoID, roots []RootID) {
	for _, b := range s.Batches {
		kept := b.Items[:0:0]
		for _, it := range b.Items {
			if it.Repo == repo {
				if roots == nil {
					continue
				}
				it.Roots = minus(it.Roots, roots)
			}
			kept = append(kept, it)
		}
		b.Items = kept
	}
}

// SetBootstrap applies a new bootstrap relay list.
func (m *Machine) SetBootstrap(urls []string) {
	for _, r := range m.idx.SetBootstrap(urls) {
		m.affected[r] = nil // the whole relay
		if s, ok := m.relays[r]; ok {
			s.Bootstrap = m.idx.IsBootstrap(r)
			m.dirty[r] = true
		}
	}
}

// touch records that the relay's items for repo may have changed, unless
// the whole relay is already due.
func (m *Machine) touch(r RelayID, repo RepoID) {
	set, ok := m.affected[r]
	switch {
	case !ok:
		m.affected[r] = map[RepoID]struct{}{repo: {}}
	case set != nil:
		set[repo] = struct{}{}
	}
}

// Recompute runs ComputeActions once — over every relay when full, else
// over the relay × repository pairs touched since the last Recompute — and
// turns its decisions into commands. The planner calls it once per
// discovery batch. Diffing only the touched pairs is enough: every other
// way items go missing (a connect, the end of a hold, a daily resync)
// diffs the whole relay itself.
func (m *Machine) Recompute(now time.Time, full bool) {
	var scope Scope
	if !full {
		scope.Relays = make([]RelayID, 0, len(m.affected))
		scope.Repos = make(map[RelayID][]RepoID, len(m.affected))
		for r, set := range m.affected {
			scope.Relays = append(scope.Relays, r)
			if set != nil {
				repos := make([]RepoID, 0, len(set))
				for repo := range set {
					repos = append(repos, repo)
				}
				slices.Sort(repos)
				scope.Repos[r] = repos
			}
		}
		slices.Sort(scope.Relays)
	}
	clear(m.affected)
	m.execute(now, ComputeActionsIn(m.idx, m.relays, scope, now))
	if full {
		scope.Relays = m.sortedRelays()
	}
	for _, id := range scope.Relays {
		if s, ok := m.relays[id]; ok {
			m.finish(now, s)
		}
	}
}

func (m *Machine) sortedRelays() []RelayID {
	ids := make([]RelayID, 0, len(m.relays))
	for id := range m.relays {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	return ids
}

func (m *Machine) execute(now time.Time, actions []Action) {
	for _, a := range actions {
		switch a.Kind {
		case ActionEnsureConnected:
			s := NewRelayState(a.Relay, m.idx.RelayURL(a.Relay))
			s.Status = graspv1.RelayStatus_RELAY_STATUS_CONNECTING
			s.Bootstrap = m.idx.IsBootstrap(a.Relay)
			m.relays[a.Relay] = s
			m.dirty[a.Relay] = true
			m.send(s, "", &graspv1.FetchCommand{Command: &graspv1.FetchCommand_EnsureConnected{EnsureConnected: &graspv1.EnsureConnected{}}})
		case ActionAddFilters:
			m.emitItems(now, m.relays[a.Relay], a.Items)
		case ActionDisconnectLater:
			s := m.relays[a.Relay]
			s.Status = graspv1.RelayStatus_RELAY_STATUS_DISCONNECTING
			m.dirty[a.Relay] = true
		case ActionDropRelay:
			m.drop(m.relays[a.Relay], "no repository lists this relay")
		}
	}
}

func (m *Machine) drop(s *RelayState, reason string) {
	m.send(s, "", &graspv1.FetchCommand{Command: &graspv1.FetchCommand_DropRelay{DropRelay: &graspv1.DropRelay{Reason: reason}}})
	delete(m.relays, s.ID)
	delete(m.dirty, s.ID)
	m.dropped = append(m.dropped, s.URL)
}

// finish completes a relay's recompute: retries of the connection-level
// batches once any hold has ended, and a pending replacement of its live
// subscriptions.
func (m *Machine) finish(now time.Time, s *RelayState) {
	if !s.Connected() {
		return
	}
	if s.Status == graspv1.RelayStatus_RELAY_STATUS_DISCONNECTING && m.idx.IsTarget(s.ID) {
		// Listed again before its last batches ended: keep it.
		s.Status = graspv1.RelayStatus_RELAY_STATUS_SYNCING
		if len(s.Batches) == 0 {
			s.QuietAt = now.Add(m.rules.QuietPeriod)
		}
		m.dirty[s.ID] = true
	}
	if !now.Before(s.HoldUntil) {
		if !s.AnnouncementsSynced && !s.hasBatch(BatchLayer1) {
			m.startBatch(now, s, BatchLayer1, nil, 0, false)
		}
		if s.CatchUpSince != 0 && !s.hasBatch(BatchCatchUp) {
			// Confirmed and pending items: a pending item's live
			// subscription may have been among those lost.
			if items := m.liveItems(s, nil); s.AnnouncementsSynced || len(items) > 0 {
				m.startBatch(now, s, BatchCatchUp, items, s.CatchUpSince, false)
			} else {
				s.CatchUpSince = 0 // layer 1 in full covers it
			}
		}
	}
	switch {
	case s.liveStale || s.needsReplace:
		m.replaceLive(s, nil)
	case s.trimLive:
		if m.deferring() && m.minimalAbove(s) {
			m.deferConsolidation(now, s)
		} else {
			m.replaceLive(s, nil)
		}
	}
	if s.Status == graspv1.RelayStatus_RELAY_STATUS_CONNECTED_HISTORIC_SYNC_FAILURES && len(s.Batches) == 0 && s.QuietAt.IsZero() {
		// The failed items may have left the target: look again.
		s.QuietAt = now.Add(m.rules.QuietPeriod)
	}
}

// HandleReport advances a relay's lifecycle from one fetcher report. Reports
// for a session other than the relay's current one are ignored: an EOSE from
// a dead connection must not confirm a batch whose subscriptions no longer
// exist.
func (m *Machine) HandleReport(now time.Time, r *graspv1.FetchReport) {
	id, ok := m.idx.LookupRelay(r.GetRelayUrl())
	if !ok {
		return
	}
	s, ok := m.relays[id]
	if !ok {
		return
	}
	at := now
	if r.GetAt() > 0 {
		at = time.UnixMilli(r.GetAt())
	}
	switch rep := r.GetReport().(type) {
	case *graspv1.FetchReport_Connected:
		m.onConnected(now, s, r.GetSessionId())
	case *graspv1.FetchReport_Disconnected:
		if r.GetSessionId() == "" || r.GetSessionId() != s.Session {
			if s.restored && r.GetSessionId() == s.resumeSession {
				// The session the previous planner knew ended while no
				// planner was watching: that is when the live stream was
				// lost.
				s.resumeSession = ""
				s.DisconnectedAt = at
				m.dirty[id] = true
			}
			return
		}
		m.endSession(s, at)
		if !m.idx.IsTarget(id) {
			m.drop(s, "no repository lists this relay")
		}
	case *graspv1.FetchReport_BatchDone:
		if r.GetSessionId() != s.Session || s.Session == "" {
			return
		}
		s.LastSeen = now
		m.onBatchDone(now, s, rep.BatchDone)
	case *graspv1.FetchReport_Health:
		if r.GetSessionId() == s.Session && s.Session != "" {
			s.LastSeen = now
		}
		dead := rep.Health.GetState() == graspv1.HealthState_HEALTH_STATE_DEAD
		if dead != s.Dead {
			s.Dead = dead
			m.dirty[id] = true
		}
	case *graspv1.FetchReport_RateLimited:
		if r.GetSessionId() == s.Session && s.Session != "" {
			s.LastSeen = now
			// No new batches during the relay's cooldown.
			if until := time.UnixMilli(rep.RateLimited.GetUntil()); rep.RateLimited.GetUntil() > 0 && until.After(s.HoldUntil) {
				s.HoldUntil = until
			}
		}
	case *graspv1.FetchReport_SubscriptionClosed:
		if r.GetSessionId() != s.Session || s.Session == "" || !rep.SubscriptionClosed.GetLive() {
			return // a historic part is retried or reported failed by the fetcher
		}
		s.LastSeen = now
		m.onLiveClosed(now, s, at, rep.SubscriptionClosed.GetRetryAt())
	}
}

// onLiveClosed handles a live subscription the relay closed while the
// connection stayed up: events from then until it is open again are missed
// by live, so layer 1 and the confirmed items are caught up from
// at − SinceBuffer once it is open again (the report does not say which
// subscription it was). If the fetcher will not reopen it, the live set is
// replaced now.
func (m *Machine) onLiveClosed(now time.Time, s *RelayState, at time.Time, retryAtMs int64) {
	since := at.Add(-m.rules.SinceBuffer).Unix()
	if s.CatchUpSince == 0 || since < s.CatchUpSince {
		s.CatchUpSince = since
	}
	s.catchUpGen++ // a catch-up in flight may predate the gap
	if retryAtMs > 0 {
		// Catch up only after the fetcher reopened it, or the gap between
		// the catch-up and the reopening would be missed.
		if reopen := time.UnixMilli(retryAtMs).Add(time.Second); reopen.After(s.HoldUntil) {
			s.HoldUntil = reopen
		}
	} else {
		s.needsReplace = true
	}
	m.dirty[s.ID] = true
	m.finish(now, s)
}

// endSession records that the relay's session ended at at: its batches and
// live subscriptions died with it.
func (m *Machine) endSession(s *RelayState, at time.Time) {
	s.Status = graspv1.RelayStatus_RELAY_STATUS_DISCONNECTED
	s.Session = ""
	s.DisconnectedAt = at
	s.Dead = false
	m.clearPending(s)
	s.LiveFilters = 0
	s.liveStale, s.needsReplace, s.trimLive = false, false, false
	s.deferredFor = ""
	s.minKnown = false
	s.QuietAt = time.Time{}
	m.dirty[s.ID] = true
}

func (m *Machine) clearPending(s *RelayState) {
	for _, b := range s.Batches {
		m.obs.BatchAbandoned(s.URL, b.Kind)
	}
	s.Batches = nil
	s.minKnown = false
	for _, p := range s.Pairs {
		p.Pending = nil
		p.RepoPending = false
	}
}

func (m *Machine) clearConfirmed(s *RelayState) {
	clear(s.Pairs)
	s.AnnouncementsSynced = false
	s.CatchUpSince = 0
	s.Failures = 0
	s.Incomplete, s.LastIncomplete = 0, ""
}

func (m *Machine) onConnected(now time.Time, s *RelayState, session string) {
	if session == "" {
		return
	}
	if session == s.Session {
		// A repeated Connected: the heartbeat's answer. Persist the sign of
		// life now and then, so a successor's catch-up starts close to it.
		if now.Sub(s.LastSeen) >= time.Minute {
			m.dirty[s.ID] = true
		}
		s.LastSeen = now
		return
	}
	if s.Session != "" {
		// A new session while the old one was never reported closed (the
		// fetcher died, or the report was lost): the old one was last known
		// alive at LastSeen.
		m.endSession(s, s.LastSeen)
	}
	kind := KindFresh
	sameSession := s.restored && session == s.resumeSession
	switch {
	case sameSession:
		kind = KindResume
	case s.LastConnected.IsZero():
		kind = KindFresh
	case now.Sub(s.DisconnectedAt) <= m.rules.QuickReconnect:
		kind = KindQuick
	default:
		kind = KindLong
	}
	if !s.NextResync.IsZero() && !now.Before(s.NextResync) && kind != KindFresh {
		kind = KindDaily // due anyway: do it now instead of a catch-up
	}
	s.restored, s.resumeSession = false, ""
	s.Session = session
	s.Status = graspv1.RelayStatus_RELAY_STATUS_SYNCING
	s.LastConnected, s.LastSeen = now, now
	s.Dead = false
	s.HoldUntil = time.Time{}
	s.QuietAt = time.Time{}
	m.clearPending(s)
	s.LiveFilters = 0
	s.liveStale = kind == KindResume
	s.needsReplace, s.trimLive = false, false
	s.deferredFor = "" // the new session's live set is built from scratch
	m.dirty[s.ID] = true
	m.obs.Reconnected(s.URL, kind)

	var since int64
	switch kind {
	case KindFresh, KindLong, KindDaily:
		m.clearConfirmed(s)
		s.NextResync = now.Add(m.resyncInterval())
	case KindQuick, KindResume:
		since = s.DisconnectedAt.Add(-m.rules.SinceBuffer).Unix()
		if s.CatchUpSince != 0 && s.CatchUpSince < since {
			since = s.CatchUpSince // an earlier catch-up never finished
		}
		if s.NextResync.IsZero() {
			s.NextResync = now.Add(m.resyncInterval())
		}
	}
	// Layer 1 in full until the relay's announcements were synced once;
	// afterwards the catch-up (layer 1 and every confirmed item, with since)
	// covers what the outage missed. The base live filter opens with
	// whichever comes first.
	if !s.AnnouncementsSynced {
		m.startBatch(now, s, BatchLayer1, nil, 0, !s.liveStale)
	}
	if items := m.liveItems(s, nil); since != 0 && (s.AnnouncementsSynced || len(items) > 0) {
		s.CatchUpSince = since
		s.catchUpGen++
		m.startBatch(now, s, BatchCatchUp, items, since, !s.liveStale)
	} else {
		s.CatchUpSince = 0 // layer 1 in full covers it
	}
	m.emitItems(now, s, MissingItems(m.idx, s))
	m.finish(now, s)
}

// dailyResync is a fresh start on the running session: confirmed state is
// cleared and everything is fetched again; the live subscriptions are
// replaced with one consolidated set. Not counted as a disconnect.
func (m *Machine) dailyResync(now time.Time, s *RelayState) {
	m.obs.Reconnected(s.URL, KindDaily)
	m.clearPending(s)
	m.clearConfirmed(s)
	s.Status = graspv1.RelayStatus_RELAY_STATUS_SYNCING
	s.QuietAt = time.Time{}
	s.HoldUntil = time.Time{}
	s.NextResync = now.Add(m.resyncInterval())
	s.liveStale = true
	m.dirty[s.ID] = true
	m.startBatch(now, s, BatchLayer1, nil, 0, false)
	m.emitItems(now, s, MissingItems(m.idx, s))
	m.finish(now, s)
}

func (m *Machine) resyncInterval() time.Duration {
	span := m.rules.ResyncMax - m.rules.ResyncMin
	return m.rules.ResyncMin + time.Duration(m.jitter()*float64(span))
}

func (m *Machine) onBatchDone(now time.Time, s *RelayState, done *graspv1.BatchDone) {
	i := slices.IndexFunc(s.Batches, func(b *PendingBatch) bool { return b.ID == done.GetBatchId() && b.Session == s.Session })
	if i < 0 {
		return
	}
	b := s.Batches[i]
	s.Batches = slices.Delete(s.Batches, i, i+1)
	ok := done.GetOutcome() == graspv1.BatchOutcome_BATCH_OUTCOME_OK
	if done.GetOutcome() == graspv1.BatchOutcome_BATCH_OUTCOME_INCOMPLETE {
		// Not everything could be read: nothing of it is confirmed, and it
		// is retried like a failed batch (docs/decisions.md, "History:
		// reading a crowded second completely").
		s.Incomplete++
		s.LastIncomplete = truncateText(done.GetError(), maxIncompleteText)
		m.obs.BatchIncomplete(s.URL, b.Kind)
	}
	m.obs.BatchFinished(s.URL, b.Kind, ok, now.Sub(b.Started))
	m.dirty[s.ID] = true
	switch {
	case !ok:
		s.Failures++
		s.HoldUntil = now.Add(m.rules.FailureRetry)
		if b.Kind == BatchItems && len(b.Items) > 0 {
			// Its items leave the live set, so their live subscriptions
			// must close at the fetcher too: the retry after the hold
			// opens them again, and without this replacement every
			// failure would leave one more copy open. finish replaces the
			// live set (or queues that, for a relay above its budget).
			s.trimLive = true
		}
		for _, it := range b.Items {
			if p := s.Pairs[it.Repo]; p != nil && b.Kind == BatchItems {
				// Its items leave the live set.
				q := minus(p.Pending, it.Roots)
				repos := 0
				if it.NeedRepo && p.RepoPending {
					repos = 1
				}
				s.lowerMin(repos, len(p.Pending)-len(q))
				p.Pending = q
				if it.NeedRepo {
					p.RepoPending = false
				}
			}
		}
	case b.Kind == BatchLayer1:
		s.AnnouncementsSynced = true
	case b.Kind == BatchCatchUp:
		if b.catchUpGen == s.catchUpGen {
			s.CatchUpSince = 0
		}
	case b.Kind == BatchItems:
		targets := m.idx.TargetRepos(s.ID)
		for _, it := range b.Items {
			if _, listed := targets[it.Repo]; !listed {
				continue // removed while in flight
			}
			p := s.pair(it.Repo)
			if it.NeedRepo {
				p.RepoConfirmed, p.RepoPending = true, false
			}
			p.Pending = minus(p.Pending, it.Roots)
			p.Confirmed = union(p.Confirmed, intersect(it.Roots, m.idx.Repo(it.Repo).Roots))
			shareRoots(p, m.idx.Repo(it.Repo))
		}
	}
	if len(s.Batches) == 0 {
		s.QuietAt = now.Add(m.rules.QuietPeriod)
		if !m.idx.IsTarget(s.ID) {
			m.drop(s, "no repository lists this relay")
			return
		}
	}
	m.finish(now, s) // a superseded catch-up is followed by a new one
}

// Tick runs what is due at now: statuses after the quiet period, retries
// after a hold, daily resyncs, the heartbeat and a round of deferred
// consolidations.
func (m *Machine) Tick(now time.Time) {
	for _, id := range m.sortedRelays() {
		s := m.relays[id]
		if !s.QuietAt.IsZero() && !now.Before(s.QuietAt) {
			s.QuietAt = time.Time{}
			if len(s.Batches) == 0 && s.Connected() {
				m.settle(s)
			}
		}
		if !s.HoldUntil.IsZero() && !now.Before(s.HoldUntil) {
			s.HoldUntil = time.Time{}
			m.execute(now, ComputeActions(m.idx, m.relays, []RelayID{id}, now))
			if _, still := m.relays[id]; still {
				m.finish(now, s)
			}
		}
		if _, still := m.relays[id]; still && s.Connected() && !s.NextResync.IsZero() && !now.Before(s.NextResync) {
			m.dailyResync(now, s)
		}
	}
	if m.rules.Heartbeat > 0 && !now.Before(m.nextHeartbeat) {
		if !m.nextHeartbeat.IsZero() {
			for _, id := range m.sortedRelays() {
				m.send(m.relays[id], "", &graspv1.FetchCommand{Command: &graspv1.FetchCommand_EnsureConnected{EnsureConnected: &graspv1.EnsureConnected{}}})
			}
		}
		m.nextHeartbeat = now.Add(m.rules.Heartbeat)
	}
	m.drainDeferred(now)
}

// settle moves a relay out of Syncing once its quiet period passed with no
// batch pending.
func (m *Machine) settle(s *RelayState) {
	complete := s.AnnouncementsSynced && s.CatchUpSince == 0 && len(MissingItems(m.idx, s)) == 0
	if complete {
		s.Failures = 0
		s.Incomplete, s.LastIncomplete = 0, ""
	}
	status := graspv1.RelayStatus_RELAY_STATUS_CONNECTED
	if s.Failures > 0 {
		status = graspv1.RelayStatus_RELAY_STATUS_CONNECTED_HISTORIC_SYNC_FAILURES
	}
	switch s.Status {
	case graspv1.RelayStatus_RELAY_STATUS_SYNCING, graspv1.RelayStatus_RELAY_STATUS_CONNECTED_HISTORIC_SYNC_FAILURES:
		if s.Status != status {
			s.Status = status
			m.dirty[s.ID] = true
		}
	}
}

// NextDeadline is the earliest time Tick has something to do (zero: none).
func (m *Machine) NextDeadline() time.Time {
	var next time.Time
	consider := func(t time.Time) {
		if !t.IsZero() && (next.IsZero() || t.Before(next)) {
			next = t
		}
	}
	for _, s := range m.relays {
		consider(s.QuietAt)
		consider(s.HoldUntil)
		if s.Connected() {
			consider(s.NextResync)
		}
	}
	if m.rules.Heartbeat > 0 {
		consider(m.nextHeartbeat)
	}
	if len(m.deferred) > 0 {
		consider(m.consolidateAt)
	}
	return next
}

// emitItems starts batches for new items: live subscriptions (limit 0) and
// their history. If the relay's live filters would exceed the budget, all its
// live subscriptions are first replaced with the minimal set for confirmed ∪
// pending ∪ new items (consolidation), and the batches carry history only.
// Consolidation never waits for pending batches. A relay whose minimal set
// alone is above the budget keeps the new live subscriptions and has its
// consolidation queued (deferConsolidation): the budget cannot hold for it
// anyway, and building ~1 MB of filters per relay would make the discovery
// batch's recompute pay for relays it barely touched.
func (m *Machine) emitItems(now time.Time, s *RelayState, items []BatchItem) {
	if len(items) == 0 {
		return
	}
	batches := m.split(items)
	n := 0
	for _, b := range batches {
		n += m.countItems(b)
	}
	withLive := true
	if s.liveStale {
		m.replaceLive(s, items)
		withLive = false
	} else {
		verdict, exact := m.overBudget(s, s.LiveFilters+n, items, n)
		switch verdict {
		case consolidateNow:
			m.replaceLive(s, items)
			withLive = false
		case consolidateLater:
			m.deferConsolidation(now, s)
		}
		if withLive {
			if exact >= 0 {
				s.minLo, s.minHi = exact, exact
			} else {
				s.minHi += n // the new items add at most their own filters
			}
		}
	}
	for _, b := range batches {
		m.startBatch(now, s, BatchItems, b, 0, withLive)
	}
}

// budgetVerdict is overBudget's answer.
type budgetVerdict int

const (
	withinBudget     budgetVerdict = iota
	consolidateNow                 // the minimal set fits the budget, or deferral is off
	consolidateLater               // over the headroom of a minimal set above the budget
)

// overBudget says whether total live filters need consolidating, and
// returns the exact minimal set size with extra when it had to compute it
// (else −1). The budget is MaxLiveFilters; a relay whose minimal set alone
// is larger (at design scale, a relay listed by 100 repositories with 5,000
// roots needs ~150 filters of 100 values) gets its minimal set plus a
// headroom of half to all of the budget (see headroom), so it is not
// consolidated on every batch, and its consolidation is deferred when
// deferral is on. When the bounds already show the minimal set is above
// the budget, deferring needs no exact size: the deferred consolidation is
// built from the relay's state when it is drained.
func (m *Machine) overBudget(s *RelayState, total int, extra []BatchItem, n int) (budgetVerdict, int) {
	t := m.rules.MaxLiveFilters
	if total <= t {
		return withinBudget, -1
	}
	if !s.minKnown {
		exact := m.minimalSize(s, nil)
		s.minLo, s.minHi, s.minKnown = exact, exact, true
	}
	lo, hi, room := s.minLo, s.minHi+n, headroom(s, t)
	if hi <= t {
		return consolidateNow, -1 // the minimal set fits the budget
	}
	if lo > t {
		if total <= lo+room {
			return withinBudget, -1
		}
		if m.deferring() {
			return consolidateLater, -1
		}
		if total > hi+room {
			return consolidateNow, -1
		}
	}
	exact := m.minimalSize(s, extra)
	switch {
	case exact <= t:
		return consolidateNow, exact
	case total <= exact+room:
		return withinBudget, exact
	case m.deferring():
		return consolidateLater, exact
	}
	return consolidateNow, exact
}

// deferring reports whether consolidations of relays whose minimal set is
// above the budget are queued rather than built at once.
func (m *Machine) deferring() bool { return m.rules.ConsolidatePerTick > 0 }

// minimalAbove reports whether the relay's minimal live set is above the
// budget, from the bounds when they tell, else by computing it.
func (m *Machine) minimalAbove(s *RelayState) bool {
	if s.minKnown && s.minLo > m.rules.MaxLiveFilters {
		return true
	}
	exact := m.minimalSize(s, nil)
	s.minLo, s.minHi, s.minKnown = exact, exact, true
	return exact > m.rules.MaxLiveFilters
}

// lowerMin keeps minLo a lower bound of the minimal live set when
// repositories and roots leave it: they take at most the filters they
// would need on their own, so the bound stays useful without a pass over
// every pair.
func (s *RelayState) lowerMin(repos, roots int) {
	s.minLo = max(0, s.minLo-filters.CountItems(repos, repos, roots))
}

// deferConsolidation queues the relay's consolidation for its current
// session; a relay already queued keeps its place. The queue holds each
// relay at most once, so it is bounded by the tracked relays.
func (m *Machine) deferConsolidation(now time.Time, s *RelayState) {
	s.deferredFor = s.Session
	if m.queued[s.ID] {
		return
	}
	m.queued[s.ID] = true
	m.deferred = append(m.deferred, s.ID)
	if m.consolidateAt.IsZero() {
		m.consolidateAt = now
	}
}

// drainDeferred builds up to ConsolidatePerTick queued consolidations, oldest
// first, once ConsolidateEvery has passed since the last round. Each is
// built from confirmed ∪ pending at that moment, so it covers every item
// whose live subscription it replaces. An entry whose relay was dropped,
// changed session or was consolidated meanwhile is skipped.
func (m *Machine) drainDeferred(now time.Time) {
	if len(m.deferred) == 0 || now.Before(m.consolidateAt) {
		return
	}
	for done := 0; done < m.rules.ConsolidatePerTick && len(m.deferred) > 0; {
		id := m.deferred[0]
		m.deferred = slices.Delete(m.deferred, 0, 1)
		delete(m.queued, id)
		s, ok := m.relays[id]
		if !ok || s.deferredFor == "" || s.deferredFor != s.Session || !s.Connected() {
			continue
		}
		done++
		// Built even if the exact size shows the relay a little below its
		// limit (it was queued on a lower bound): it is at its limit's edge,
		// and checking costs most of what building does.
		m.replaceLive(s, nil)
	}
	m.consolidateAt = now.Add(m.rules.ConsolidateEvery)
}

// headroom is how far a relay whose minimal live set exceeds the budget may
// grow past it before consolidating: between half the budget and the budget,
// fixed per relay (a hash of its URL). Relays that grow alike would
// otherwise all consolidate in the same discovery batch.
func headroom(s *RelayState, budget int) int {
	h := fnv.New32a()
	h.Write([]byte(s.URL))
	return budget/2 + int(h.Sum32()%uint32(budget-budget/2))
}

func (m *Machine) minimalSize(s *RelayState, extra []BatchItem) int {
	return 1 + m.countItems(m.liveItems(s, extra))
}

// LiveBudget is the most live filters a relay may have open: MaxLiveFilters,
// or its minimal set plus its headroom when the minimal set alone is larger.
// A relay with a deferred consolidation queued may be above it until Tick
// builds it.
func (m *Machine) LiveBudget(s *RelayState) int {
	min := m.minimalSize(s, nil)
	if min > m.rules.MaxLiveFilters {
		return min + headroom(s, m.rules.MaxLiveFilters)
	}
	return m.rules.MaxLiveFilters
}

// DeferredConsolidations is how many relays have a consolidation queued.
func (m *Machine) DeferredConsolidations() int { return len(m.deferred) }

// replaceLive sends one ReplaceLive with the minimal live set: layer 1 plus
// every confirmed, pending and extra item.
func (m *Machine) replaceLive(s *RelayState, extra []BatchItem) {
	refs, idents, roots := m.itemValues(m.liveItems(s, extra))
	fs := append([]nostr.Filter{filters.Base()}, filters.Items(refs, idents, m.hexes(m.hexOrder(roots)))...)
	if !s.liveStale {
		m.obs.Consolidated(s.URL)
	}
	s.LiveFilters = len(fs)
	s.minLo, s.minHi, s.minKnown = len(fs), len(fs), true
	s.liveStale, s.needsReplace, s.trimLive = false, false, false
	s.deferredFor = "" // a queued consolidation is not needed any more
	live := filters.ToProtos(filters.Live(fs))
	per := m.rules.MaxFiltersPerCommand
	if per <= 0 {
		per = len(live)
	}
	// The first part replaces every live subscription; the rest are added
	// as live-only AddFilters (no batch id), each one REQ of bounded size.
	m.send(s, s.Session, &graspv1.FetchCommand{Command: &graspv1.FetchCommand_ReplaceLive{ReplaceLive: &graspv1.ReplaceLive{
		LiveFilters: live[:min(per, len(live))],
	}}})
	for i := per; i < len(live); i += per {
		m.send(s, s.Session, &graspv1.FetchCommand{Command: &graspv1.FetchCommand_AddFilters{AddFilters: &graspv1.AddFilters{
			LiveFilters: live[i:min(i+per, len(live))],
		}}})
	}
	m.dirty[s.ID] = true
}

// liveItems is confirmed ∪ pending ∪ extra, one item per repository.
func (m *Machine) liveItems(s *RelayState, extra []BatchItem) []BatchItem {
	byRepo := make(map[RepoID]*BatchItem, len(s.Pairs)+len(extra))
	var order []RepoID
	add := func(repo RepoID, need bool, roots []RootID) {
		it := byRepo[repo]
		if it == nil {
			it = &BatchItem{Repo: repo}
			byRepo[repo] = it
			order = append(order, repo)
		}
		it.NeedRepo = it.NeedRepo || need
		if len(roots) > 0 {
			it.Roots = union(it.Roots, roots)
		}
	}
	for repo, p := range s.Pairs {
		add(repo, p.RepoConfirmed || p.RepoPending, union(p.Confirmed, p.Pending))
	}
	for _, it := range extra {
		add(it.Repo, it.NeedRepo, it.Roots)
	}
	slices.Sort(order)
	out := make([]BatchItem, 0, len(order))
	for _, r := range order {
		if it := byRepo[r]; it.NeedRepo || len(it.Roots) > 0 {
			out = append(out, *it)
		}
	}
	return out
}

// split cuts items into batches of at most MaxBatchItems (repositories +
// roots); a repository with more roots than that is spread over batches.
func (m *Machine) split(items []BatchItem) [][]BatchItem {
	max := m.rules.MaxBatchItems
	if max <= 0 {
		return [][]BatchItem{items}
	}
	var out [][]BatchItem
	var cur []BatchItem
	size := 0
	for _, it := range items {
		need := it.NeedRepo
		roots := it.Roots
		for need || len(roots) > 0 {
			if size >= max {
				out, cur, size = append(out, cur), nil, 0
			}
			room := max - size
			part := BatchItem{Repo: it.Repo, NeedRepo: need}
			if need {
				room--
				size++
				need = false
			}
			k := min(room, len(roots))
			if k > 0 {
				part.Roots = roots[:k:k]
			}
			roots = roots[k:]
			size += k
			cur = append(cur, part)
		}
	}
	if len(cur) > 0 {
		out = append(out, cur)
	}
	return out
}

func (m *Machine) countItems(items []BatchItem) int {
	refs, idents, roots := m.itemValues(items)
	slices.Sort(roots)
	return filters.CountItems(len(refs), len(idents), len(slices.Compact(roots)))
}

// itemValues collects the repository refs, identifiers and roots of items.
// roots is a fresh slice, unsorted.
func (m *Machine) itemValues(items []BatchItem) (refs, idents []string, roots []RootID) {
	for _, it := range items {
		if it.NeedRepo {
			repo := m.idx.Repo(it.Repo)
			refs = append(refs, repo.Ref)
			refs = append(refs, repo.Aliases...)
			if repo.Identifier != "" {
				idents = append(idents, repo.Identifier)
			}
		}
		roots = append(roots, it.Roots...)
	}
	slices.Sort(idents)
	return refs, slices.Compact(idents), roots
}

// hexOrder sorts roots into hex order without duplicates. Hex order is the
// order of the ids' bytes, so roots are sorted as integers keyed by the
// first 4 bytes of the id above the root's own id — a plain integer sort,
// several times faster than comparing through a function — and the rare
// runs sharing those 4 bytes are then ordered by the full id.
func (m *Machine) hexOrder(roots []RootID) []RootID {
	tab := m.idx.Roots
	keys := make([]uint64, len(roots))
	for i, r := range roots {
		keys[i] = tab.Prefix(r)>>32<<32 | uint64(r)
	}
	slices.Sort(keys)
	keys = slices.Compact(keys) // equal keys are the same root
	out := roots[:len(keys)]
	for i, k := range keys {
		out[i] = RootID(uint32(k))
	}
	for i := 0; i < len(keys); {
		j := i + 1
		for j < len(keys) && keys[j]>>32 == keys[i]>>32 {
			j++
		}
		if j-i > 1 {
			slices.SortFunc(out[i:j], func(a, b RootID) int {
				return bytes.Compare(tab.ids[a][:], tab.ids[b][:])
			})
		}
		i = j
	}
	return out
}

// startBatch sends one AddFilters: live (limit 0) unless the live set was
// just replaced, plus the historic part tracked as a PendingBatch.
func (m *Machine) startBatch(now time.Time, s *RelayState, kind BatchKind, items []BatchItem, since int64, withLive bool) {
	m.seq++
	b := &PendingBatch{ID: strconv.FormatUint(m.epoch, 10) + "-" + strconv.FormatUint(m.seq, 10), Session: s.Session, Kind: kind, Items: items, Since: since, Started: now,
		catchUpGen: s.catchUpGen}
	var fs []nostr.Filter
	refs, idents, roots := m.itemValues(items)
	hexes := m.hexes(m.hexOrder(roots))
	liveFrom := 0
	switch kind {
	case BatchLayer1:
		fs = []nostr.Filter{filters.Base()}
	case BatchCatchUp:
		fs = append([]nostr.Filter{filters.Base()}, filters.Items(refs, idents, hexes)...)
		if s.hasBatch(BatchLayer1) {
			liveFrom = 1 // the layer-1 batch of this session opened it
		}
	default:
		fs = filters.Items(refs, idents, hexes)
	}
	add := &graspv1.AddFilters{BatchId: b.ID, HistoricFilters: filters.ToProtos(fs), Layer1: kind == BatchLayer1}
	if kind == BatchItems {
		add.RefetchFilters = filters.ToProtos(m.refetchFilters(items))
	}
	if since != 0 {
		add.Since = &since
	}
	if withLive && len(fs) > liveFrom {
		add.LiveFilters = liveOf(add.HistoricFilters[liveFrom:])
		s.LiveFilters += len(fs) - liveFrom
	}
	for _, it := range items {
		if kind == BatchItems {
			p := s.pair(it.Repo)
			if it.NeedRepo {
				p.RepoPending = true
			}
			p.Pending = union(p.Pending, it.Roots)
		}
	}
	add.RepoRefs, add.RootEventIds = refs, hexes
	if len(refs) > 0 && len(refs) != countNeedRepo(items) {
		// The filters name maintainers' coordinates too; the batch covers
		// the repositories.
		add.RepoRefs = make([]string, 0, len(items))
		for _, it := range items {
			if it.NeedRepo {
				add.RepoRefs = append(add.RepoRefs, m.idx.Repo(it.Repo).Ref)
			}
		}
	}
	s.Batches = append(s.Batches, b)
	s.QuietAt = time.Time{}
	if s.Status != graspv1.RelayStatus_RELAY_STATUS_DISCONNECTING {
		s.Status = graspv1.RelayStatus_RELAY_STATUS_SYNCING
	}
	m.dirty[s.ID] = true
	m.obs.BatchStarted(s.URL, kind)
	m.send(s, s.Session, &graspv1.FetchCommand{Command: &graspv1.FetchCommand_AddFilters{AddFilters: add}})
}

func countNeedRepo(items []BatchItem) int {
	n := 0
	for _, it := range items {
		if it.NeedRepo {
			n++
		}
	}
	return n
}

// refetchFilters asks for the announcements and states of the maintainers
// of the repositories whose own part items fetch, by author and identifier:
// the revival of refusals the ingester remembered while those authors
// maintained nothing we serve (docs/decisions.md, "Remembered refusals").
func (m *Machine) refetchFilters(items []BatchItem) []nostr.Filter {
	var authors, idents []string
	for _, it := range items {
		if !it.NeedRepo {
			continue
		}
		repo := m.idx.Repo(it.Repo)
		if len(repo.Maintainers) == 0 || repo.Identifier == "" {
			continue
		}
		authors = append(authors, repo.Maintainers...)
		idents = append(idents, repo.Identifier)
	}
	return filters.Maintained(authors, idents)
}

// liveOf returns live-only ("limit": 0) copies of historic filters without
// converting them again (the largest cost of a batch's command after the
// ids): the copies share the filters' value slices and tag messages, which
// is safe because a command is never modified once built.
func liveOf(historic []*graspv1.Filter) []*graspv1.Filter {
	out := make([]*graspv1.Filter, len(historic))
	for i, h := range historic {
		zero := int32(0)
		out[i] = &graspv1.Filter{Ids: h.Ids, Authors: h.Authors, Kinds: h.Kinds, Tags: h.Tags, Since: h.Since, Until: h.Until, Limit: &zero}
	}
	return out
}

// hexes encodes ids with two allocations: one string holding them all,
// sliced (substrings share its memory), built in place, and the slice.
func (m *Machine) hexes(ids []RootID) []string {
	var b strings.Builder
	b.Grow(64 * len(ids))
	var one [64]byte
	for _, id := range ids {
		hex.Encode(one[:], m.idx.Roots.ids[id][:])
		b.Write(one[:])
	}
	all := b.String()
	out := make([]string, len(ids))
	for i := range ids {
		out[i] = all[64*i : 64*i+64]
	}
	return out
}

func (m *Machine) send(s *RelayState, session string, cmd *graspv1.FetchCommand) {
	cmd.RelayUrl = s.URL
	cmd.SessionId = session
	cmd.Epoch = m.epoch
	m.out = append(m.out, cmd)
}

// shareRoots makes a fully confirmed pair share its repository's root slice
// (per-repository confirmation): at quiescence a relay × repository pair then
// costs a few words instead of 4 bytes per root. Safe because every set
// operation allocates a new slice and the index replaces, never edits, a
// repository's roots.
func shareRoots(p *PairState, repo *Repo) {
	if len(p.Confirmed) == len(repo.Roots) && len(p.Confirmed) > 0 {
		p.Confirmed = repo.Roots
	}
}

// maxIncompleteText bounds the text kept of an incomplete batch's report.
const maxIncompleteText = 500

// truncateText cuts s to at most n bytes without splitting a UTF-8 rune.
func truncateText(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + "…"
}
