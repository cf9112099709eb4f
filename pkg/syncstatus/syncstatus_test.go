package syncstatus_test

import (
	"context"
	"encoding/binary"
	"errors"
	"testing"

	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"

	graspv1 "github.com/grasp-sync/grasp-sync/proto/grasp/v1"

	"github.com/grasp-sync/grasp-sync/pkg/bus"
	"github.com/grasp-sync/grasp-sync/pkg/syncstatus"
	"github.com/grasp-sync/grasp-sync/pkg/testkit/natstest"
)

const (
	r1   = "wss://one.example"
	r2   = "wss://two.example"
	repo = "30617:aa:demo"
)

func TestFromRelayState(t *testing.T) {
	for _, tc := range []struct {
		status graspv1.RelayStatus
		name   string
		code   int
	}{
		{graspv1.RelayStatus_RELAY_STATUS_UNSPECIFIED, "Unknown", 0},
		{graspv1.RelayStatus_RELAY_STATUS_DISCONNECTED, "Disconnected", 0},
		{graspv1.RelayStatus_RELAY_STATUS_CONNECTING, "Connecting", 1},
		{graspv1.RelayStatus_RELAY_STATUS_SYNCING, "Syncing", 2},
		{graspv1.RelayStatus_RELAY_STATUS_CONNECTED, "Connected", 3},
		{graspv1.RelayStatus_RELAY_STATUS_CONNECTED_HISTORIC_SYNC_FAILURES, "ConnectedWithFailures", 4},
		{graspv1.RelayStatus_RELAY_STATUS_DISCONNECTING, "Disconnecting", 5},
	} {
		r := syncstatus.FromRelayState(&graspv1.RelayState{RelayUrl: r1, Status: tc.status,
			ConfirmedRepoRefs: []string{repo}, PendingRoots: 4, ConfirmedRoots: 2, PendingBatches: 1, LastConnected: 1700000000})
		if r.Status != tc.name || r.StatusCode != tc.code {
			t.Errorf("%v: status %q code %d, want %q %d", tc.status, r.Status, r.StatusCode, tc.name, tc.code)
		}
		if r.ConfirmedRepos != 1 || r.PendingRoots != 4 || r.ConfirmedRoots != 2 || r.PendingBatches != 1 || r.LastConnected.Unix() != 1700000000 {
			t.Errorf("%v: counts %+v", tc.status, r)
		}
	}
	// Since 2026-12-06 a record names its confirmed repositories once, in
	// confirmed; the count is the same.
	r := syncstatus.FromRelayState(&graspv1.RelayState{RelayUrl: r1, Status: graspv1.RelayStatus_RELAY_STATUS_CONNECTED,
		Confirmed: []*graspv1.ConfirmedRepo{{RepoRef: repo, RepoConfirmed: true, AllRoots: true, RootCount: 2}, {RepoRef: "30617:bb:other", RootPrefixes: make([]byte, 8)}}})
	if r.ConfirmedRepos != 1 {
		t.Errorf("a record naming its repositories in confirmed only: %d confirmed repositories, want 1", r.ConfirmedRepos)
	}
}

// snapshotOf builds a snapshot the way Read does, through KV.
func snapshotOf(t *testing.T, states []*graspv1.RelayState, needs []*graspv1.RepoSyncNeeds) *syncstatus.Snapshot {
	t.Helper()
	ctx := context.Background()
	js := startJetStream(t)
	names := bus.DefaultNames()
	if _, err := syncstatus.Read(ctx, js, names); !errors.Is(err, syncstatus.ErrBucketMissing) {
		t.Fatalf("Read before setup: %v, want ErrBucketMissing", err)
	}
	if err := bus.Setup(ctx, js, names, bus.DefaultOptions()); err != nil {
		t.Fatal(err)
	}
	put := func(bucket, key string, m proto.Message) {
		kv, err := js.KeyValue(ctx, bucket)
		if err != nil {
			t.Fatal(err)
		}
		data, _ := proto.Marshal(m)
		if _, err := kv.Put(ctx, key, data); err != nil {
			t.Fatal(err)
		}
	}
	for i, st := range states {
		put(names.RelayStateBucket(), "relay."+string(rune('a'+i)), st)
	}
	for i, nd := range needs {
		put(names.RepoIndexBucket(), "repo."+string(rune('a'+i)), nd)
	}
	put(names.RepoIndexBucket(), bus.BootstrapRelaysKey, &graspv1.BootstrapRelays{Relays: []string{r2}})
	// A health report for r2 older than a newer one: the newest wins.
	for _, h := range []*graspv1.Health{
		{State: graspv1.HealthState_HEALTH_STATE_BACKING_OFF, ConsecutiveFailures: 1, LastError: "old"},
		{State: graspv1.HealthState_HEALTH_STATE_DEAD, ConsecutiveFailures: 7, LastError: "dial tcp: connection refused"},
	} {
		msg, err := bus.NewMsg(names.FetchReportSubject(0), &graspv1.FetchReport{RelayUrl: r2, Report: &graspv1.FetchReport_Health{Health: h}})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := js.PublishMsg(ctx, msg); err != nil {
			t.Fatal(err)
		}
	}
	snap, err := syncstatus.Read(ctx, js, names)
	if err != nil {
		t.Fatal(err)
	}
	return snap
}

