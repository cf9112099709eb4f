package e2e

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nbd-wtf/go-nostr"
	"google.golang.org/protobuf/proto"

	graspv1 "github.com/grasp-sync/grasp-sync/proto/grasp/v1"

	"github.com/grasp-sync/grasp-sync/pkg/bus"
	"github.com/grasp-sync/grasp-sync/pkg/clock"
	"github.com/grasp-sync/grasp-sync/pkg/obs"
	"github.com/grasp-sync/grasp-sync/pkg/testkit"
	"github.com/grasp-sync/grasp-sync/pkg/testkit/testrelay"
	"github.com/grasp-sync/grasp-sync/services/graspd"
	"github.com/grasp-sync/grasp-sync/services/planner"
)

// slowRemote starts a remote relay whose queries take 0–1.5 s, chosen by a
// hash of the filter, so the batches of an initial sync finish spread over
// time and a planner can be killed while some are confirmed and others not.
func slowRemote(t *testing.T) *testrelay.Relay {
	r := testrelay.Start(t, testrelay.Options{})
	r.Khatru.RejectFilter = append(r.Khatru.RejectFilter, func(ctx context.Context, f nostr.Filter) (bool, string) {
		if len(f.Tags["e"]) == 0 {
			return false, ""
		}
		sum := sha256.Sum256([]byte(f.String()))
		d := time.Duration(binary.BigEndian.Uint16(sum[:2])%1500) * time.Millisecond
		select {
		case <-time.After(d): // latency of a distant relay, not a wait for a result
		case <-ctx.Done():
		}
		return false, ""
	})
	return r
}

