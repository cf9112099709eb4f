package config

import (
	"errors"
	"fmt"
	"strings"

	"github.com/nbd-wtf/go-nostr"
	"github.com/nbd-wtf/go-nostr/nip19"

	"github.com/grasp-sync/grasp-sync/pkg/nip34"
)

// SecretKey normalises a secret key given in configuration (hex, either
// case, or NIP-19 nsec) to lower-case hex, refusing anything that is not a
// valid secp256k1 key: the NIP-42 keys of the fetcher and of the bolt-on
// target (GRASP_FETCHER_AUTH_KEY, GRASP_TARGET_AUTH_KEY) are read this way.
func SecretKey(s string) (string, error) {
	if strings.HasPrefix(s, "nsec") {
		_, v, err := nip19.Decode(s)
		if err != nil {
			return "", fmt.Errorf("bad nsec: %w", err)
		}
		sk, _ := v.(string)
		return sk, nil
	}
	if !nip34.IsLowerHex(strings.ToLower(s), 64) {
		return "", errors.New("want 64 hex characters or an nsec")
	}
	if strings.Trim(s, "0") == "" {
		return "", errors.New("zero is not a secret key")
	}
	if _, err := nostr.GetPublicKey(strings.ToLower(s)); err != nil {
		return "", err
	}
	return strings.ToLower(s), nil
}
