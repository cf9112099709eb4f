package planner

import (
	"encoding/hex"
	"fmt"
	"math/rand/v2"
	"reflect"
	"slices"
	"testing"
	"time"

	graspv1 "github.com/grasp-sync/grasp-sync/proto/grasp/v1"
)

func TestRootTableInterns(t *testing.T) {
	tab := NewRootTable()
	a := "00000000000000001111111111111111111111111111111111111111111111aa"
	b := "00000000000000002222222222222222222222222222222222222222222222bb" // same 8-byte prefix
	ia, ok1 := tab.Intern(a)
	ib, ok2 := tab.Intern(b)
	ia2, _ := tab.Intern(a)
	ib2, _ := tab.Intern(b)
	if !ok1 || !ok2 || ia == ib || ia != ia2 || ib != ib2 || tab.Hex(ia) != a || tab.Hex(ib) != b {
		t.Fatalf("prefix collision merged or lost roots: %d %d %d %d", ia, ib, ia2, ib2)
	}
	for _, bad := range []string{"", "xyz", a[:63], a + "0", "zz" + a[2:]} {
		if _, ok := tab.Intern(bad); ok {
			t.Errorf("interned invalid id %q", bad)
		}
	}
}

func TestSortedSetOps(t *testing.T) {
	a, b := []RootID{1, 3, 5, 7}, []RootID{3, 4, 7, 9}
	if got := minus(a, b); !reflect.DeepEqual(got, []RootID{1, 5}) {
		t.Errorf("minus %v", got)
	}
	if got := union(a, b); !reflect.DeepEqual(got, []RootID{1, 3, 4, 5, 7, 9}) {
		t.Errorf("union %v", got)
	}
	if got := intersect(a, b); !reflect.DeepEqual(got, []RootID{3, 7}) {
		t.Errorf("intersect %v", got)
	}
	if got := missing([]RootID{1, 2, 3, 4, 5}, []RootID{2}, []RootID{4, 5}); !reflect.DeepEqual(got, []RootID{1, 3}) {
		t.Errorf("missing %v", got)
	}
	if got := missing([]RootID{1, 2}, []RootID{2}, []RootID{1}); got != nil {
		t.Errorf("missing of a complete pair %v", got)
	}
}

// TestIncrementalTargetsMatchDerive applies random index updates and checks
// the incrementally kept inversion against DeriveRelayTargets from scratch.
func TestIncrementalTargetsMatchDerive(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	idx := NewIndex()
	relays := []string{"wss://a", "wss://b", "wss://c", "wss://d"}
	for step := range 2000 {
		key := fmt.Sprintf("k%d", rng.IntN(20))
		if rng.IntN(5) == 0 {
			idx.Delete(key)
		} else {
			needs := &graspv1.RepoSyncNeeds{RepoRef: "30617:" + key + ":" + key}
			for _, r := range relays {
				if rng.IntN(2) == 0 {
					needs.Relays = append(needs.Relays, r)
				}
			}
			for range rng.IntN(4) {
				needs.RootEventIds = append(needs.RootEventIds, fmt.Sprintf("%064x", rng.IntN(30)+1))
			}
			idx.Put(key, needs)
		}
		want := DeriveRelayTargets(idx.repos, nil)
		for _, r := range relays {
			id := idx.Relay(r)
			var got []RepoID
			for repo := range idx.TargetRepos(id) {
				got = append(got, repo)
			}
			slices.Sort(got)
			w := want[id]
			slices.Sort(w)
			if len(got) != len(w) || (len(w) > 0 && !reflect.DeepEqual(got, w)) {
				t.Fatalf("step %d relay %s: incremental %v, derived %v", step, r, got, w)
			}
		}
	}
}

