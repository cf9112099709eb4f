package planner

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"sort"
	"strings"
	"testing"
	"time"

	graspv1 "github.com/grasp-sync/grasp-sync/proto/grasp/v1"
)

// t0 is the harness's start time.
var t0 = time.Unix(1_700_000_000, 0)

// harness drives a Machine with scripted index updates and fetcher reports
// on a fake timeline, and renders the commands it emits compactly so tests
// can assert them exactly.
type harness struct {
	t     *testing.T
	m     *Machine
	now   time.Time
	alias map[string]string // full value → short name in renderings
	repos map[string]*graspv1.RepoSyncNeeds
}

func testRules() Rules {
	r := DefaultRules()
	r.Heartbeat = 0
	// Every recompute's roots at once, so the tables can show each one's
	// batch; chunks_test.go holds them.
	r.ChunkQuiet = 0
	return r
}

func newHarness(t *testing.T, rules Rules, epoch uint64) *harness {
	h := &harness{t: t, now: t0, alias: map[string]string{}, repos: map[string]*graspv1.RepoSyncNeeds{}}
	h.m = NewMachine(rules, NewIndex(), epoch, func() float64 { return 0.5 }, nil)
	return h
}

// rootID returns a real-looking event id for a short root name.
func (h *harness) rootID(name string) string {
	sum := sha256.Sum256([]byte(name))
	id := hex.EncodeToString(sum[:])
	h.alias[id] = name
	return id
}

func repoRef(name string) string { return "30617:" + strings.Repeat("ab", 32) + ":" + name }

// repo puts a repository entry: its relays and roots (short names).
func (h *harness) repo(name string, relays []string, roots ...string) {
	ref := repoRef(name)
	h.alias[ref] = name
	needs := &graspv1.RepoSyncNeeds{RepoRef: ref, Relays: relays}
	for _, r := range roots {
		needs.RootEventIds = append(needs.RootEventIds, h.rootID(r))
	}
	h.repos[name] = needs
	h.m.ApplyIndex([]IndexChange{h.m.Index().Put("k-"+name, needs)})
}

func (h *harness) unrepo(name string) {
	h.m.ApplyIndex([]IndexChange{h.m.Index().Delete("k-" + name)})
}

func (h *harness) recompute() []string {
	h.m.Recompute(h.now, false)
	return h.drain()
}

func (h *harness) advance(d time.Duration) []string {
	h.now = h.now.Add(d)
	h.m.Tick(h.now)
	return h.drain()
}

func (h *harness) report(url, session string, r any) []string {
	rep := &graspv1.FetchReport{RelayUrl: url, SessionId: session, At: h.now.UnixMilli()}
	switch r := r.(type) {
	case *graspv1.Connected:
		rep.Report = &graspv1.FetchReport_Connected{Connected: r}
	case *graspv1.Disconnected:
		rep.Report = &graspv1.FetchReport_Disconnected{Disconnected: r}
	case *graspv1.BatchDone:
		rep.Report = &graspv1.FetchReport_BatchDone{BatchDone: r}
	case *graspv1.Health:
		rep.Report = &graspv1.FetchReport_Health{Health: r}
	case *graspv1.SubscriptionClosed:
		rep.Report = &graspv1.FetchReport_SubscriptionClosed{SubscriptionClosed: r}
	case *graspv1.RateLimited:
		rep.Report = &graspv1.FetchReport_RateLimited{RateLimited: r}
	}
	h.m.HandleReport(h.now, rep)
	return h.drain()
}

func (h *harness) connect(url, session string) []string {
	return h.report(url, session, &graspv1.Connected{LiveFromHistoric: true})
}

func (h *harness) disconnect(url, session string) []string {
	return h.report(url, session, &graspv1.Disconnected{Reason: "test"})
}

func (h *harness) done(url, session, batch string) []string {
	return h.report(url, session, &graspv1.BatchDone{BatchId: batch, Outcome: graspv1.BatchOutcome_BATCH_OUTCOME_OK})
}

func (h *harness) failed(url, session, batch string) []string {
	return h.report(url, session, &graspv1.BatchDone{BatchId: batch, Outcome: graspv1.BatchOutcome_BATCH_OUTCOME_FAILED, Error: "boom"})
}

func (h *harness) relay(url string) *RelayState {
	id, ok := h.m.Index().LookupRelay(url)
	if !ok {
		return nil
	}
	return h.m.Relays()[id]
}

func (h *harness) status(url string) string {
	s := h.relay(url)
	if s == nil {
		return "untracked"
	}
	return strings.TrimPrefix(s.Status.String(), "RELAY_STATUS_")
}

func (h *harness) drain() []string {
	var out []string
	for _, c := range h.m.Drain() {
		out = append(out, h.render(c))
	}
	return out
}

func (h *harness) name(v string) string {
	if a, ok := h.alias[v]; ok {
		return a
	}
	return v
}

