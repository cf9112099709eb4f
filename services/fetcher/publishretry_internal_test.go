package fetcher

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/grasp-sync/grasp-sync/pkg/bus"
	"github.com/grasp-sync/grasp-sync/pkg/clock"
	"github.com/grasp-sync/grasp-sync/pkg/testkit/natstest"
)

// A publish that meets a stream with nobody answering — its leader's node
// died and the replicas are still electing another — is tried again until
// the stream answers, not failed within seconds: a failed batch waits for
// the planner's failure retry (5 minutes). Here the stream (a real NATS
// server's subscriber answering as the events stream does) is away for 5 s;
// the fetcher gave up after ~3 s before.
func TestPublishWaitsOutStreamWithoutLeader(t *testing.T) {
	n := natstest.Start(t)
	b, err := bus.Connect(context.Background(), n.URL, "fetcher-test", bus.DefaultNames(), bus.Security{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.Close)
	f := New(Config{ID: "a", Shards: 1}, b, clock.Real{}, slog.New(slog.NewTextHandler(io.Discard, nil)), nil)

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		p := f.newWindowPublisher()
		msg := nats.NewMsg(b.Names.EventsSubject(0))
		msg.Header.Set(bus.HeaderRelay, "ws://127.0.0.1:1")
		msg.Header.Set(bus.HeaderBatch, "b1")
		msg.Header.Set(nats.MsgIdHdr, "e1")
		msg.Data = []byte(`{"id":"e1"}`)
		if err := p.add(ctx, msg, recentKeyOf("e1"), recentKeyOf("e1")); err != nil {
			done <- err
			return
		}
		done <- p.flush(ctx)
	}()

	select {
	case err := <-done:
		t.Fatalf("the publish ended while no stream answered: %v", err)
	case <-time.After(5 * time.Second):
	}
	stream := &heldAcks{nc: n.Connect(t), letGo: true}
	if _, err := stream.nc.Subscribe(b.Names.EventsSubjects(), stream.receive); err != nil {
		t.Fatal(err)
	}
	if err := stream.nc.Flush(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("the publish failed after the stream came back: %v", err)
		}
	case <-ctx.Done():
		t.Fatal("the publish did not finish after the stream came back")
	}
}
