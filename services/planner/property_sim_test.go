package planner

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	graspv1 "github.com/grasp-sync/grasp-sync/proto/grasp/v1"
)

// simRelay is the simulated fetcher's view of one remote relay plus the
// events stored on it.
type simRelay struct {
	url     string
	wanted  bool   // an EnsureConnected is in force (not dropped since)
	session string // "" while disconnected
	// live: the open live subscriptions, each with its name and the item
	// keys it covers.
	live []simLive
	// batches in flight on the current session: id → batch.
	batches map[string]simBatch
	events  []simEvent
	// reopen: live subscriptions the relay closed, reopened by the fetcher
	// at their time if the session lasts.
	reopen []simReopen
	// closedLive: the relay closed a live subscription during this
	// session; live coverage is then restored by a catch-up, not checked.
	closedLive bool
	// indexed: the session's fetcher said it reads
	// AddFilters.live_from_historic (drawn per session, as a rolling
	// upgrade mixes fetchers that do and do not).
	indexed bool
	// neg: the relay reconciles with NIP-77, so the fetcher reads a
	// catch-up's items whole and since bounds nothing (docs/sync.md,
	// "Catch-ups and back-dated events"); without it since bounds the read.
	neg bool
}

type simReopen struct {
	at      time.Time
	session string
	sub     simLive
}

// simLive is one live set the fetcher holds: its name (AddFilters.live_id,
// ReplaceLive.live_id), the item keys it covers and its filter count.
type simLive struct {
	id      string
	items   []string
	filters int
}

type simBatch struct {
	session string
	items   []string
	since   int64
}

// simEvent is an event on a relay that matches one sync item: "L1" (an
// announcement), "repo:<ref>" or "root:<id>".
type simEvent struct {
	item      string
	createdAt int64
	delivered bool
	// backdated: published with a created_at an hour or more in the past.
	backdated bool
}

// sim is a model world: the planner's Machine, a fetcher that executes its
// commands exactly as the contract says (sessions, epochs, live
// subscriptions, historic batches), and relays on which events appear.
type sim struct {
	t     *testing.T
	rng   *rand.Rand
	rules Rules
	m     *Machine
	epoch uint64
	// opened are the relays live filters were opened on in this round of
	// commands (checkBudgets).
	opened   map[string]bool
	now      time.Time
	relays   map[string]*simRelay
	reports  []*graspv1.FetchReport
	maxEpoch uint64
	// stale are batches of dead sessions or old epochs whose reports can
	// still arrive late.
	stale    []*graspv1.FetchReport
	sessions int
	index    map[string]*graspv1.RepoSyncNeeds
	roots    []string
	relayURL []string
	boot     []string
	seed     uint64
	trace    bool
	// deferred and drained count deferred consolidations queued and built
	// (or found unneeded), to show the interleavings include them.
	deferred, drained int
	rootKeys          map[RootID]string
	rootKeysOf        *Machine
}

func (s *sim) logf(format string, args ...any) {
	if s.trace {
		s.t.Logf("%6d "+format, append([]any{s.now.Unix() - t0.Unix()}, args...)...)
	}
}

func (s *sim) fail(format string, args ...any) {
	s.t.Helper()
	s.t.Fatalf("seed %d: "+format, append([]any{s.seed}, args...)...)
}

func newSim(t *testing.T, seed uint64) *sim {
	rules := testRules()
	rules.MaxLiveFilters = 20
	rules.MaxBatchItems = 40
	rules.MaxFiltersPerCommand = 7
	if seed%3 == 1 {
		// A budget most relays' minimal sets exceed: their consolidations
		// are deferred, and drained one per Tick at most every 2 minutes, so
		// queued ones meet index changes, failures, session changes and
		// restarts before they are built.
		rules.MaxLiveFilters = 6
		rules.ConsolidatePerTick = 1
		rules.ConsolidateEvery = 2 * time.Minute
	}
	if seed%2 == 1 {
		// Roots that do not fill a filter held for more (chunks.go): with
		// filters of 100 roots and these small worlds, nearly all of them.
		rules.ChunkQuiet = 3 * time.Second
	}
	s := &sim{t: t, rng: rand.New(rand.NewPCG(seed, seed*7+1)), rules: rules, epoch: 1, now: t0,
		relays: map[string]*simRelay{}, index: map[string]*graspv1.RepoSyncNeeds{}, seed: seed}
	for i := range 4 {
		s.relayURL = append(s.relayURL, fmt.Sprintf("wss://r%d.example", i))
	}
	for i := range 160 {
		sum := sha256.Sum256([]byte{byte(i), byte(seed)})
		s.roots = append(s.roots, hex.EncodeToString(sum[:]))
	}
	s.boot = []string{s.relayURL[3]}
	s.m = NewMachine(rules, NewIndex(), s.epoch, s.rng.Float64, nil)
	s.m.SetBootstrap(s.boot)
	return s
}

