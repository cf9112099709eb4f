package fetcher_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/nbd-wtf/go-nostr"

	graspv1 "github.com/grasp-sync/grasp-sync/proto/grasp/v1"

	"github.com/grasp-sync/grasp-sync/pkg/testkit"

	"github.com/grasp-sync/grasp-sync/pkg/testkit/faultrelay"

	"github.com/grasp-sync/grasp-sync/pkg/testkit/testrelay"
)

// Done-when of the fetcher issue: a NIP-77 relay holding 10,000 events we
// already have is reconciled with less than 5% of the bytes a REQ+EOSE
// fetch of the same events takes, measured by the fetcher's own metrics.
func TestNegentropyBytesVersusREQ(t *testing.T) {
	if testing.Short() {
		t.Skip("SKIP: 10,000-event comparison is not run with -short")
	}
	const n = 10_000
	r := faultrelay.Start(t, testrelay.Options{Negentropy: true})
	// Real ids (negentropy needs real sha256 ids), but one signature copied
	// to all: signing 10,000 events takes ~20 s under -race on this
	// machine, and a signature has the same size valid or not, so the
	// bytes compared are those of signed events. Neither the fetcher nor the
	// relay's direct store path checks signatures.
	k := testkit.NewKey()
	sig := k.Note("x").Sig
	evts := make([]*nostr.Event, n)
	for i := range evts {
		evts[i] = &nostr.Event{PubKey: k.PubKey, CreatedAt: nostr.Timestamp(1_000_000 + i/3), Kind: 1,
			Tags: nostr.Tags{}, Content: fmt.Sprintf("note %d", i), Sig: sig}
		evts[i].ID = evts[i].GetID()
		if err := r.Relay.Store.SaveEvent(context.Background(), evts[i]); err != nil {
			t.Fatal(err)
		}
	}
	local := localStore(t, evts)

	neg := newEnv(t)
	fn := neg.start(baseConfig("neg"), local)
	s := neg.connectRelay(r.URL)
	neg.addFilters(0, r.URL, s, "neg", kind1, nil)
	if d := neg.batchDone(r.URL, "neg"); d.GetMethod() != graspv1.SyncMethod_SYNC_METHOD_NEGENTROPY || d.GetEventsReceived() != 0 {
		t.Fatalf("negentropy batch %v", d)
	}
	negBytes := metric(t, fn.reg, "grasp_fetcher_historic_bytes_total", map[string]string{"method": "negentropy"})

	req := newEnv(t)
	cfg := baseConfig("req")
	cfg.DisableNegentropy = true
	fr := req.start(cfg, nil)
	s2 := req.connectRelay(r.URL)
	req.addFilters(0, r.URL, s2, "req", kind1, nil)
	if d := req.batchDone(r.URL, "req"); d.GetEventsReceived() != n {
		t.Fatalf("REQ batch %v", d)
	}
	reqBytes := metric(t, fr.reg, "grasp_fetcher_historic_bytes_total", map[string]string{"method": "req"})
	ratio := negBytes / reqBytes
	t.Logf("10,000 events held on both sides: NIP-77 %.0f bytes, REQ+EOSE %.0f bytes, ratio %.5f", negBytes, reqBytes, ratio)
	if negBytes <= 0 || ratio >= 0.05 {
		t.Fatalf("NIP-77 took %.0f bytes, %.2f%% of REQ+EOSE's %.0f", negBytes, ratio*100, reqBytes)
	}
}
