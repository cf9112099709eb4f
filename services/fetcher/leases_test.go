package fetcher

import (
	"context"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/grasp-sync/grasp-sync/pkg/bus"
	"github.com/grasp-sync/grasp-sync/pkg/testkit"
)

// A replica stopping gracefully keeps its shard's lease while the shard's
// relay connections close — here for three lease TTLs, as a relay that
// ignores the close handshake under load can make it — so no other replica
// can take the shard and connect to a relay ours is still connected to;
// once they are closed the lease is freed at once.
func TestGracefulReleaseHoldsLeaseUntilConnectionsClosed(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const ttl = time.Second
	kv := leaseBucket(t, ctx, ttl)
	gained := make(chan int, 1)
	closing, closed := make(chan struct{}), make(chan struct{})
	l := newShardLeases(kv, "a", ShardLeaseConfig{TTL: ttl, Shards: 1}, slog.New(slog.NewTextHandler(io.Discard, nil)),
		func(s int) { gained <- s },
		func(s int, reason string) {
			close(closing)
			<-closed // the shard's connections are still closing
		})
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		l.run(runCtx)
	}()
	finish := sync.OnceFunc(func() { close(closed) }) // the connections have closed
	defer func() {
		finish()
		<-done
	}()
	select {
	case <-gained:
	case <-ctx.Done():
		t.Fatal("shard never gained")
	}
	stop() // graceful stop
	<-closing
	for until := time.Now().Add(3 * ttl); time.Now().Before(until); {
		if _, err := kv.Create(ctx, bus.FetcherShardKey(0), []byte("b")); err == nil {
			t.Fatal("another replica took the shard while its connections were still closing")
		}
		time.Sleep(50 * time.Millisecond)
	}
	finish()
	<-done
	if _, err := kv.Create(ctx, bus.FetcherShardKey(0), []byte("b")); err != nil {
		t.Fatalf("the shard's lease was not freed once its connections closed: %v", err)
	}
}

// A shard moved to a new replica is handed over the same way, and while
// its connections close the leases of the shards this replica keeps are
// renewed too: none lapses for another replica to take while we still
// serve it.
func TestRebalanceKeepsOtherLeasesWhileClosing(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const ttl = time.Second
	kv := leaseBucket(t, ctx, ttl)
	// A shard count at which a second member "b" takes some shards from
	// "a" and leaves it others.
	shards := 2
	for ; len(RendezvousShards([]string{"a", "b"}, "a", shards)) == 0 || len(RendezvousShards([]string{"a", "b"}, "b", shards)) == 0; shards++ {
	}
	kept := RendezvousShards([]string{"a", "b"}, "a", shards)
	gained := make(chan int, shards)
	closing, closed := make(chan int, shards), make(chan struct{})
	l := newShardLeases(kv, "a", ShardLeaseConfig{TTL: ttl, Shards: shards}, slog.New(slog.NewTextHandler(io.Discard, nil)),
		func(s int) { gained <- s },
		func(s int, reason string) {
			closing <- s
			<-closed // the moved shard's connections are still closing
		})
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		l.run(runCtx)
	}()
	finish := sync.OnceFunc(func() { close(closed) }) // the moved shard's connections have closed
	defer func() {
		finish()
		stop()
		<-done
	}()
	for range shards {
		select {
		case <-gained:
		case <-ctx.Done():
			t.Fatal("shards never gained")
		}
	}
	// "b" joins (its member key kept alive) and takes its shards.
	go func() {
		for runCtx.Err() == nil {
			_, _ = kv.Put(runCtx, "m.b", []byte("b"))
			time.Sleep(ttl / 4)
		}
	}()
	<-closing
	for until := time.Now().Add(3 * ttl); time.Now().Before(until); {
		for _, s := range kept {
			if e, err := kv.Get(ctx, bus.FetcherShardKey(s)); err != nil || string(e.Value()) != "a" {
				t.Fatalf("the lease of shard %d, which we keep, lapsed while a moved shard's connections closed (%v)", s, err)
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	finish()
}

// leaseBucket is a lease bucket with the given TTL on a fresh embedded NATS.
func leaseBucket(t *testing.T, ctx context.Context, ttl time.Duration) jetstream.KeyValue {
	t.Helper()
	srv := testkit.StartNATS(t)
	nc, err := nats.Connect("", nats.InProcessServer(srv.Server))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	kv, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "leases", TTL: ttl, History: 1})
	if err != nil {
		t.Fatal(err)
	}
	return kv
}
