// Package verify checks nostr event signatures with whichever verifier
// go-nostr was compiled with, and names it: libsecp256k1 (C, through cgo,
// when built with the tag `libsecp256k1`, the default of `make build`) or
// pure Go (btcec, the fallback with CGO_ENABLED=0). See docs/decisions/0027-signature-verification-libsecp256k1.md.
package verify

import (
	"fmt"
	"reflect"

	"github.com/nbd-wtf/go-nostr"

	"github.com/grasp-sync/grasp-sync/pkg/nip34"
)

// The names Backend reports.
const (
	Libsecp256k1 = "libsecp256k1"
	PureGo       = "pure Go"
)

// backend is decided once: which of go-nostr's two signature files was
// compiled in cannot change while the process runs.
var backend = probe()

// Backend names the verifier this binary runs: Libsecp256k1 or PureGo.
func Backend() string { return backend }

// probe asks the compiled go-nostr rather than our own build tags, so a
// build where the tag did not reach go-nostr reports the truth. go-nostr
// v0.52.3 declares Event.Sign variadic (with schnorr.SignOption) only in
// its libsecp256k1 file; the pure-Go Sign takes just the key. The test of
// this package pins that this still holds for the go-nostr in go.mod.
func probe() string {
	if reflect.TypeOf((*nostr.Event).Sign).IsVariadic() {
		return Libsecp256k1
	}
	return PureGo
}

// Signature reports whether evt's signature is valid for its body (like
// evt.CheckSignature), after checking that the pubkey and signature are
// exactly 64 and 128 lower-case hex characters: go-nostr's libsecp256k1
// path decodes them into fixed-size arrays and panics on longer strings
// (a remote peer could end the process with one event), where the pure-Go
// path returns an error. The error says which field is malformed.
func Signature(evt *nostr.Event) (bool, error) {
	if !WellFormedPubKey(evt.PubKey) {
		return false, errMalformed("pubkey", 64)
	}
	if !WellFormedSig(evt.Sig) {
		return false, errMalformed("sig", 128)
	}
	return evt.CheckSignature()
}

// WellFormedPubKey and WellFormedSig report whether a pubkey or signature
// has the shape Signature accepts (64 and 128 lower-case hex characters),
// for callers that hand the event to code calling CheckSignature itself
// (khatru).
func WellFormedPubKey(s string) bool { return nip34.IsLowerHex(s, 64) }

// WellFormedSig: see WellFormedPubKey.
func WellFormedSig(s string) bool { return nip34.IsSignature(s) }

// errMalformed is the error of a pubkey or signature of the wrong shape.
func errMalformed(field string, n int) error {
	return fmt.Errorf("event %s must be %d lower-case hex characters", field, n)
}
