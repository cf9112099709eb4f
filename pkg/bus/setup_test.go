package bus_test

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"golang.org/x/sync/errgroup"

	graspv1 "github.com/grasp-sync/grasp-sync/proto/grasp/v1"

	"github.com/grasp-sync/grasp-sync/pkg/bus"
	"github.com/grasp-sync/grasp-sync/pkg/clock"
	"github.com/grasp-sync/grasp-sync/pkg/testkit/natstest"
)

// Services start together and all run Setup: concurrent setups, each on
// its own connection (in the cluster, to different nodes), all succeed and
// leave every stream with the wanted replication. In a 3-node cluster this
// used to fail: the callers timed out on streams another had just created.
func TestSetupConcurrent(t *testing.T) {
	cases := []struct {
		name     string
		urls     func(t *testing.T) []string
		replicas int
	}{
		{"single node", func(t *testing.T) []string { return []string{natstest.Start(t).URL} }, 1},
		{"3-node cluster", func(t *testing.T) []string { return strings.Split(natstest.StartCluster(t, 3).URL, ",") }, 3},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			urls := tc.urls(t)
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			names := bus.Names{Prefix: "SETUP"}
			opts := bus.DefaultOptions()
			opts.Replicas = tc.replicas
			const callers = 6
			buses := make([]*bus.Bus, callers)
			for i := range buses {
				b, err := bus.Connect(ctx, urls[i%len(urls)], fmt.Sprintf("setup-%d", i), names, bus.Security{})
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(b.Close)
				buses[i] = b
			}
			start := make(chan struct{})
			var g errgroup.Group
			for i, b := range buses {
				g.Go(func() error {
					<-start
					if err := bus.Setup(ctx, b.JS, names, opts); err != nil {
						return fmt.Errorf("caller %d: %w", i, err)
					}
					return nil
				})
			}
			close(start)
			if err := g.Wait(); err != nil {
				t.Fatal(err)
			}
			for _, s := range []string{names.FetchCmdStream(), names.FetchReportStream(), names.EventsStream(),
				"KV_" + names.RepoIndexBucket(), "KV_" + names.LeaseBucket()} {
				st, err := buses[0].JS.Stream(ctx, s)
				if err != nil {
					t.Fatalf("stream %s: %v", s, err)
				}
				if r := st.CachedInfo().Config.Replicas; r != tc.replicas {
					t.Fatalf("stream %s has %d replicas, want %d", s, r, tc.replicas)
				}
			}
		})
	}
}

// A consumer deleted under ConsumeRestarting (as when its stream is lost
// with a NATS node, or recreated) is attached again and handles the
// messages published afterwards.
func TestConsumeRestartingAfterConsumerDeleted(t *testing.T) {
	b := connect(t, false)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	opts := bus.DefaultOptions()
	opts.Storage = jetstream.MemoryStorage
	if err := bus.Setup(ctx, b.JS, b.Names, opts); err != nil {
		t.Fatal(err)
	}
	var handled atomic.Int32
	cctx, stop := context.WithCancel(ctx)
	errc := make(chan error, 1)
	logged := &levels{}
	go func() {
		errc <- b.ConsumeRestarting(cctx, clock.Real{}, bus.RestartBackoff{Min: 10 * time.Millisecond, Max: time.Second},
			bus.ConsumeConfig{
				Log:      slog.New(logged),
				Stream:   b.Names.FetchCmdStream(),
				Consumer: jetstream.ConsumerConfig{Durable: "shard-2", FilterSubject: b.Names.FetchCmdSubject(2)},
			}, func(context.Context, jetstream.Msg) error {
				handled.Add(1)
				return nil
			})
	}()
	send := func() {
		t.Helper()
		if err := b.Publish(ctx, b.Names.FetchCmdSubject(2), &graspv1.FetchCommand{RelayUrl: "wss://r.example"}); err != nil {
			t.Fatal(err)
		}
	}
	waitHandled := func(n int32) {
		t.Helper()
		for handled.Load() < n {
			select {
			case <-ctx.Done():
				t.Fatalf("%d messages handled, want %d", handled.Load(), n)
			case <-time.After(10 * time.Millisecond):
			}
		}
	}
	send()
	waitHandled(1)
	for round := int32(2); round <= 3; round++ {
		if err := b.JS.DeleteConsumer(ctx, b.Names.FetchCmdStream(), "shard-2"); err != nil {
			t.Fatal(err)
		}
		// The restarted consumer is new: it starts at the stream's first
		// message, which is this one (the work queue removed the handled ones).
		send()
		waitHandled(round)
	}
	stop()
	if err := <-errc; err != context.Canceled {
		t.Fatalf("ConsumeRestarting returned %v, want context.Canceled", err)
	}
	// A restart that succeeds is a warning, not an error an operator is
	// paged for.
	if got := logged.get(); len(got) == 0 || slices.Contains(got, slog.LevelError) {
		t.Fatalf("restarts logged at %v, want warnings only", got)
	}
}

// levels is a slog.Handler that keeps the level of every record.
type levels struct {
	mu   sync.Mutex
	seen []slog.Level
}

func (l *levels) Enabled(context.Context, slog.Level) bool { return true }
func (l *levels) Handle(_ context.Context, r slog.Record) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.seen = append(l.seen, r.Level)
	return nil
}
func (l *levels) WithAttrs([]slog.Attr) slog.Handler { return l }
func (l *levels) WithGroup(string) slog.Handler      { return l }
func (l *levels) get() []slog.Level {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.seen)
}