// render writes a command as one line, e.g.
//
//	add wss://a s1 e1-2 repos=r1 roots=x,y since=123 live=[#a=r1/L0 ...] hist=[...]
func (h *harness) render(c *graspv1.FetchCommand) string {
	if c.GetEpoch() == 0 {
		h.t.Errorf("command without epoch: %v", c)
	}
	var b strings.Builder
	switch {
	case c.GetEnsureConnected() != nil:
		fmt.Fprintf(&b, "ensure %s", c.GetRelayUrl())
		if c.GetSessionId() != "" {
			h.t.Errorf("ensure-connected carries session %q", c.GetSessionId())
		}
	case c.GetDropRelay() != nil:
		fmt.Fprintf(&b, "drop %s", c.GetRelayUrl())
	case c.GetReplaceLive() != nil:
		fmt.Fprintf(&b, "replace %s %s live=%s", c.GetRelayUrl(), c.GetSessionId(), h.renderFilters(c.GetReplaceLive().GetLiveFilters()))
	case c.GetCloseLive() != nil:
		fmt.Fprintf(&b, "close %s %s live=%s", c.GetRelayUrl(), c.GetSessionId(), strings.Join(c.GetCloseLive().GetLiveIds(), ","))
		if after := c.GetCloseLive().GetAfterLiveId(); after != "" {
			b.WriteString(" after=" + after)
		}
	case c.GetAddFilters() != nil:
		a := c.GetAddFilters()
		fmt.Fprintf(&b, "add %s %s %s", c.GetRelayUrl(), c.GetSessionId(), a.GetBatchId())
		if a.GetLayer1() {
			b.WriteString(" L1")
		}
		if a.GetResync() {
			b.WriteString(" resync")
		}
		if len(a.GetRepoRefs()) > 0 {
			b.WriteString(" repos=" + h.names(a.GetRepoRefs()))
		}
		if len(a.GetRootEventIds()) > 0 {
			h.t.Errorf("command names root_event_ids (deprecated): %v", a.GetRootEventIds())
		}
		if roots := a.RootIDs(); len(roots) > 0 {
			b.WriteString(" roots=" + h.names(roots))
		}
		if a.Since != nil {
			fmt.Fprintf(&b, " since=%+d", a.GetSince()-h.now.Unix())
		}
		if live := a.Live(); len(live) > 0 {
			b.WriteString(" live=" + h.renderFilters(live))
		}
		b.WriteString(" hist=" + h.renderFilters(a.GetHistoricFilters()))
		if len(a.GetRefetchFilters()) > 0 {
			b.WriteString(" refetch=" + h.renderFilters(a.GetRefetchFilters()))
		}
	}
	return b.String()
}

func (h *harness) names(vs []string) string {
	out := make([]string, len(vs))
	for i, v := range vs {
		out[i] = h.name(v)
	}
	return strings.Join(out, ",")
}

func (h *harness) renderFilters(fs []*graspv1.Filter) string {
	parts := make([]string, len(fs))
	for i, f := range fs {
		var p []string
		if len(f.GetKinds()) > 0 {
			ks := make([]string, len(f.GetKinds()))
			for j, k := range f.GetKinds() {
				ks[j] = fmt.Sprint(k)
			}
			p = append(p, "k"+strings.Join(ks, ","))
		}
		if len(f.GetAuthors()) > 0 {
			p = append(p, "@"+h.names(f.GetAuthors()))
		}
		for _, t := range f.GetTags() {
			if len(t.GetValues()) > 100 {
				h.t.Errorf("filter with %d tag values", len(t.GetValues()))
			}
			p = append(p, "#"+t.GetName()+"="+h.names(t.GetValues()))
		}
		if f.Since != nil {
			p = append(p, fmt.Sprintf("S%+d", f.GetSince()-h.now.Unix()))
		}
		if f.Limit != nil {
			p = append(p, fmt.Sprintf("L%d", f.GetLimit()))
		}
		parts[i] = strings.Join(p, "")
	}
	return "[" + strings.Join(parts, " ") + "]"
}

// expect compares emitted commands with the wanted lines.
func expect(t *testing.T, step string, got []string, want ...string) {
	t.Helper()
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("%s: commands\n  %s\nwant\n  %s", step, strings.Join(got, "\n  "), strings.Join(want, "\n  "))
	}
}

// confirmed renders a relay's confirmed state, e.g. "r1:x,y r2:-".
func (h *harness) confirmed(url string) string {
	s := h.relay(url)
	if s == nil {
		return "untracked"
	}
	var parts []string
	for repo, p := range s.Pairs {
		if !p.RepoConfirmed && len(p.Confirmed) == 0 {
			continue
		}
		var roots []string
		for _, r := range p.Confirmed {
			roots = append(roots, h.name(h.m.Index().Roots.Hex(r)))
		}
		sort.Strings(roots)
		repoName := h.name(h.m.Index().Repo(repo).Ref)
		if !p.RepoConfirmed {
			repoName += "?"
		}
		parts = append(parts, repoName+":"+strings.Join(roots, ","))
	}
	sort.Strings(parts)
	return strings.Join(parts, " ")
}

func sinceStr(d int64) string { return fmt.Sprintf("%+d", d) }

func contains(s, sub string) bool { return strings.Contains(s, sub) }