func TestComputeActions(t *testing.T) {
	now := t0
	build := func() (*Index, RelayID) {
		idx := NewIndex()
		idx.Put("k1", &graspv1.RepoSyncNeeds{RepoRef: "30617:p:r1", Relays: []string{"wss://a"}, RootEventIds: []string{fmt.Sprintf("%064x", 1), fmt.Sprintf("%064x", 2)}})
		return idx, idx.Relay("wss://a")
	}
	conn := func(id RelayID) *RelayState {
		s := NewRelayState(id, "wss://a")
		s.Status, s.Session = graspv1.RelayStatus_RELAY_STATUS_SYNCING, "s1"
		return s
	}
	tests := []struct {
		name   string
		relays func(RelayID) map[RelayID]*RelayState
		want   func(RelayID) []Action
	}{
		{"unknown relay is connected first",
			func(RelayID) map[RelayID]*RelayState { return map[RelayID]*RelayState{} },
			func(a RelayID) []Action { return []Action{{Kind: ActionEnsureConnected, Relay: a}} }},
		{"disconnected relay waits for its connect",
			func(a RelayID) map[RelayID]*RelayState {
				return map[RelayID]*RelayState{a: NewRelayState(a, "wss://a")}
			},
			func(RelayID) []Action { return nil }},
		{"connected relay gets everything missing",
			func(a RelayID) map[RelayID]*RelayState { return map[RelayID]*RelayState{a: conn(a)} },
			func(a RelayID) []Action {
				return []Action{{Kind: ActionAddFilters, Relay: a, Items: []BatchItem{{Repo: 0, NeedRepo: true, Roots: []RootID{0, 1}}}}}
			}},
		{"target minus pending minus confirmed",
			func(a RelayID) map[RelayID]*RelayState {
				s := conn(a)
				s.Pairs[0] = &PairState{RepoConfirmed: true, Pending: []RootID{0}}
				return map[RelayID]*RelayState{a: s}
			},
			func(a RelayID) []Action {
				return []Action{{Kind: ActionAddFilters, Relay: a, Items: []BatchItem{{Repo: 0, Roots: []RootID{1}}}}}
			}},
		{"nothing missing",
			func(a RelayID) map[RelayID]*RelayState {
				s := conn(a)
				s.Pairs[0] = &PairState{RepoConfirmed: true, Confirmed: []RootID{1}, Pending: []RootID{0}}
				return map[RelayID]*RelayState{a: s}
			},
			func(RelayID) []Action { return nil }},
		{"held after a failure",
			func(a RelayID) map[RelayID]*RelayState {
				s := conn(a)
				s.HoldUntil = now.Add(time.Second)
				return map[RelayID]*RelayState{a: s}
			},
			func(RelayID) []Action { return nil }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			idx, a := build()
			got := ComputeActions(idx, tt.relays(a), nil, now)
			if want := tt.want(a); !reflect.DeepEqual(got, want) {
				t.Fatalf("ComputeActions = %+v, want %+v", got, want)
			}
		})
	}
	t.Run("relay no longer a target", func(t *testing.T) {
		idx, a := build()
		old := idx.Relay("wss://old")
		s := conn(old)
		relays := map[RelayID]*RelayState{a: func() *RelayState {
			s := conn(a)
			s.Pairs[0] = &PairState{RepoConfirmed: true, Confirmed: []RootID{0, 1}}
			return s
		}(), old: s}
		if got := ComputeActions(idx, relays, nil, now); !reflect.DeepEqual(got, []Action{{Kind: ActionDropRelay, Relay: old}}) {
			t.Fatalf("%+v", got)
		}
		s.Batches = []*PendingBatch{{ID: "b"}}
		if got := ComputeActions(idx, relays, nil, now); !reflect.DeepEqual(got, []Action{{Kind: ActionDisconnectLater, Relay: old}}) {
			t.Fatalf("%+v", got)
		}
		idx.SetBootstrap([]string{"wss://old"})
		if got := ComputeActions(idx, relays, nil, now); got != nil {
			t.Fatalf("bootstrap relay: %+v", got)
		}
	})
}

