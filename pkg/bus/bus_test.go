package bus_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	graspv1 "github.com/grasp-sync/grasp-sync/proto/grasp/v1"

	"github.com/grasp-sync/grasp-sync/pkg/bus"
	"github.com/grasp-sync/grasp-sync/pkg/testkit/natstest"
)

// connect returns a bus on the embedded server, or on the external server
// named by GRASP_TEST_NATS_URL (with a unique prefix so runs do not meet).
func connect(t *testing.T, external bool) *bus.Bus {
	t.Helper()
	ctx := context.Background()
	names := bus.Names{Prefix: fmt.Sprintf("t%d", time.Now().UnixNano())}
	var b *bus.Bus
	var err error
	if external {
		url := os.Getenv("GRASP_TEST_NATS_URL")
		if url == "" {
			t.Skip("SKIP: GRASP_TEST_NATS_URL is not set; .ci/run sets it to the machine's NATS")
		}
		b, err = bus.Connect(ctx, url, "bus-test", names, bus.Security{})
	} else {
		b, err = bus.ConnectInProcess(natstest.Start(t).Server, "bus-test", names)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if external { // leave nothing behind on a shared server
			for _, s := range []string{names.FetchCmdStream(), names.FetchReportStream(), names.EventsStream()} {
				_ = b.JS.DeleteStream(context.Background(), s)
			}
			_ = b.JS.DeleteKeyValue(context.Background(), names.RepoIndexBucket())
			_ = b.JS.DeleteKeyValue(context.Background(), names.RelayStateBucket())
		}
		b.Close()
	})
	return b
}

func TestBus(t *testing.T) {
	for _, external := range []bool{false, true} {
		name := "embedded"
		if external {
			name = "external"
		}
		t.Run(name, func(t *testing.T) {
			b := connect(t, external)
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			opts := bus.DefaultOptions()
			opts.Storage = jetstream.MemoryStorage
			for range 2 { // idempotent
				if err := bus.Setup(ctx, b.JS, b.Names, opts); err != nil {
					t.Fatal(err)
				}
			}
			t.Run("typed round trip", func(t *testing.T) { typedRoundTrip(ctx, t, b) })
			t.Run("event dedup by id", func(t *testing.T) { dedup(ctx, t, b) })
		})
	}
}

func typedRoundTrip(ctx context.Context, t *testing.T, b *bus.Bus) {
	sent := &graspv1.FetchCommand{RelayUrl: "wss://r.example", SessionId: "s", Epoch: 3,
		Command: &graspv1.FetchCommand_EnsureConnected{EnsureConnected: &graspv1.EnsureConnected{}}}
	if err := b.Publish(ctx, b.Names.FetchCmdSubject(5), sent); err != nil {
		t.Fatal(err)
	}
	// A message of the wrong type on the same subject is terminated, not
	// retried forever.
	if err := b.Publish(ctx, b.Names.FetchCmdSubject(5), &graspv1.FetchReport{RelayUrl: "x"}); err != nil {
		t.Fatal(err)
	}
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var got, bad atomic.Int32
	errc := make(chan error, 1)
	go func() {
		errc <- b.Consume(cctx, bus.ConsumeConfig{
			Stream:   b.Names.FetchCmdStream(),
			Consumer: jetstream.ConsumerConfig{Durable: "shard-5", FilterSubject: b.Names.FetchCmdSubject(5)},
		}, func(ctx context.Context, msg jetstream.Msg) error {
			if msg.Headers().Get(bus.HeaderType) == "" {
				t.Error("no Grasp-Type header")
			}
			var cmd graspv1.FetchCommand
			if err := bus.Decode(msg.Data(), msg.Headers(), &cmd); err != nil {
				bad.Add(1)
				return fmt.Errorf("%w: %v", bus.ErrPermanent, err)
			}
			if cmd.GetRelayUrl() != "wss://r.example" || cmd.GetEpoch() != 3 || cmd.GetEnsureConnected() == nil {
				t.Errorf("decoded %v", &cmd)
			}
			got.Add(1)
			return nil
		})
	}()
	deadline := time.Now().Add(10 * time.Second)
	for (got.Load() < 1 || bad.Load() < 1) && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	cancel()
	if err := <-errc; err != nil && !errors.Is(err, context.Canceled) {
		t.Fatal(err)
	}
	if got.Load() != 1 || bad.Load() != 1 {
		t.Fatalf("handled %d commands and %d wrong-type messages, want 1 and 1", got.Load(), bad.Load())
	}
}

