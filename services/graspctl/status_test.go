package graspctl_test

import (
	"strings"
	"testing"
	"time"

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

// graspctl status shows per relay how many events only a daily resync
// found (MISSED), and when the last one was, below the table.
func TestWriteStatusShowsResyncMissed(t *testing.T) {
	taken := time.Unix(1_700_000_000, 0).UTC()
	snap := &syncstatus.Snapshot{Taken: taken, Relays: []syncstatus.Relay{
		syncstatus.FromRelayState(&graspv1.RelayState{RelayUrl: "wss://reqonly.example", Status: graspv1.RelayStatus_RELAY_STATUS_CONNECTED,
			ResyncMissed: 9, LastMissedAt: taken.Add(-2 * time.Hour).Unix()}),
		syncstatus.FromRelayState(&graspv1.RelayState{RelayUrl: "wss://fine.example", Status: graspv1.RelayStatus_RELAY_STATUS_CONNECTED}),
	}}
	var out strings.Builder
	if err := graspctl.WriteStatus(&out, snap); err != nil {
		t.Fatal(err)
	}
	t.Log(out.String())
	lines := strings.Split(out.String(), "\n")
	col := -1
	for _, l := range lines {
		if strings.HasPrefix(l, "RELAY") {
			for i, f := range strings.Fields(strings.NewReplacer("ROOTS OK", "ROOTS_OK", "ROOTS PENDING", "ROOTS_PENDING", "LIVE FILTERS", "LIVE_FILTERS").Replace(l)) {
				if f == "MISSED" {
					col = i
				}
			}
		}
	}
	if col < 0 {
		t.Fatal("no MISSED column")
	}
	for url, want := range map[string]string{"wss://reqonly.example": "9", "wss://fine.example": "0"} {
		found := false
		for _, l := range lines {
			if f := strings.Fields(l); len(f) > col && f[0] == url {
				found = true
				if f[col] != want {
					t.Errorf("%s MISSED = %s, want %s", url, f[col], want)
				}
			}
		}
		if !found {
			t.Errorf("no row for %s", url)
		}
	}
	if !strings.Contains(out.String(), "missed wss://reqonly.example: 9 events found only by a daily resync (missed by live and catch-up), the last 2h0m0s ago") {
		t.Error("the relay's misses are not explained below the table")
	}
	if strings.Contains(out.String(), "missed wss://fine.example") {
		t.Error("a relay without misses is listed")
	}
}