func (s *sim) relay(url string) *simRelay {
	r := s.relays[url]
	if r == nil {
		// Half the relays reconcile with NIP-77.
		r = &simRelay{url: url, batches: map[string]simBatch{}, neg: slices.Index(s.relayURL, url)%2 == 0}
		s.relays[url] = r
	}
	return r
}

// itemsOf maps a command's filters to the sync items they cover.
func itemsOf(fs []*graspv1.Filter) []string {
	var out []string
	for _, f := range fs {
		if slices.Contains(f.GetKinds(), 30617) {
			out = append(out, "L1")
		}
		for _, tag := range f.GetTags() {
			for _, v := range tag.GetValues() {
				switch tag.GetName() {
				case "a":
					out = append(out, "repo:"+v)
				case "e":
					out = append(out, "root:"+v)
				}
			}
		}
	}
	return out
}

// apply executes the machine's commands the way a fetcher must.
func (s *sim) apply() {
	defer s.checkBudgets()
	for _, c := range s.m.Drain() {
		if s.trace {
			h := &harness{t: s.t, now: s.now, alias: map[string]string{}}
			s.logf("cmd e%d %s", c.GetEpoch(), h.render(c))
		}
		if c.GetEpoch() < s.maxEpoch {
			continue
		}
		s.maxEpoch = c.GetEpoch()
		r := s.relay(c.GetRelayUrl())
		if c.GetSessionId() != "" && c.GetSessionId() != r.session {
			continue // command for another session
		}
		switch cmd := c.GetCommand().(type) {
		case *graspv1.FetchCommand_EnsureConnected:
			r.wanted = true
			if r.session != "" {
				s.report(r, r.session, &graspv1.FetchReport_Connected{Connected: &graspv1.Connected{LiveFromHistoric: r.indexed}})
			}
		case *graspv1.FetchCommand_DropRelay:
			r.wanted = false
			s.killSession(r, false)
		case *graspv1.FetchCommand_ReplaceLive:
			r.live = []simLive{{id: cmd.ReplaceLive.GetLiveId(), items: itemsOf(cmd.ReplaceLive.GetLiveFilters()), filters: len(cmd.ReplaceLive.GetLiveFilters())}}
			r.reopen = nil // ReplaceLive cancels pending reopens too
			s.checkLive(r, cmd.ReplaceLive.GetLiveFilters(), true)
		case *graspv1.FetchCommand_CloseLive:
			closing := cmd.CloseLive.GetLiveIds()
			if after := cmd.CloseLive.GetAfterLiveId(); after != "" && !slices.ContainsFunc(r.live, func(l simLive) bool { return l.id == after }) {
				s.fail("CloseLive after %q, which is not open", after)
			}
			r.live = slices.DeleteFunc(slices.Clone(r.live), func(l simLive) bool {
				if slices.Contains(closing, l.id) {
					liveCount[r.url] -= l.filters
					return true
				}
				return false
			})
			r.reopen = slices.DeleteFunc(r.reopen, func(ro simReopen) bool {
				if slices.Contains(closing, ro.sub.id) {
					liveCount[r.url] -= ro.sub.filters
					return true
				}
				return false
			})
		case *graspv1.FetchCommand_AddFilters:
			a := cmd.AddFilters
			if r.session == "" {
				continue
			}
			if a.LiveFromHistoric != nil && !r.indexed {
				// A fetcher from before live_from_historic would open
				// nothing live.
				s.fail("AddFilters with live_from_historic to a session whose fetcher did not say it reads it")
			}
			if live := a.Live(); len(live) > 0 {
				for _, f := range live {
					if f.Limit == nil || f.GetLimit() != 0 {
						s.fail("live filter without limit 0: %v", f)
					}
				}
				r.live = append(r.live, simLive{id: a.GetLiveId(), items: itemsOf(live), filters: len(live)})
				s.checkLive(r, live, false)
			}
			for _, f := range a.GetHistoricFilters() {
				if f.Limit != nil {
					s.fail("historic filter with a limit: %v", f)
				}
			}
			if a.GetBatchId() != "" {
				r.batches[a.GetBatchId()] = simBatch{session: r.session, items: itemsOf(a.GetHistoricFilters()), since: a.GetSince()}
			}
		}
	}
}

