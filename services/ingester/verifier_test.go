package ingester_test

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/nbd-wtf/go-nostr"

	"github.com/grasp-sync/grasp-sync/pkg/policy"
)

// TestOversizedKeyOrSignatureRefused: an event whose pubkey or signature is
// longer than 64 / 128 hex characters, with an id computed over that body,
// is refused like any malformed event and the rest is ingested. go-nostr's
// libsecp256k1 verifier panics on such an event, which would end the
// ingester; the default build uses it (docs/decisions/0027-signature-verification-libsecp256k1.md).
func TestOversizedKeyOrSignatureRefused(t *testing.T) {
	w := workloadFor(t, specSmall)
	var base nostr.Event
	for _, d := range w.deliveries {
		if json.Unmarshal(d.data, &base) == nil && w.accepted[base.ID] {
			break
		}
	}
	longKey := base
	longKey.PubKey += "00"
	longKey.ID = longKey.GetID()
	longSig := base
	longSig.CreatedAt++ // another id, so it is not taken for a copy of base
	longSig.ID = longSig.GetID()
	longSig.Sig += "0000"
	var bad []delivery
	for n, e := range []nostr.Event{longKey, longSig} {
		data, err := json.Marshal(e)
		if err != nil {
			t.Fatal(err)
		}
		bad = append(bad, delivery{data: data, msgID: "oversized-" + string(rune('a'+n)), relay: "ws://127.0.0.1:1"})
	}
	e := newEnv(t)
	cfg := fastConfig()
	cfg.AckWait = time.Minute
	r := e.start(t, cfg, nil)
	e.publish(t, append(bad, w.deliveries...))
	e.waitDrained(t, w.accepted, 2*time.Minute)
	e.assertExactly(t, w.accepted)
	st := r.ing.Stats()
	if got := st.Refused[string(policy.ReasonMalformed)]; got != 1 {
		t.Errorf("malformed refusals = %d, want 1 (the 66-character pubkey)", got)
	}
	if got := st.Refused[string(policy.ReasonBadSignature)]; got != int64(w.badSig)+1 {
		t.Errorf("bad-signature refusals = %d, want %d (the workload's forgeries and the 132-character signature)", got, w.badSig+1)
	}
}