func TestReadAndExplain(t *testing.T) {
	prefix := make([]byte, 8)
	binary.BigEndian.PutUint64(prefix, 42)
	snap := snapshotOf(t, []*graspv1.RelayState{
		{RelayUrl: r1, Status: graspv1.RelayStatus_RELAY_STATUS_CONNECTED, ConfirmedRepoRefs: []string{repo}, ConfirmedRoots: 3,
			Confirmed: []*graspv1.ConfirmedRepo{{RepoRef: repo, RepoConfirmed: true, AllRoots: true, RootCount: 3}}},
		{RelayUrl: r2, Status: graspv1.RelayStatus_RELAY_STATUS_SYNCING, PendingBatches: 2, PendingRoots: 2, ConfirmedRoots: 1,
			Confirmed:         []*graspv1.ConfirmedRepo{{RepoRef: repo, RootPrefixes: prefix}},
			HistoricFailures:  2,
			IncompleteBatches: 1, LastIncomplete: "history incomplete: 1 one-second slice(s)"},
	}, []*graspv1.RepoSyncNeeds{
		{RepoRef: repo, Relays: []string{r1, r2, "wss://three.example"}, RootEventIds: []string{"a", "b", "c"}},
		{RepoRef: "30617:bb:other", Relays: []string{r1}},
	})
	if len(snap.Relays) != 2 || len(snap.Repos) != 2 {
		t.Fatalf("snapshot %d relays %d repos, want 2 and 2", len(snap.Relays), len(snap.Repos))
	}
	one, _ := snap.Relay(r1)
	two, _ := snap.Relay(r2)
	if one.ListedRepos != 2 || two.ListedRepos != 1 {
		t.Errorf("listed repos: %s %d, %s %d; want 2 and 1", r1, one.ListedRepos, r2, two.ListedRepos)
	}
	if two.Health != "dead" || two.ConsecutiveFailures != 7 || two.LastError != "dial tcp: connection refused" || one.Health != "" {
		t.Errorf("health: %s %q/%d/%q, %s %q", r2, two.Health, two.ConsecutiveFailures, two.LastError, r1, one.Health)
	}
	if two.IncompleteBatches != 1 || two.LastIncomplete == "" || one.IncompleteBatches != 0 {
		t.Errorf("incomplete batches: %s %d %q, %s %d", r2, two.IncompleteBatches, two.LastIncomplete, r1, one.IncompleteBatches)
	}
	if got := snap.Progress(); got != (syncstatus.Progress{Relays: 2, Connected: 1, Syncing: 1, PendingBatches: 2, PendingRoots: 2, ConfirmedRoots: 4}) {
		t.Errorf("progress %+v", got)
	}
	if len(snap.Leases) != 2 || snap.Leases[0].Held {
		t.Errorf("leases %+v, want two unheld roles", snap.Leases)
	}

	ex, err := snap.Explain(repo)
	if err != nil {
		t.Fatal(err)
	}
	want := []syncstatus.RepoRelay{
		{URL: r1, Status: "Connected", RepoConfirmed: true, ConfirmedRoots: 3, PendingRoots: 0},
		{URL: r2, Status: "Syncing", RepoConfirmed: false, ConfirmedRoots: 1, PendingRoots: 2,
			Incomplete: "1 batches incomplete; last: history incomplete: 1 one-second slice(s)"},
		{URL: "wss://three.example", Status: "Untracked", PendingRoots: 3},
	}
	if len(ex.Relays) != len(want) {
		t.Fatalf("explain relays %+v", ex.Relays)
	}
	for i, w := range want {
		g := ex.Relays[i]
		g.Why = ""
		if g != w {
			t.Errorf("explain relay %d = %+v, want %+v", i, g, w)
		}
	}
	if _, err := snap.Explain("30617:cc:none"); !errors.Is(err, syncstatus.ErrUnknownRepo) {
		t.Errorf("explain unknown: %v", err)
	}
	if got := snap.ReposOfRelay(r2); len(got) != 1 || got[0].Ref != repo {
		t.Errorf("ReposOfRelay(%s) = %+v", r2, got)
	}
}

// startJetStream starts an embedded NATS server for the test and returns
// a JetStream context on it.
func startJetStream(t *testing.T) jetstream.JetStream {
	t.Helper()
	js, err := jetstream.New(natstest.Start(t).Connect(t))
	if err != nil {
		t.Fatal(err)
	}
	return js
}
