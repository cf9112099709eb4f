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
	"github.com/grasp-sync/grasp-sync/pkg/testkit/natstest"
)

// A refusal recorded by one process is part of another's local set for the
// filters it matches, and only those.
func TestCacheServesRecordedRefusals(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	b, err := bus.ConnectInProcess(natstest.Start(t).Server, "t", bus.DefaultNames())
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

// Forget deletes exactly the remembered refusals its rule matches, and a
// cache following the bucket drops them: the way a newly whitelisted
// archive's announcements leave the NIP-77 local set.
func TestForget(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	b, err := bus.ConnectInProcess(natstest.Start(t).Server, "t", bus.DefaultNames())
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
	bob, mallory := testkit.NewKey(), testkit.NewKey()
	bobAnn := bob.Announcement("tool", []string{"https://x.example/tool.git"}, []string{"wss://x.example"}, nil)
	bobBig := bob.Note("too big")
	malloryAnn := mallory.Announcement("tool", []string{"https://x.example/tool.git"}, []string{"wss://x.example"}, nil)
	for evt, reason := range map[*nostr.Event]string{bobAnn: "not-maintainer", bobBig: "too-large", malloryAnn: "not-maintainer"} {
		if err := rejected.Add(ctx, kv, evt, reason); err != nil {
			t.Fatal(err)
		}
	}
	c := rejected.NewCache()
	done := make(chan error, 1)
	rctx, stop := context.WithCancel(ctx)
	go func() { done <- c.Run(rctx, kv) }()
	defer func() { stop(); <-done }()

	n, err := rejected.Forget(ctx, kv, func(kind int, pubkey string, tags nostr.Tags, reason string) bool {
		return kind == 30617 && pubkey == bob.PubKey && tags.GetD() == "tool" && reason == "not-maintainer"
	})
	if err != nil || n != 1 {
		t.Fatalf("Forget = %d, %v; want 1", n, err)
	}
	for evt, want := range map[*nostr.Event]bool{bobAnn: false, bobBig: true, malloryAnn: true} {
		_, found, err := rejected.Reason(ctx, kv, evt.ID)
		if err != nil || found != want {
			t.Errorf("kind %d by %s remembered = %v (%v), want %v", evt.Kind, evt.PubKey[:8], found, err, want)
		}
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		items, err := c.Items(ctx, nostr.Filter{Kinds: []int{30617}})
		if err != nil {
			t.Fatal(err)
		}
		if len(items) == 1 && items[0].ID == malloryAnn.ID {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("cache still holds %v", items)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if n, err := rejected.Forget(ctx, kv, func(int, string, nostr.Tags, string) bool { return false }); err != nil || n != 0 {
		t.Fatalf("Forget nothing = %d, %v", n, err)
	}
}
