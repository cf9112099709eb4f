package graspctl

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/grasp-sync/grasp-sync/pkg/bus"
	"github.com/grasp-sync/grasp-sync/pkg/rejected"
	"github.com/grasp-sync/grasp-sync/pkg/testkit"
	"github.com/grasp-sync/grasp-sync/pkg/testkit/natstest"
	"github.com/grasp-sync/grasp-sync/pkg/testkit/testrelay"
)

// graspctl explain EVENT_ID says whether the relay holds the event and who
// refused it why: the target relay (bolt-on mode, its own reason) or our
// policy.
func TestExplainEvent(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	n := natstest.Start(t)
	nc := n.Connect(t)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	b := &bus.Bus{Conn: nc, JS: js, Names: bus.Names{Prefix: "grasp"}}
	if err := bus.Setup(ctx, js, b.Names, bus.DefaultOptions()); err != nil {
		t.Fatal(err)
	}
	kv, err := rejected.Open(ctx, b)
	if err != nil {
		t.Fatal(err)
	}
	target := testrelay.Start(t, testrelay.Options{})
	k := testkit.NewKey()
	ref := testkit.RepoRef(k.PubKey, "r")
	held, spam, foreign := k.Issue(ref, "held"), k.Issue(ref, "spam"), k.Issue(ref, "not ours")
	target.Add(t, held)
	if err := rejected.Add(ctx, kv, spam, "target: blocked: spam is not welcome here"); err != nil {
		t.Fatal(err)
	}
	if err := rejected.Add(ctx, kv, foreign, "not-listed"); err != nil {
		t.Fatal(err)
	}
	explain := func(id string) string {
		var out bytes.Buffer
		if err := ExplainEvent(ctx, b, id, ExplainOptions{RelayURL: target.URL}, &out); err != nil {
			t.Fatal(err)
		}
		return out.String()
	}
	for id, want := range map[string][]string{
		held.ID:    {"held by " + target.URL, "no refusal recorded"},
		spam.ID:    {"not held by " + target.URL, "refused by the target relay: blocked: spam is not welcome here"},
		foreign.ID: {"not held by", "refused by our write policy: not-listed"},
	} {
		got := explain(id)
		for _, w := range want {
			if !strings.Contains(got, w) {
				t.Errorf("explain %s:\n%s\nwant %q", id, got, w)
			}
		}
	}
}