// TestKillPlannerDuringInitialSync runs graspd's relay, discovery, fetcher
// and ingester (wired as in graspd) and two planners on their own NATS
// connections: one active, one standby. The active planner is killed (its
// connection cut, so it cannot release its lease) while the initial sync's
// layer-3 batches are partly confirmed. The standby must take over within
// 30 s; at the end every remote event is stored (none lost), and the new
// planner fetches nothing in full that the old one had confirmed.
func TestKillPlannerDuringInitialSync(t *testing.T) {
	if testing.Short() {
		t.Skip("SKIP: integration test (takes ~20 s)")
	}
	remote1, remote2 := slowRemote(t), slowRemote(t)

	t.Setenv("GRASP_DATA_DIR", t.TempDir())
	t.Setenv("GRASP_NATS_LISTEN", "127.0.0.1:0")
	t.Setenv("GRASP_RELAY_ADDR", "127.0.0.1:0")
	t.Setenv("GRASP_METRICS_ADDR", "127.0.0.1:0")
	t.Setenv("GRASP_RELAY_ALLOWLIST", "127.0.0.1")
	t.Setenv("GRASP_DISCOVERY_BATCH_WINDOW", "300ms")
	t.Setenv("GRASP_SHARDS", "4")
	t.Setenv("GRASP_SERVICES", "relay,discovery,fetcher,ingester")
	cfgs, err := graspd.LoadConfigs()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	app, err := graspd.Start(ctx, cfgs, obs.NewLogger(io.Discard, "error"))
	if err != nil {
		t.Fatal(err)
	}
	appDone := make(chan error, 1)
	appCtx, stopApp := context.WithCancel(ctx)
	go func() { appDone <- app.Run(appCtx) }()
	defer func() {
		stopApp()
		<-appDone
		app.Close()
	}()

	names := bus.Names{Prefix: "grasp"}
	connect := func(name string) *bus.Bus {
		b, err := bus.Connect(ctx, app.NATSURL(), name, names, bus.Security{})
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	// Every command, as the fetchers receive them.
	tap := connect("tap")
	defer tap.Close()
	var mu sync.Mutex
	var cmds []*graspv1.FetchCommand
	sub, err := tap.Conn.Subscribe(names.FetchCmdSubjects(), func(m *nats.Msg) {
		var c graspv1.FetchCommand
		if err := proto.Unmarshal(m.Data, &c); err == nil {
			mu.Lock()
			cmds = append(cmds, &c)
			mu.Unlock()
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sub.Unsubscribe() }()

	pcfg := planner.Config{Shards: 4, RecomputeDelay: 100 * time.Millisecond, Rules: planner.DefaultRules()}
	pcfg.MaxBatchItems = 4 // many small batches, confirmed at different times
	pcfg.QuietPeriod = time.Second
	startPlanner := func(id string) (*bus.Bus, context.CancelFunc, chan error) {
		b := connect(id)
		c := pcfg
		c.ID = id
		pctx, pcancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- planner.New(c, b, clock.Real{}, obs.NewLogger(io.Discard, "error"), nil).Run(pctx) }()
		return b, pcancel, done
	}
	b1, stop1, done1 := startPlanner("planner-1")
	defer func() { stop1(); <-done1 }()
	waitFor(t, ctx, "planner-1 leads", func() bool { return leaseHolder(ctx, tap) == "planner-1" })
	b2, stop2, done2 := startPlanner("planner-2")
	defer func() { stop2(); <-done2; b2.Close() }()

	owner, contributor := testkit.NewKey(), testkit.NewKey()
	repo := testkit.RepoRef(owner.PubKey, "failover")
	var want []*nostr.Event
	for i := range 24 {
		issue := contributor.Issue(repo, "issue "+strings.Repeat("!", i))
		comment := owner.Comment(issue, issue, "reply")
		want = append(want, issue, comment)
		if i%2 == 0 {
			remote1.Add(t, issue, comment)
		} else {
			remote2.Add(t, issue, comment)
		}
	}
	ann := owner.Announcement("failover",
		[]string{testkit.GraspCloneURL(app.PublicURL(), owner.PubKey, "failover")},
		[]string{app.PublicURL(), remote1.URL, remote2.URL}, nil)
	if err := testrelay.Publish(ctx, app.RelayURL(), ann); err != nil {
		t.Fatal(err)
	}

	// Kill planner-1 once some roots are confirmed on a relay that still
	// has batches in flight.
	stateKV, err := tap.JS.KeyValue(ctx, names.RelayStateBucket())
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, ctx, "a partly confirmed initial sync", func() bool {
		for _, st := range relayStates(ctx, t, stateKV) {
			if st.GetConfirmedRoots() > 0 && st.GetPendingBatches() > 0 {
				return true
			}
		}
		return false
	})
	b1.Close() // crash: no release, the lease must expire
	killedAt := time.Now()
	confirmed := map[string]map[uint64]bool{} // relay → confirmed root prefixes
	confirmedRepos := map[string]bool{}
	index := repoRoots(ctx, t, tap)
	var partial int
	for _, st := range relayStates(ctx, t, stateKV) {
		set := map[uint64]bool{}
		for _, c := range st.GetConfirmed() {
			if c.GetRepoConfirmed() {
				confirmedRepos[st.GetRelayUrl()+" "+c.GetRepoRef()] = true
			}
			if c.GetAllRoots() {
				for _, p := range index[c.GetRepoRef()] {
					set[p] = true
				}
			}
			pre := c.GetRootPrefixes()
			for i := 0; i+8 <= len(pre); i += 8 {
				set[binary.BigEndian.Uint64(pre[i:])] = true
			}
		}
		if st.GetPendingBatches() > 0 {
			partial++
		}
		confirmed[st.GetRelayUrl()] = set
	}
	mu.Lock()
	epoch1 := cmds[len(cmds)-1].GetEpoch()
	mu.Unlock()
	t.Logf("planner-1 (epoch %d) killed with %d relays mid-sync; confirmed roots: %d on %s, %d on %s",
		epoch1, partial, len(confirmed[remote1.URL]), remote1.URL, len(confirmed[remote2.URL]), remote2.URL)

	waitFor(t, ctx, "planner-2 takes over", func() bool { return leaseHolder(ctx, tap) == "planner-2" })
	if took := time.Since(killedAt); took > 30*time.Second {
		t.Fatalf("standby took over after %s", took)
	} else {
		t.Logf("standby took over %s after the kill", took.Round(100*time.Millisecond))
	}

	waitFor(t, ctx, "every remote event stored", func() bool {
		for _, e := range want {
			if ok, err := app.Store().Has(ctx, e.ID); err != nil || !ok {
				return false
			}
		}
		return true
	})

	waitFor(t, ctx, "planner-2 settles both relays", func() bool {
		settled := 0
		for _, st := range relayStates(ctx, t, stateKV) {
			if st.GetEpoch() > epoch1 && st.GetStatus() == graspv1.RelayStatus_RELAY_STATUS_CONNECTED && st.GetPendingBatches() == 0 {
				settled++
			}
		}
		return settled == 2
	})

	// Nothing planner-1 confirmed was fetched in full again: planner-2's
	// batches without since cover only other items.
	mu.Lock()
	defer mu.Unlock()
	var resumed, full int
	for _, c := range cmds {
		add := c.GetAddFilters()
		if c.GetEpoch() <= epoch1 || add == nil || add.GetBatchId() == "" || add.GetLayer1() {
			continue
		}
		if add.Since != nil {
			resumed++
			continue
		}
		full++
		for _, ref := range add.GetRepoRefs() {
			if confirmedRepos[c.GetRelayUrl()+" "+ref] {
				t.Errorf("planner-2 re-fetched confirmed repository %s from %s", ref, c.GetRelayUrl())
			}
		}
		for _, id := range add.RootIDs() {
			if confirmed[c.GetRelayUrl()][prefix(id)] {
				t.Errorf("planner-2 re-fetched confirmed root %s from %s (batch %s)", id, c.GetRelayUrl(), add.GetBatchId())
			}
		}
	}
	if resumed == 0 {
		t.Error("planner-2 ran no catch-up: it did not resume from the persisted state")
	}
	t.Logf("planner-2: %d catch-up batches (with since), %d full batches for items not confirmed before", resumed, full)
}

func prefix(hexID string) uint64 {
	b, err := hex.DecodeString(hexID)
	if err != nil || len(b) < 8 {
		return 0
	}
	return binary.BigEndian.Uint64(b[:8])
}

func waitFor(t *testing.T, ctx context.Context, what string, cond func() bool) {
	t.Helper()
	for !cond() {
		select {
		case <-ctx.Done():
			t.Fatalf("timed out waiting for %s", what)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func leaseHolder(ctx context.Context, b *bus.Bus) string {
	kv, err := b.JS.KeyValue(ctx, b.Names.LeaseBucket())
	if err != nil {
		return ""
	}
	e, err := kv.Get(ctx, "planner")
	if err != nil {
		return ""
	}
	var l struct {
		Holder string `json:"holder"`
	}
	if err := json.Unmarshal(e.Value(), &l); err != nil {
		return ""
	}
	return l.Holder
}

func relayStates(ctx context.Context, t *testing.T, kv jetstream.KeyValue) []*graspv1.RelayState {
	lister, err := kv.ListKeys(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var out []*graspv1.RelayState
	for key := range lister.Keys() {
		if !strings.HasPrefix(key, bus.RelayStateKeyPrefix) {
			continue
		}
		e, err := kv.Get(ctx, key)
		if errors.Is(err, jetstream.ErrKeyNotFound) || errors.Is(err, jetstream.ErrKeyDeleted) {
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		var st graspv1.RelayState
		if err := proto.Unmarshal(e.Value(), &st); err != nil {
			t.Fatal(err)
		}
		out = append(out, &st)
	}
	return out
}

// repoRoots reads the index: repo ref → root id prefixes.
func repoRoots(ctx context.Context, t *testing.T, b *bus.Bus) map[string][]uint64 {
	kv, err := b.JS.KeyValue(ctx, b.Names.RepoIndexBucket())
	if err != nil {
		t.Fatal(err)
	}
	lister, err := kv.ListKeys(ctx)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string][]uint64{}
	for key := range lister.Keys() {
		if key == bus.BootstrapRelaysKey {
			continue
		}
		e, err := kv.Get(ctx, key)
		if err != nil {
			continue
		}
		var n graspv1.RepoSyncNeeds
		if proto.Unmarshal(e.Value(), &n) != nil {
			continue
		}
		for _, id := range n.GetRootEventIds() {
			out[n.GetRepoRef()] = append(out[n.GetRepoRef()], prefix(id))
		}
	}
	return out
}
