package planner

import (
	"strings"
	"testing"

	graspv1 "github.com/grasp-sync/grasp-sync/proto/grasp/v1"
)

// repoMaintained is harness.repo with the entry's maintainers and the
// coordinates of their stored announcements.
func (h *harness) repoMaintained(name string, relays, maintainers, refs []string, roots ...string) {
	ref := repoRef(name)
	h.alias[ref] = name
	needs := &graspv1.RepoSyncNeeds{RepoRef: ref, Relays: relays, Maintainers: maintainers, MaintainerRefs: refs}
	for _, r := range roots {
		needs.RootEventIds = append(needs.RootEventIds, h.rootID(r))
	}
	h.repos[name] = needs
	h.m.ApplyIndex([]IndexChange{h.m.Index().Put("k-"+name, needs)})
}

// A repository that gains a maintainer has its own part fetched again on a
// relay where it was confirmed, with the maintainer's announcement and state
// asked for by author and identifier (refetch, past remembered refusals);
// when the maintainer's announcement is stored, its coordinate joins layer 2
// and the part is fetched again — and a batch in flight that asked without
// it no longer confirms the repository.
func TestMaintainerGainedRefetchesRepository(t *testing.T) {
	h := synced(t, testRules())
	m1 := strings.Repeat("cd", 32)
	h.alias[m1] = "m1"
	m1Ref := "30617:" + m1 + ":r1"
	h.alias[m1Ref] = "m1r1"

	h.repoMaintained("r1", []string{relayA}, []string{m1}, nil, "x", "y")
	expect(t, "maintainer gained", h.recompute(),
		"add wss://a.example s1 1-3 repos=r1 live=[#a=r1L0 #A=r1L0 #q=r1L0 k30618#d=r1L0] hist=[#a=r1 #A=r1 #q=r1 k30618#d=r1] refetch=[k30617,30618@m1#d=r1]")

	// The maintainer's announcement is stored before 1-3 ends.
	h.repoMaintained("r1", []string{relayA}, []string{m1}, []string{m1Ref}, "x", "y")
	expect(t, "maintainer's coordinate gained", h.recompute(),
		"add wss://a.example s1 1-4 repos=r1 live=[#a=r1,m1r1L0 #A=r1,m1r1L0 #q=r1,m1r1L0 k30618#d=r1L0] hist=[#a=r1,m1r1 #A=r1,m1r1 #q=r1,m1r1 k30618#d=r1] refetch=[k30617,30618@m1#d=r1]")
	h.done(relayA, "s1", "1-3")
	if p := h.relay(relayA).Pairs[0]; p.RepoConfirmed || !p.RepoPending {
		t.Fatalf("after the batch without the coordinate: confirmed %v pending %v, want pending only", p.RepoConfirmed, p.RepoPending)
	}
	h.done(relayA, "s1", "1-4")
	if p := h.relay(relayA).Pairs[0]; !p.RepoConfirmed || p.RepoPending {
		t.Fatalf("after the batch with the coordinate: confirmed %v pending %v", p.RepoConfirmed, p.RepoPending)
	}

	// Unchanged maintainers: nothing to do.
	h.repoMaintained("r1", []string{relayA}, []string{m1}, []string{m1Ref}, "x", "y")
	expect(t, "same entry again", h.recompute())
}