func dedup(ctx context.Context, t *testing.T, b *bus.Bus) {
	for range 3 {
		msg := nats.NewMsg(b.Names.EventsSubject(1))
		msg.Data = []byte(`{"id":"abc"}`)
		msg.Header.Set(nats.MsgIdHdr, "abc")
		if _, err := b.JS.PublishMsg(ctx, msg); err != nil {
			t.Fatal(err)
		}
	}
	s, err := b.JS.Stream(ctx, b.Names.EventsStream())
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.State.Msgs != 1 {
		t.Fatalf("events stream holds %d copies of one event id, want 1", info.State.Msgs)
	}

	// EventMsgID: copies with the same signature dedup, a forged copy with
	// another signature does not shadow the genuine one.
	for _, sig := range []string{"forged", "genuine", "genuine"} {
		msg := nats.NewMsg(b.Names.EventsSubject(2))
		msg.Data = []byte(`{"id":"def"}`)
		msg.Header.Set(nats.MsgIdHdr, bus.EventMsgID("def", sig))
		if _, err := b.JS.PublishMsg(ctx, msg); err != nil {
			t.Fatal(err)
		}
	}
	if info, err = s.Info(ctx); err != nil {
		t.Fatal(err)
	}
	if info.State.Msgs != 3 {
		t.Fatalf("events stream holds %d messages, want 3 (abc, forged def, genuine def once)", info.State.Msgs)
	}
}

func TestShardOf(t *testing.T) {
	counts := make([]int, 16)
	for i := range 1600 {
		s := bus.ShardOf(fmt.Sprintf("wss://relay%d.example", i), 16)
		if s != bus.ShardOf(fmt.Sprintf("wss://relay%d.example", i), 16) {
			t.Fatal("ShardOf is not stable")
		}
		counts[s]++
	}
	for shard, n := range counts {
		if n < 50 || n > 150 { // 100 expected per shard
			t.Errorf("shard %d got %d of 1600 relays", shard, n)
		}
	}
	if bus.ShardOf("wss://x", 1) != 0 || bus.ShardOf("wss://x", 0) != 0 {
		t.Error("a single shard must be shard 0")
	}
}

func TestNamesUsePrefix(t *testing.T) {
	n := bus.Names{Prefix: "acme"}
	for got, want := range map[string]string{
		n.FetchCmdSubject(3):    "acme.fetch.cmd.3",
		n.FetchReportSubject(0): "acme.fetch.report.0",
		n.EventsSubject(15):     "acme.events.15",
		n.StoredSubject(1621):   "acme.stored.1621",
		n.EventsStream():        "ACME_EVENTS",
		n.RepoIndexBucket():     "acme_repo_index",
		n.RelayStateBucket():    "acme_relay_state",
	} {
		if got != want {
			t.Errorf("%s, want %s", got, want)
		}
	}
}

// An event's Nats-Msg-Id names its id and its signature, in fewer bytes
// than the signature: the events stream keeps every id of its duplicate
// window in memory.
func TestEventMsgIDIsCompact(t *testing.T) {
	id := strings.Repeat("ab", 32)
	sig, other := strings.Repeat("cd", 64), strings.Repeat("cd", 63)+"ce"
	got := bus.EventMsgID(id, sig)
	if !strings.HasPrefix(got, id+":") {
		t.Errorf("EventMsgID = %q, want the event id first", got)
	}
	if len(got) > len(id)+1+22 {
		t.Errorf("EventMsgID is %d bytes, want at most %d (id, ':', a 128-bit digest)", len(got), len(id)+1+22)
	}
	if got == bus.EventMsgID(id, other) {
		t.Error("two signatures give one EventMsgID")
	}
	if got != bus.EventMsgID(id, sig) {
		t.Error("EventMsgID is not stable")
	}
}
