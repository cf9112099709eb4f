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

// graspctl status shows each relay's budgets in force and where they come
// from, what lowered them, and the reads it refuses with when they are
// asked again (docs/sync.md, "What relays allow").
func TestWriteStatusShowsLimits(t *testing.T) {
	now := time.Date(2026, 12, 5, 9, 0, 0, 0, time.UTC)
	learned := syncstatus.FromRelayState(&graspv1.RelayState{RelayUrl: "wss://strfry.example", Status: graspv1.RelayStatus_RELAY_STATUS_CONNECTED})
	learned.Limits = syncstatus.FromRelayLimits(&graspv1.RelayLimits{RelayUrl: "wss://strfry.example",
		Advertised:    &graspv1.Limits{MaxMessageBytes: 131072, MaxSubscriptions: 20, MaxLimit: 500},
		Learned:       &graspv1.Limits{MaxSubscriptions: 8},
		LimitRefusals: map[string]uint64{"subscriptions": 2},
		Refusals: []*graspv1.ReadRefusal{{FilterKind: "roots", Reason: "auth-required: members only",
			At: now.Add(-time.Hour).UnixMilli(), RetryAt: now.Add(23 * time.Hour).UnixMilli()}}})
	silent := syncstatus.FromRelayState(&graspv1.RelayState{RelayUrl: "wss://silent.example", Status: graspv1.RelayStatus_RELAY_STATUS_CONNECTED})
	silent.Limits = syncstatus.FromRelayLimits(&graspv1.RelayLimits{RelayUrl: "wss://silent.example", Nip11Error: "HTTP 404"})
	unknown := syncstatus.FromRelayState(&graspv1.RelayState{RelayUrl: "wss://new.example", Status: graspv1.RelayStatus_RELAY_STATUS_CONNECTING})
	snap := &syncstatus.Snapshot{Taken: now, Relays: []syncstatus.Relay{learned, silent, unknown}}
	var out strings.Builder
	if err := graspctl.WriteStatus(&out, snap); err != nil {
		t.Fatal(err)
	}
	got := out.String()
	t.Log(got)
	for _, want := range []string{
		"128K/8/20 learned", // NIP-11's size, the learned count, the default filters
		"64K/20/20 default", // a relay whose NIP-11 said nothing
		"limits wss://strfry.example: in force 131072 bytes per message, 8 subscriptions, 20 filters per REQ, 500 per filter",
		"refusals subscriptions 2",
		`refused wss://strfry.example: roots reads: "auth-required: members only" (last 1h0m0s ago, asked again in 23h0m0s)`,
	} {
		if !strings.Contains(got, want) {
			t.Errorf("status lacks %q", want)
		}
	}
	for _, l := range strings.Split(got, "\n") {
		if strings.HasPrefix(l, "wss://new.example") && !strings.Contains(l, " - ") {
			t.Errorf("a relay with no limits record shows %q, want a dash", l)
		}
	}
}
