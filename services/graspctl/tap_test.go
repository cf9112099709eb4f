package graspctl_test

import (
	"strings"
	"testing"

	"github.com/nats-io/nats.go"

	graspv1 "github.com/grasp-sync/grasp-sync/proto/grasp/v1"

	"github.com/grasp-sync/grasp-sync/pkg/bus"
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
