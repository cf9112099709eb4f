package planner

import (
	"reflect"
	"testing"

	graspv1 "github.com/grasp-sync/grasp-sync/proto/grasp/v1"
)

func set(items ...string) map[string]struct{} {
	m := map[string]struct{}{}
	for _, i := range items {
		m[i] = struct{}{}
	}
	return m
}

func TestDeriveRelayTargets(t *testing.T) {
	index := map[string]*graspv1.RepoSyncNeeds{
		"k1": {RepoRef: "r1", Relays: []string{"wss://a", "wss://b"}, RootEventIds: []string{"x"}},
		"k2": {RepoRef: "r2", Relays: []string{"wss://b"}, RootEventIds: []string{"y", "z"}},
	}
	got := DeriveRelayTargets(index, []string{"wss://boot"})
	want := map[string]*RelayTarget{
		"wss://a":    {Repos: set("r1"), Roots: set("x")},
		"wss://b":    {Repos: set("r1", "r2"), Roots: set("x", "y", "z")},
		"wss://boot": {Repos: set(), Roots: set()},
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("DeriveRelayTargets = %+v", got)
	}
}

func connected(url string) *RelayState {
	s := NewRelayState(url)
	s.Status = graspv1.RelayStatus_RELAY_STATUS_SYNCING
	s.Session = "s1"
	return s
}

func TestComputeActions(t *testing.T) {
	target := map[string]*RelayTarget{"wss://a": {Repos: set("r1", "r2"), Roots: set("x", "y")}}
	tests := []struct {
		name   string
		relays map[string]*RelayState
		want   []Action
	}{
		{
			name:   "unknown relay is connected first",
			relays: map[string]*RelayState{},
			want:   []Action{{Kind: ActionEnsureConnected, Relay: "wss://a"}},
		},
		{
			name:   "disconnected relay waits for its connect",
			relays: map[string]*RelayState{"wss://a": NewRelayState("wss://a")},
		},
		{
			name:   "connected relay gets everything missing",
			relays: map[string]*RelayState{"wss://a": connected("wss://a")},
			want:   []Action{{Kind: ActionAddFilters, Relay: "wss://a", Repos: []string{"r1", "r2"}, Roots: []string{"x", "y"}}},
		},
		{
			name: "target minus pending minus confirmed",
			relays: map[string]*RelayState{"wss://a": func() *RelayState {
				s := connected("wss://a")
				s.ConfirmedRepos = set("r1")
				s.Pending["b1"] = &PendingBatch{ID: "b1", Roots: []string{"x"}}
				return s
			}()},
			want: []Action{{Kind: ActionAddFilters, Relay: "wss://a", Repos: []string{"r2"}, Roots: []string{"y"}}},
		},
		{
			name: "nothing missing, nothing to do",
			relays: map[string]*RelayState{"wss://a": func() *RelayState {
				s := connected("wss://a")
				s.ConfirmedRepos, s.ConfirmedRoots = set("r1", "r2"), set("x", "y")
				return s
			}()},
		},
		{
			name: "relay no longer a target is dropped",
			relays: map[string]*RelayState{
				"wss://a": func() *RelayState {
					s := connected("wss://a")
					s.ConfirmedRepos, s.ConfirmedRoots = set("r1", "r2"), set("x", "y")
					return s
				}(),
				"wss://old": connected("wss://old"),
			},
			want: []Action{{Kind: ActionDropRelay, Relay: "wss://old"}},
		},
		{
			name: "bootstrap relay and first-batch relay are kept",
			relays: map[string]*RelayState{
				"wss://a": func() *RelayState {
					s := connected("wss://a")
					s.ConfirmedRepos, s.ConfirmedRoots = set("r1", "r2"), set("x", "y")
					return s
				}(),
				"wss://boot": func() *RelayState { s := connected("wss://boot"); s.Bootstrap = true; return s }(),
				"wss://new": func() *RelayState {
					s := connected("wss://new")
					s.Pending["b"] = &PendingBatch{ID: "b", Layer1: true}
					return s
				}(),
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := ComputeActions(target, tt.relays)
			if !reflect.DeepEqual(got, tt.want) {
				t.Fatalf("ComputeActions =\n%+v\nwant\n%+v", got, tt.want)
			}
		})
	}
}
