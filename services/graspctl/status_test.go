package graspctl_test

import (
	"strings"
	"testing"

	graspv1 "github.com/grasp-sync/grasp-sync/proto/grasp/v1"

	"github.com/grasp-sync/grasp-sync/pkg/syncstatus"
	"github.com/grasp-sync/grasp-sync/services/graspctl"
)

// graspctl status shows how many batches of a relay were incomplete, and
// what the last one could not read, below the table.
func TestWriteStatusShowsIncompleteBatches(t *testing.T) {
	const last = `history incomplete: 1 one-second slice(s) hit the relay's cap and cannot be split further: {"#a":["x"]}`
	snap := &syncstatus.Snapshot{Relays: []syncstatus.Relay{
		syncstatus.FromRelayState(&graspv1.RelayState{RelayUrl: "wss://capped.example",
			Status: graspv1.RelayStatus_RELAY_STATUS_CONNECTED_HISTORIC_SYNC_FAILURES, HistoricFailures: 2,
			IncompleteBatches: 2, LastIncomplete: last}),
		syncstatus.FromRelayState(&graspv1.RelayState{RelayUrl: "wss://fine.example", Status: graspv1.RelayStatus_RELAY_STATUS_CONNECTED}),
	}}
	var out strings.Builder
	if err := graspctl.WriteStatus(&out, snap); err != nil {
		t.Fatal(err)
	}
	t.Log(out.String())
	lines := strings.Split(out.String(), "\n")
	header := -1
	for i, l := range lines {
		if strings.HasPrefix(l, "RELAY") {
			header = i
		}
	}
	if header < 0 {
		t.Fatal("no table header")
	}
	col := -1
	for i, f := range strings.Fields(strings.ReplaceAll(strings.ReplaceAll(strings.ReplaceAll(lines[header], "ROOTS OK", "ROOTS_OK"),
		"ROOTS PENDING", "ROOTS_PENDING"), "LIVE FILTERS", "LIVE_FILTERS")) {
		if f == "INCOMPLETE" {
			col = i
		}
	}
	if col < 0 {
		t.Fatalf("no INCOMPLETE column: %s", lines[header])
	}
	for url, want := range map[string]string{"wss://capped.example": "2", "wss://fine.example": "0"} {
		for _, l := range lines {
			if f := strings.Fields(l); len(f) > col && f[0] == url && f[col] != want {
				t.Errorf("%s INCOMPLETE = %s, want %s", url, f[col], want)
			}
		}
	}
	if !strings.Contains(out.String(), "incomplete wss://capped.example (2 batches): "+last) {
		t.Errorf("the last incomplete batch is not shown")
	}
	if strings.Contains(out.String(), "incomplete wss://fine.example") {
		t.Errorf("a relay without incomplete batches is listed as incomplete")
	}
}
