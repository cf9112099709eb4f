package graspctl_test

import (
	"encoding/json"
	"testing"

	"github.com/nats-io/nats.go"

	graspv1 "github.com/grasp-sync/grasp-sync/proto/grasp/v1"

	"github.com/grasp-sync/grasp-sync/pkg/bus"
	"github.com/grasp-sync/grasp-sync/services/graspctl"
)

func TestSubjectMatches(t *testing.T) {
	for _, tc := range []struct {
		pattern, subject string
		want             bool
	}{
		{"grasp.>", "grasp.events.3", true},
		{"grasp.>", "grasp", false},
		{"grasp.*.cmd.*", "grasp.fetch.cmd.3", true},
		{"grasp.*.cmd", "grasp.fetch.cmd.3", false},
		{"grasp.fetch.cmd.3", "grasp.fetch.cmd.3", true},
		{"grasp.fetch.cmd.3", "grasp.fetch.cmd.4", false},
		{"other.>", "grasp.events.1", false},
	} {
		if got := graspctl.SubjectMatches(tc.pattern, tc.subject); got != tc.want {
			t.Errorf("SubjectMatches(%q, %q) = %v, want %v", tc.pattern, tc.subject, got, tc.want)
		}
	}
}

func TestLineFilters(t *testing.T) {
	cmd, err := bus.NewMsg("grasp.fetch.cmd.1", &graspv1.FetchCommand{RelayUrl: "wss://a.example",
		Command: &graspv1.FetchCommand_DropRelay{DropRelay: &graspv1.DropRelay{Reason: "30617:aa:demo gone"}}})
	if err != nil {
		t.Fatal(err)
	}
	evt := []byte(`{"id":"e1","kind":1621,"tags":[["a","30617:aa:demo"]],"content":"x"}`)
	evtHeader := nats.Header{bus.HeaderRelay: []string{"wss://b.example"}}
	for _, tc := range []struct {
		name         string
		f            graspctl.TapFilter
		cmdOK, evtOK bool
	}{
		{"no filter", graspctl.TapFilter{}, true, true},
		{"relay of the command", graspctl.TapFilter{Relay: "wss://a.example"}, true, false},
		{"relay of the event header", graspctl.TapFilter{Relay: "wss://b.example"}, false, true},
		{"repo in both", graspctl.TapFilter{Repo: "30617:aa:demo"}, true, true},
		{"other repo", graspctl.TapFilter{Repo: "30617:bb:x"}, false, false},
		{"kind keeps events of that kind only", graspctl.TapFilter{Kind: 1621}, false, true},
		{"other kind", graspctl.TapFilter{Kind: 1}, false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cl, ok := graspctl.Line(cmd.Subject, cmd.Header, cmd.Data, tc.f)
			if ok != tc.cmdOK {
				t.Errorf("command kept = %v, want %v", ok, tc.cmdOK)
			}
			if cl.Type != "grasp.v1.FetchCommand" || cl.Relay != "wss://a.example" || !json.Valid(cl.Message) {
				t.Errorf("command line %+v", cl)
			}
			el, ok := graspctl.Line("grasp.events.2", evtHeader, evt, tc.f)
			if ok != tc.evtOK {
				t.Errorf("event kept = %v, want %v", ok, tc.evtOK)
			}
			if string(el.Event) != string(evt) || el.Relay != "wss://b.example" {
				t.Errorf("event line %+v: want the event as it came", el)
			}
		})
	}
}