func (s *sim) report(r *simRelay, session string, rep any) {
	fr := &graspv1.FetchReport{RelayUrl: r.url, SessionId: session, At: s.now.UnixMilli()}
	switch rep := rep.(type) {
	case *graspv1.FetchReport_Connected:
		fr.Report = rep
	case *graspv1.FetchReport_Disconnected:
		fr.Report = rep
	case *graspv1.FetchReport_BatchDone:
		fr.Report = rep
	}
	s.reports = append(s.reports, fr)
}

// killSession ends the relay's session; its batches can still report late.
func (s *sim) killSession(r *simRelay, report bool) {
	if r.session == "" {
		return
	}
	s.logf("kill %s %s reported=%v", r.url, r.session, report)
	// Each batch in flight either completed just before the connection died
	// (its history was fetched; its report arrives late) or dies unreported.
	for _, id := range sortedIDs(r.batches) {
		if s.rng.IntN(2) == 0 {
			s.deliverHistory(r, r.batches[id])
			s.stale = append(s.stale, &graspv1.FetchReport{RelayUrl: r.url, SessionId: r.batches[id].session,
				Report: &graspv1.FetchReport_BatchDone{BatchDone: &graspv1.BatchDone{BatchId: id, Outcome: graspv1.BatchOutcome_BATCH_OUTCOME_OK}}})
		}
	}
	if report {
		s.report(r, r.session, &graspv1.FetchReport_Disconnected{Disconnected: &graspv1.Disconnected{}})
	}
	r.session, r.live, r.batches, r.closedLive = "", nil, map[string]simBatch{}, false
	liveCount[r.url] = 0
}

func (s *sim) connect(r *simRelay) {
	if !r.wanted || r.session != "" {
		return
	}
	s.sessions++
	r.session = fmt.Sprintf("s%d", s.sessions)
	s.logf("connect %s %s", r.url, r.session)
	liveCount[r.url] = 0
	r.indexed = s.rng.IntN(2) == 0
	s.report(r, r.session, &graspv1.FetchReport_Connected{Connected: &graspv1.Connected{LiveFromHistoric: r.indexed}})
}

// finishBatch completes one batch: its history (events of its items since
// its since, up to now) is delivered, then BatchDone is reported.
func (s *sim) finishBatch(r *simRelay, id string, ok bool) {
	b := r.batches[id]
	delete(r.batches, id)
	s.logf("finish %s %s ok=%v since=%d items=%d", r.url, id, ok, b.since-t0.Unix(), len(b.items))
	outcome := graspv1.BatchOutcome_BATCH_OUTCOME_FAILED
	if ok {
		outcome = graspv1.BatchOutcome_BATCH_OUTCOME_OK
		s.deliverHistory(r, b)
	}
	s.report(r, b.session, &graspv1.FetchReport_BatchDone{BatchDone: &graspv1.BatchDone{BatchId: id, Outcome: outcome}})
}

// deliverHistory delivers a batch's history: the relay's events for its
// items created at or after its since (whatever their created_at on a
// NIP-77 relay), up to now.
func (s *sim) deliverHistory(r *simRelay, b simBatch) {
	for i := range r.events {
		e := &r.events[i]
		if slices.Contains(b.items, e.item) && (r.neg || e.createdAt >= b.since) {
			e.delivered = true
		}
	}
}

// publish creates an event on a relay, back-dated by an hour or more when
// asked (history republished by another syncer); an open live
// subscription of the current session covering its item delivers it at
// once, whatever its created_at.
func (s *sim) publish(r *simRelay, item string, backdated bool) {
	e := simEvent{item: item, createdAt: s.now.Unix()}
	if backdated {
		e.createdAt, e.backdated = s.now.Add(-time.Hour).Unix()-s.rng.Int64N(3600), true
	}
	defer func() {
		s.logf("event %s %s delivered=%v live=%d", r.url, item, r.events[len(r.events)-1].delivered, len(r.live))
	}()
	if r.session != "" {
		for _, sub := range r.live {
			if slices.Contains(sub.items, item) {
				e.delivered = true
			}
		}
	}
	r.events = append(r.events, e)
}

func (s *sim) deliverReports() {
	for len(s.reports) > 0 {
		rep := s.reports[0]
		s.reports = s.reports[1:]
		s.logf("report %s %s %v", rep.GetRelayUrl(), rep.GetSessionId(), rep.GetReport())
		s.m.HandleReport(s.now, rep)
		s.apply()
		s.checkNoPendingWhileDisconnected()
	}
}

