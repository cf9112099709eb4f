package verify

import (
	"strings"
	"testing"

	"github.com/nbd-wtf/go-nostr"
)

// TestBackendMatchesBuild: a binary built with the tag `libsecp256k1`
// reports libsecp256k1 and one built without reports pure Go (`make test`
// runs this package both ways).
func TestBackendMatchesBuild(t *testing.T) {
	if got := Backend(); got != wantBackend {
		t.Fatalf("Backend() = %q, want %q for this build", got, wantBackend)
	}
}

func signed(t *testing.T) nostr.Event {
	t.Helper()
	evt := nostr.Event{Kind: 30617, CreatedAt: 1700000000, Tags: nostr.Tags{{"d", "repo"}}, Content: "x"}
	if err := evt.Sign(nostr.GeneratePrivateKey()); err != nil {
		t.Fatal(err)
	}
	return evt
}

// TestSignature: a valid event verifies, a changed body does not, and a
// pubkey or signature of the wrong shape is an error, not a panic (go-nostr's
// libsecp256k1 path panics on a pubkey longer than 64 characters).
func TestSignature(t *testing.T) {
	good := signed(t)
	for _, tc := range []struct {
		name    string
		edit    func(e *nostr.Event)
		ok      bool
		errWant string
	}{
		{"valid", func(*nostr.Event) {}, true, ""},
		{"body changed", func(e *nostr.Event) { e.Content = "y" }, false, ""},
		{"pubkey too long", func(e *nostr.Event) { e.PubKey += "00" }, false, "pubkey"},
		{"pubkey too short", func(e *nostr.Event) { e.PubKey = e.PubKey[:62] }, false, "pubkey"},
		{"pubkey upper case", func(e *nostr.Event) { e.PubKey = strings.ToUpper(e.PubKey) }, false, "pubkey"},
		{"sig too long", func(e *nostr.Event) { e.Sig += "0000" }, false, "sig"},
		{"sig not hex", func(e *nostr.Event) { e.Sig = "zz" + e.Sig[2:] }, false, "sig"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := good
			e.Tags = append(nostr.Tags(nil), good.Tags...)
			tc.edit(&e)
			ok, err := Signature(&e)
			if ok != tc.ok {
				t.Fatalf("ok = %v, want %v (err %v)", ok, tc.ok, err)
			}
			switch {
			case tc.errWant == "" && err != nil:
				t.Fatalf("unexpected error %v", err)
			case tc.errWant != "" && (err == nil || !strings.Contains(err.Error(), tc.errWant)):
				t.Fatalf("error %v, want one naming %q", err, tc.errWant)
			}
			if (WellFormedPubKey(e.PubKey) && WellFormedSig(e.Sig)) != (tc.errWant == "") {
				t.Fatalf("WellFormed disagrees with Signature for %s", tc.name)
			}
		})
	}
}
