package policy_test

import (
	"testing"

	"github.com/nbd-wtf/go-nostr"

	"github.com/grasp-sync/grasp-sync/pkg/policy"
)

func TestListsService(t *testing.T) {
	u := newUser(t)
	tests := []struct {
		service       string
		clone, relays string
		want          bool
	}{
		{service, "https://git.example.com/npub1x/r.git", "wss://git.example.com", true},
		{service, "wss://git.example.com", "wss://git.example.com/", true},
		{service, "http://git.example.com/npub1x/r.git", "wss://git.example.com", false}, // port 80 ≠ 443
		{service, "https://git.example.com/npub1x/r.git", "https://git.example.com", false},
		{service, "ssh://git.example.com/r.git", "wss://git.example.com", false},
		{service, "git@git.example.com:r.git", "wss://git.example.com", false},
		{service, "https://example.com/npub1x/r.git", "wss://example.com", false},
		{"ws://127.0.0.1:7777", "http://127.0.0.1:7777/npub1x/r.git", "ws://127.0.0.1:7777", true},
		{"ws://127.0.0.1:7777", "http://127.0.0.1:7778/npub1x/r.git", "ws://127.0.0.1:7777", false},
		{"", "https://git.example.com/npub1x/r.git", "wss://git.example.com", false},
	}
	for _, tt := range tests {
		t.Run(tt.service+" "+tt.clone+" "+tt.relays, func(t *testing.T) {
			p := &policy.Policy{ServiceURL: tt.service}
			evt := u.ev(t, 30617, 0, "", nostr.Tag{"d", "r"}, nostr.Tag{"clone", tt.clone}, nostr.Tag{"relays", tt.relays})
			if got := p.ListsService(evt); got != tt.want {
				t.Fatalf("ListsService = %v, want %v", got, tt.want)
			}
		})
	}
	if (&policy.Policy{ServiceURL: service}).ListsService(nil) {
		t.Fatal("ListsService(nil) = true")
	}
}