func (s *sim) putRepo(i int) {
	key := fmt.Sprintf("k%d", i)
	needs := &graspv1.RepoSyncNeeds{RepoRef: fmt.Sprintf("30617:%064x:repo%d", i, i)}
	for _, u := range s.relayURL {
		if s.rng.IntN(3) == 0 {
			needs.Relays = append(needs.Relays, u)
		}
	}
	n := s.rng.IntN(8)
	if i == 0 {
		n = 130 // one repository with more roots than one filter holds
	}
	start := s.rng.IntN(len(s.roots) - n)
	needs.RootEventIds = slices.Clone(s.roots[start : start+n])
	s.index[key] = needs
	if s.trace {
		var rs []string
		for _, r := range needs.RootEventIds {
			rs = append(rs, r[:6])
		}
		s.logf("index put %s relays=%v roots=%v", key, needs.Relays, rs)
	}
	s.m.ApplyIndex([]IndexChange{s.m.Index().Put(key, needs)})
}

func (s *sim) restart() {
	s.logf("RESTART")
	var states []*graspv1.RelayState
	for _, st := range s.m.Relays() {
		states = append(states, s.m.Snapshot(st, s.now))
	}
	slices.SortFunc(states, func(a, b *graspv1.RelayState) int { return strings.Compare(a.GetRelayUrl(), b.GetRelayUrl()) })
	s.epoch++
	s.m = NewMachine(s.rules, NewIndex(), s.epoch, s.rng.Float64, nil)
	keys := make([]string, 0, len(s.index))
	for k := range s.index {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		s.m.ApplyIndex([]IndexChange{s.m.Index().Put(k, s.index[k])})
	}
	s.m.SetBootstrap(s.boot)
	s.m.Restore(states)
	s.m.Recompute(s.now, true)
	s.apply()
	// The old planner's batches stay in flight at the fetcher and report to
	// the new planner when they finish (ids it never issued).
}

func (s *sim) advance(d time.Duration) {
	s.now = s.now.Add(d)
	for _, r := range s.sortedRelays() {
		kept := r.reopen[:0]
		for _, ro := range r.reopen {
			switch {
			case ro.session != r.session:
			case !s.now.Before(ro.at):
				r.live = append(r.live, ro.sub)
			default:
				kept = append(kept, ro)
			}
		}
		r.reopen = kept
	}
	queued := s.m.DeferredConsolidations()
	s.m.Tick(s.now)
	s.drained += queued - s.m.DeferredConsolidations()
	s.apply()
}

func (s *sim) sortedRelays() []*simRelay {
	var out []*simRelay
	for _, u := range s.relayURL {
		if r, ok := s.relays[u]; ok {
			out = append(out, r)
		}
	}
	return out
}

func (s *sim) step() {
	relays := s.sortedRelays()
	pick := func() *simRelay {
		if len(relays) == 0 {
			return nil
		}
		return relays[s.rng.IntN(len(relays))]
	}
	switch op := s.rng.IntN(100); {
	case op < 15: // discovery batch: a few repositories change
		for range 1 + s.rng.IntN(3) {
			i := s.rng.IntN(8)
			if s.rng.IntN(6) == 0 {
				delete(s.index, fmt.Sprintf("k%d", i))
				s.logf("index delete k%d", i)
				s.m.ApplyIndex([]IndexChange{s.m.Index().Delete(fmt.Sprintf("k%d", i))})
			} else {
				s.putRepo(i)
			}
		}
		queued := s.m.DeferredConsolidations()
		s.m.Recompute(s.now, false)
		s.deferred += s.m.DeferredConsolidations() - queued
		s.apply()
	case op < 30:
		if r := pick(); r != nil {
			s.connect(r)
		}
	case op < 38:
		if r := pick(); r != nil {
			s.killSession(r, s.rng.IntN(8) != 0) // sometimes unreported
		}
	case op < 60:
		if r := pick(); r != nil && len(r.batches) > 0 {
			ids := make([]string, 0, len(r.batches))
			for id := range r.batches {
				ids = append(ids, id)
			}
			slices.Sort(ids)
			s.finishBatch(r, ids[s.rng.IntN(len(ids))], s.rng.IntN(10) != 0)
		}
	case op < 75:
		s.deliverReports()
	case op < 80:
		if len(s.stale) > 0 {
			i := s.rng.IntN(len(s.stale))
			s.reports = append(s.reports, s.stale[i])
			s.stale = slices.Delete(s.stale, i, i+1)
		}
	case op < 90: // events appear on the relays
		if r := pick(); r != nil {
			items := s.items()
			s.publish(r, items[s.rng.IntN(len(items))], s.rng.IntN(4) == 0)
		}
	case op < 92: // the relay closes a live subscription
		if r := pick(); r != nil && r.session != "" && len(r.live) > 0 {
			i := s.rng.IntN(len(r.live))
			sub := r.live[i]
			r.live = slices.Delete(slices.Clone(r.live), i, i+1)
			r.closedLive = true
			closed := &graspv1.SubscriptionClosed{Live: true, Reason: "closed by relay"}
			if s.rng.IntN(2) == 0 {
				at := s.now.Add(30 * time.Second)
				closed.RetryAt = at.UnixMilli()
				r.reopen = append(r.reopen, simReopen{at: at, session: r.session, sub: sub})
			}
			s.reports = append(s.reports, &graspv1.FetchReport{RelayUrl: r.url, SessionId: r.session, At: s.now.UnixMilli(),
				Report: &graspv1.FetchReport_SubscriptionClosed{SubscriptionClosed: closed}})
		}
	case op < 97: // time passes: short, or longer than the quick window
		d := time.Duration(1+s.rng.IntN(300)) * time.Second
		switch s.rng.IntN(10) {
		case 0:
			d = 20 * time.Minute
		case 1:
			d = 0 // a Tick at the same instant: only what is due now
		}
		s.advance(d)
	default:
		s.restart()
	}
	s.checkNoPendingWhileDisconnected()
	s.checkLiveCovers()
	s.checkLiveEqualsPlanned()
}

