package natstest_test

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/grasp-sync/grasp-sync/pkg/testkit/natstest"
)

func TestStartJetStream(t *testing.T) {
	n := natstest.Start(t)
	if !n.Server.JetStreamEnabled() {
		t.Fatal("JetStream not enabled")
	}
	nc := n.Connect(t)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatalf("jetstream.New: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()

	stream, err := js.CreateStream(ctx, jetstream.StreamConfig{
		Name:     "EVENTS",
		Subjects: []string{"events.>"},
		Storage:  jetstream.FileStorage,
	})
	if err != nil {
		t.Fatalf("create stream: %v", err)
	}
	for _, subj := range []string{"events.a", "events.b"} {
		if _, err := js.Publish(ctx, subj, []byte("hello")); err != nil {
			t.Fatalf("publish %s: %v", subj, err)
		}
	}
	info, err := stream.Info(ctx)
	if err != nil {
		t.Fatalf("stream info: %v", err)
	}
	if info.State.Msgs != 2 {
		t.Fatalf("stream has %d messages, want 2", info.State.Msgs)
	}

	cons, err := stream.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{Durable: "c", AckPolicy: jetstream.AckExplicitPolicy})
	if err != nil {
		t.Fatalf("create consumer: %v", err)
	}
	batch, err := cons.Fetch(2, jetstream.FetchMaxWait(2*time.Second))
	if err != nil {
		t.Fatalf("fetch: %v", err)
	}
	got := 0
	for msg := range batch.Messages() {
		if err := msg.Ack(); err != nil {
			t.Fatalf("ack: %v", err)
		}
		got++
	}
	if got != 2 {
		t.Fatalf("fetched %d messages, want 2", got)
	}
}