// ComputeActionsIn with per-relay repositories diffs only those (and only
// while they still list the relay); a relay without an entry is diffed in
// full.
func TestComputeActionsScopedToRepositories(t *testing.T) {
	idx := NewIndex()
	for i := range 3 {
		idx.Put(fmt.Sprintf("k%d", i), &graspv1.RepoSyncNeeds{RepoRef: fmt.Sprintf("30617:p:r%d", i), Relays: []string{"wss://a"},
			RootEventIds: []string{fmt.Sprintf("%064x", 10+i)}})
	}
	a := idx.Relay("wss://a")
	s := NewRelayState(a, "wss://a")
	s.Status, s.Session = graspv1.RelayStatus_RELAY_STATUS_SYNCING, "s1"
	relays := map[RelayID]*RelayState{a: s}
	r0, r1, r2 := RepoID(0), RepoID(1), RepoID(2)
	item := func(r RepoID) BatchItem { return BatchItem{Repo: r, NeedRepo: true, Roots: []RootID{RootID(r)}} }

	got := ComputeActionsIn(idx, relays, Scope{Relays: []RelayID{a}, Repos: map[RelayID][]RepoID{a: {r0, r2}}}, t0)
	if want := []Action{{Kind: ActionAddFilters, Relay: a, Items: []BatchItem{item(r0), item(r2)}}}; !reflect.DeepEqual(got, want) {
		t.Fatalf("scoped to r0, r2: %+v", got)
	}
	got = ComputeActionsIn(idx, relays, Scope{Relays: []RelayID{a}}, t0)
	if want := []Action{{Kind: ActionAddFilters, Relay: a, Items: []BatchItem{item(r0), item(r1), item(r2)}}}; !reflect.DeepEqual(got, want) {
		t.Fatalf("whole relay: %+v", got)
	}
	idx.Put("k1", &graspv1.RepoSyncNeeds{RepoRef: "30617:p:r1", Relays: []string{"wss://b"}})
	if got := ComputeActionsIn(idx, relays, Scope{Relays: []RelayID{a}, Repos: map[RelayID][]RepoID{a: {r1}}}, t0); got != nil {
		t.Fatalf("r1 no longer lists the relay: %+v", got)
	}
	if len(s.Pairs) != 0 {
		t.Fatal("ComputeActionsIn changed the relay state")
	}
}

func TestSplitBatches(t *testing.T) {
	m := NewMachine(testRules(), NewIndex(), 1, nil, nil)
	m.rules.MaxBatchItems = 3
	got := m.split([]BatchItem{{Repo: 1, NeedRepo: true, Roots: []RootID{1, 2, 3, 4}}, {Repo: 2, NeedRepo: true}})
	want := [][]BatchItem{
		{{Repo: 1, NeedRepo: true, Roots: []RootID{1, 2}}},
		{{Repo: 1, Roots: []RootID{3, 4}}, {Repo: 2, NeedRepo: true}},
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("split = %+v", got)
	}
}

// hexOrder must equal sorting the hex strings, duplicates removed, also for
// ids sharing their first 4 or 8 bytes (the integer sort's key).
func TestHexOrderMatchesStringOrder(t *testing.T) {
	m := NewMachine(testRules(), NewIndex(), 1, func() float64 { return 0.5 }, nil)
	tab := m.Index().Roots
	rng := rand.New(rand.NewPCG(7, 7))
	var roots []RootID
	for i := range 300 {
		var raw [32]byte
		for j := range raw {
			raw[j] = byte(rng.IntN(256))
		}
		switch i % 3 {
		case 1: // same first 4 bytes as the previous id
			copy(raw[:4], tab.ids[roots[len(roots)-1]][:4])
		case 2: // same first 8 bytes
			copy(raw[:8], tab.ids[roots[len(roots)-1]][:8])
		}
		id, ok := tab.Intern(hex.EncodeToString(raw[:]))
		if !ok {
			t.Fatal("intern")
		}
		roots = append(roots, id)
		if i%10 == 0 {
			roots = append(roots, id) // duplicates
		}
	}
	rng.Shuffle(len(roots), func(i, j int) { roots[i], roots[j] = roots[j], roots[i] })
	var want []string
	for _, r := range roots {
		want = append(want, tab.Hex(r))
	}
	slices.Sort(want)
	want = slices.Compact(want)
	got := m.hexes(m.hexOrder(slices.Clone(roots)))
	if !slices.Equal(got, want) {
		t.Fatalf("hex order differs:\n got %v\nwant %v", got[:5], want[:5])
	}
}