// items are the sync items of the whole index, sorted.
func (s *sim) items() []string {
	items := []string{"L1"}
	for _, needs := range s.index {
		items = append(items, "repo:"+needs.GetRepoRef())
		for _, root := range needs.GetRootEventIds() {
			items = append(items, "root:"+root)
		}
	}
	slices.Sort(items)
	return items
}

// backdatedGap has every connected relay close all its live subscriptions
// (reopened by the fetcher 30 s later) and publishes on it, meanwhile, a
// back-dated event for every item: the catch-ups that follow must bring
// those of NIP-77 relays (checkDelivered). A closed subscription rather
// than a lost connection, whose catch-up is the same: a quick reconnect's
// catch-up opens its live filters part by part, which can exceed the live
// budget a consolidated set fits, and checkLive would stop there.
func (s *sim) backdatedGap() {
	for _, r := range s.sortedRelays() {
		if r.session == "" || len(r.live) == 0 {
			continue
		}
		at := s.now.Add(30 * time.Second)
		for _, sub := range r.live {
			r.reopen = append(r.reopen, simReopen{at: at, session: r.session, sub: sub})
			s.reports = append(s.reports, &graspv1.FetchReport{RelayUrl: r.url, SessionId: r.session, At: s.now.UnixMilli(),
				Report: &graspv1.FetchReport_SubscriptionClosed{SubscriptionClosed: &graspv1.SubscriptionClosed{
					Live: true, Reason: "closed by relay", RetryAt: at.UnixMilli()}}})
		}
		r.live, r.closedLive = nil, true
		for _, item := range s.items() {
			s.publish(r, item, true)
		}
	}
	s.deliverReports()
	s.advance(time.Minute)
}

// quiesce lets everything finish without failures or disconnects.
func (s *sim) quiesce() {
	for round := range 200 {
		s.deliverReports()
		for _, r := range s.sortedRelays() {
			s.connect(r)
		}
		s.deliverReports()
		busy := false
		for _, r := range s.sortedRelays() {
			ids := make([]string, 0, len(r.batches))
			for id := range r.batches {
				ids = append(ids, id)
			}
			slices.Sort(ids)
			for _, id := range ids {
				busy = true
				s.finishBatch(r, id, true)
			}
		}
		s.deliverReports()
		s.advance(6 * time.Minute)
		held := false // a relay backing off after failures retries later
		for _, st := range s.m.Relays() {
			held = held || s.now.Before(st.HoldUntil)
		}
		for _, r := range s.relays {
			busy = busy || len(r.batches) > 0 // sent by the Tick of advance
		}
		if !busy && !held && len(s.reports) == 0 && round > 2 {
			return
		}
	}
	s.fail("no quiescence after 200 rounds")
}

func sortedIDs(m map[string]simBatch) []string {
	ids := make([]string, 0, len(m))
	for id := range m {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	return ids
}
