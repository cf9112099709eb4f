package planner

import (
	"maps"
	"slices"
	"time"
	"unicode/utf8"

	graspv1 "github.com/grasp-sync/grasp-sync/proto/grasp/v1"
)

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
		s.limitBudget = int(rep.Connected.GetLiveFilterBudget())
		s.liveFromHistoric = rep.Connected.GetLiveFromHistoric()
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
		if b := rep.SubscriptionClosed.GetLiveFilterBudget(); b > 0 {
			s.limitBudget = int(b)
		}
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
	s.tail = nil
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

// seenPersistEvery is how stale a relay's persisted sign of life may grow
// while nothing else about it changes: a successor planner that finds the
// session ended unreported catches up from it, less SinceBuffer, so at most
// this much more is read again then.
const seenPersistEvery = time.Hour

func (m *Machine) onConnected(now time.Time, s *RelayState, session string) {
	if session == "" {
		return
	}
	if session == s.Session {
		// A repeated Connected: the heartbeat's answer. Persist the sign of
		// life now and then, so a successor's catch-up starts close to it;
		// not at every round, which rewrote every relay's record (its
		// confirmed state) for one timestamp
		// (docs/decisions/0078-quiet-keepalive-and-heartbeat.md).
		s.LastSeen = now
		if now.Sub(s.seenPersisted) >= seenPersistEvery {
			m.dirty[s.ID] = true
		}
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
	s.tail = nil
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
		m.startBatch(now, s, BatchLayer1, nil, 0, !s.liveStale, false)
	}
	if items := m.liveItems(s, nil); since != 0 && (s.AnnouncementsSynced || len(items) > 0) {
		s.CatchUpSince = since
		s.catchUpGen++
		m.startCatchUp(now, s, items, since, !s.liveStale)
	} else {
		s.CatchUpSince = 0 // layer 1 in full covers it
	}
	s.heldSince, s.heldTouched = time.Time{}, time.Time{} // all of them now
	m.emitItems(now, s, MissingItems(m.idx, s))
	m.finish(now, s)
}

// dailyResync is a fresh start on the running session: confirmed state is
// cleared and everything is fetched again; the live subscriptions are
// replaced with one consolidated set. Not counted as a disconnect. The
// batches re-reading what was confirmed are marked Resync: what they find
// that we lacked, live subscriptions and catch-ups missed.
func (m *Machine) dailyResync(now time.Time, s *RelayState) {
	m.obs.Reconnected(s.URL, KindDaily)
	was, announced := maps.Clone(s.Pairs), s.AnnouncementsSynced
	m.clearPending(s)
	m.clearConfirmed(s)
	s.Status = graspv1.RelayStatus_RELAY_STATUS_SYNCING
	s.QuietAt = time.Time{}
	s.HoldUntil = time.Time{}
	s.NextResync = now.Add(m.resyncInterval())
	s.liveStale = true
	m.dirty[s.ID] = true
	m.startBatch(now, s, BatchLayer1, nil, 0, false, announced)
	s.heldSince, s.heldTouched = time.Time{}, time.Time{} // all of them now
	items := MissingItems(m.idx, s)
	redo, rest := splitConfirmed(items, was)
	m.emitItemBatches(now, s, items, redo, rest)
	m.finish(now, s)
}

// splitConfirmed divides items into the part confirmed in was (a relay's
// pairs before a resync cleared them) and the rest.
func splitConfirmed(items []BatchItem, was map[RepoID]*PairState) (redo, rest []BatchItem) {
	for _, it := range items {
		p := was[it.Repo]
		if p == nil {
			rest = append(rest, it)
			continue
		}
		r := BatchItem{Repo: it.Repo, NeedRepo: it.NeedRepo && p.RepoConfirmed, Roots: intersect(it.Roots, p.Confirmed)}
		n := BatchItem{Repo: it.Repo, NeedRepo: it.NeedRepo && !p.RepoConfirmed, Roots: minus(it.Roots, p.Confirmed)}
		if r.NeedRepo || len(r.Roots) > 0 {
			redo = append(redo, r)
		}
		if n.NeedRepo || len(n.Roots) > 0 {
			rest = append(rest, n)
		}
	}
	return redo, rest
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
		// is retried like a failed batch (docs/decisions/0021-history-crowded-second.md).
		s.Incomplete++
		s.LastIncomplete = truncateText(done.GetError(), maxIncompleteText)
		m.obs.BatchIncomplete(s.URL, b.Kind)
	}
	m.obs.BatchFinished(s.URL, b.Kind, ok, now.Sub(b.Started))
	m.dirty[s.ID] = true
	if b.Resync && done.GetMissed() > 0 {
		// Whatever the outcome: what it published is stored, and a retry
		// would find it held.
		s.ResyncMissed += done.GetMissed()
		s.LastMissedAt = now
		m.obs.ResyncMissed(s.URL, done.GetMissed())
	}
	switch {
	case !ok:
		s.Failures++
		s.HoldUntil = now.Add(m.rules.failureHold(s.Failures))
		if b.Kind == BatchCatchUp && b.catchUpGen == s.catchUpGen {
			// The other parts of this catch-up must not end it: it is
			// started over after the hold.
			s.catchUpGen++
		}
		if b.Kind == BatchItems && len(b.Items) > 0 && !m.closeTailSet(s, b.ID) {
			// Its items leave the live set, so their live subscriptions
			// must close at the fetcher too: the retry after the hold
			// opens them again, and without this every failure would
			// leave one more copy open. Its own live set is closed by
			// name when it is still apart (closeTailSet); else finish
			// replaces the live set (or queues that, for a relay above
			// its budget).
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
		// A catch-up is several batches (startCatchUp): it ends with the
		// last of its generation.
		if b.catchUpGen == s.catchUpGen && !slices.ContainsFunc(s.Batches, func(o *PendingBatch) bool {
			return o.Kind == BatchCatchUp && o.catchUpGen == b.catchUpGen
		}) {
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
		m.flushHeld(now, s)
		if due := m.heldDue(s); !due.IsZero() && !s.QuietAt.IsZero() && s.QuietAt.Before(due) {
			s.QuietAt = due // not synced while roots are held
		}
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
		consider(m.heldDue(s))
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
