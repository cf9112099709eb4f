package config_test

import (
	"strings"
	"testing"

	"github.com/nbd-wtf/go-nostr"
	"github.com/nbd-wtf/go-nostr/nip19"

	"github.com/grasp-sync/grasp-sync/pkg/config"
)

func TestSecretKey(t *testing.T) {
	sk := nostr.GeneratePrivateKey()
	nsec, err := nip19.EncodePrivateKey(sk)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, in, want string
		ok             bool
	}{
		{"hex", sk, sk, true},
		{"upper-case hex", strings.ToUpper(sk), sk, true},
		{"nsec", nsec, sk, true},
		{"short hex", sk[:62], "", false},
		{"not hex", strings.Repeat("g", 64), "", false},
		{"zero is not a key", strings.Repeat("0", 64), "", false},
		{"bad nsec", "nsec1qqqq", "", false},
	} {
		got, err := config.SecretKey(tc.in)
		if (err == nil) != tc.ok || got != tc.want {
			t.Errorf("%s: SecretKey(%q) = %q, %v; want %q (ok %v)", tc.name, tc.in, got, err, tc.want, tc.ok)
		}
	}
}
