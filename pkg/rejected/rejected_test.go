package rejected_test

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/nbd-wtf/go-nostr"

	"github.com/grasp-sync/grasp-sync/pkg/bus"
	"github.com/grasp-sync/grasp-sync/pkg/rejected"
	"github.com/grasp-sync/grasp-sync/pkg/testkit"
)

// A refusal recorded by one process is part of another's local set for the
// filters it matches, and only those.
func TestCacheServesRecordedRefusals(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	b, err := bus.ConnectInProcess(testkit.StartNATS(t).Server, "t", bus.DefaultNames())
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	opts := bus.DefaultOptions()
	opts.Storage = jetstream.MemoryStorage
	if err := bus.Setup(ctx, b.JS, b.Names, opts); err != nil {
		t.Fatal(err)
	}
	kv, err := rejected.Open(ctx, b)
	if err != nil {
		t.Fatal(err)
	}
	k := testkit.NewKey()
	repo := testkit.RepoRef(k.PubKey, "r")
	early := k.Issue(repo, "before the cache starts")
	if err := rejected.Add(ctx, kv, early, "no_reference"); err != nil {
		t.Fatal(err)
	}
	c := rejected.NewCache()
	done := make(chan error, 1)
	rctx, stop := context.WithCancel(ctx)
	go func() { done <- c.Run(rctx, kv) }()
	defer func() { stop(); <-done }()

	late := k.Patch(repo)
	other := k.Note("unrelated")
	for _, e := range []*nostr.Event{late, other} {
		if err := rejected.Add(ctx, kv, e, "no_reference"); err != nil {
			t.Fatal(err)
		}
	}
	f := nostr.Filter{Tags: nostr.TagMap{"a": {repo}}}
	deadline := time.Now().Add(5 * time.Second)
	for {
		items, err := c.Items(ctx, f)
		if err != nil {
			t.Fatal(err)
		}
		if len(items) == 2 {
			for _, it := range items {
				if it.ID == other.ID {
					t.Fatal("an event outside the filter is in its local set")
				}
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("local set for #a has %d items, want the issue and the patch", len(items))
		}
		time.Sleep(20 * time.Millisecond)
	}
}
