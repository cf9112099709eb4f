package graspctl_test

import (
	"context"
	"encoding/json"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nbd-wtf/go-nostr"

	graspv1 "github.com/grasp-sync/grasp-sync/proto/grasp/v1"

	"github.com/grasp-sync/grasp-sync/pkg/bus"
	"github.com/grasp-sync/grasp-sync/pkg/testkit"
	"github.com/grasp-sync/grasp-sync/pkg/testkit/natstest"
	"github.com/grasp-sync/grasp-sync/services/graspctl"
)

func TestRenderDecodesControlMessages(t *testing.T) {
	msg, err := bus.NewMsg("grasp.fetch.cmd.3", &graspv1.FetchCommand{RelayUrl: "wss://r.example", Epoch: 7,
		Command: &graspv1.FetchCommand_DropRelay{DropRelay: &graspv1.DropRelay{Reason: "gone"}}})
	if err != nil {
		t.Fatal(err)
	}
	line := graspctl.Render(msg.Subject, msg.Header, msg.Data)
	for _, want := range []string{"grasp.fetch.cmd.3", "grasp.v1.FetchCommand", `"relayUrl":"wss://r.example"`, `"reason":"gone"`} {
		if !strings.Contains(line, want) {
			t.Errorf("Render = %s, missing %s", line, want)
		}
	}
	raw := graspctl.Render("grasp.events.1", nats.Header{}, []byte(`{"id":"x"}`))
	if raw != `grasp.events.1 {"id":"x"}` {
		t.Errorf("event rendered as %q, want the JSON as it is", raw)
	}
}

// TestTapShowsBatchedEventsOneByOne: a message carrying a batch of events
// (bus.HeaderEvents) is tapped as one line per event, each with the batch's
// relay, and a kind filter keeps only the matching events of a batch.
func TestTapShowsBatchedEventsOneByOne(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	n := natstest.Start(t)
	b, err := bus.Connect(ctx, n.URL, "tap-test", bus.DefaultNames(), bus.Security{})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	k := testkit.NewKey()
	evts := []*nostr.Event{k.Note("one"), k.Note("two"), k.Issue(testkit.RepoRef(k.PubKey, "r"), "three")}
	msg := nats.NewMsg(b.Names.EventsSubject(0))
	for _, e := range evts {
		data, _ := e.MarshalJSON()
		msg.Data = append(append(msg.Data, data...), '\n')
	}
	msg.Header.Set(bus.HeaderEvents, strconv.Itoa(len(evts)))
	msg.Header.Set(bus.HeaderRelay, "wss://r.example")

	tap := func(f graspctl.TapFilter) []graspctl.TapLine {
		tctx, tcancel := context.WithCancel(ctx)
		defer tcancel()
		var out testkit.LogBuffer
		ready, done := make(chan struct{}), make(chan error, 1)
		go func() {
			done <- graspctl.Tap(tctx, b, graspctl.TapOptions{Subjects: []string{b.Names.EventsSubjects()}, Filter: f,
				Ready: func() { close(ready) }}, &out)
		}()
		<-ready
		if err := b.Conn.PublishMsg(msg); err != nil {
			t.Fatal(err)
		}
		// A marker after the batch: once it is printed, the batch is too.
		if err := b.Conn.Publish(b.Names.EventsSubject(1), []byte(`{"kind":1621,"id":"marker"}`)); err != nil {
			t.Fatal(err)
		}
		deadline := time.Now().Add(30 * time.Second)
		for !strings.Contains(out.String(), "marker") {
			if time.Now().After(deadline) {
				t.Fatalf("tap printed %q, no marker", out.String())
			}
			time.Sleep(10 * time.Millisecond)
		}
		tcancel()
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		var lines []graspctl.TapLine
		for _, s := range strings.Split(strings.TrimSpace(out.String()), "\n") {
			var l graspctl.TapLine
			if err := json.Unmarshal([]byte(s), &l); err != nil {
				t.Fatalf("line %q: %v", s, err)
			}
			if !strings.Contains(string(l.Event), "marker") {
				lines = append(lines, l)
			}
		}
		return lines
	}

	lines := tap(graspctl.TapFilter{})
	if len(lines) != len(evts) {
		t.Fatalf("tap printed %d event lines for a batch of %d: %+v", len(lines), len(evts), lines)
	}
	for k, l := range lines {
		var got nostr.Event
		if err := got.UnmarshalJSON(l.Event); err != nil || got.ID != evts[k].ID || l.Relay != "wss://r.example" || l.Error != "" {
			t.Errorf("line %d = %+v, want event %s from wss://r.example", k, l, evts[k].ID)
		}
	}
	lines = tap(graspctl.TapFilter{Kind: 1621})
	if len(lines) != 1 || !strings.Contains(string(lines[0].Event), evts[2].ID) {
		t.Errorf("kind filter kept %+v, want the issue alone", lines)
	}
}
