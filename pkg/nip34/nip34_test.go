package nip34_test

import (
	"strings"
	"testing"

	"github.com/grasp-sync/grasp-sync/pkg/nip34"
	"github.com/nbd-wtf/go-nostr"
)

const pk = "79be667ef9dcbbac55a06295ce870b07029bfcdb2dce28d959f2815b16f81798"

func TestParseRepoRef(t *testing.T) {
	tests := []struct {
		in   string
		ok   bool
		want string
	}{
		{"30617:" + pk + ":repo", true, "repo"},
		{"30617:" + pk + ":a:b", true, "a:b"},
		{"30617:" + pk + ":", false, ""},
		{"30617:" + pk + ":..", false, ""},
		{"30617:" + pk + ":a/b", false, ""},
		{"30618:" + pk + ":repo", false, ""},
		{"30617:" + strings.ToUpper(pk) + ":repo", false, ""},
		{"30617:abc:repo", false, ""},
		{"garbage", false, ""},
	}
	for _, tt := range tests {
		r, ok := nip34.ParseRepoRef(tt.in)
		if ok != tt.ok || r.Identifier != tt.want {
			t.Errorf("ParseRepoRef(%q) = %+v, %v", tt.in, r, ok)
		}
		if ok && r.String() != tt.in {
			t.Errorf("String() = %q, want %q", r.String(), tt.in)
		}
	}
}

func TestKeyRoundTrip(t *testing.T) {
	for _, d := range []string{"repo", "ngit", "with space", "ünïcode", "a:b", "x.y", "-_="} {
		r := nip34.RepoRef{PubKey: pk, Identifier: d}
		key := r.Key()
		for _, c := range key {
			if !strings.ContainsRune("-/_=.abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789", c) {
				t.Fatalf("key %q has character %q not allowed in KV keys", key, c)
			}
		}
		if strings.Contains(key, "..") || strings.HasSuffix(key, ".") {
			t.Fatalf("key %q is not a valid KV key", key)
		}
		back, ok := nip34.ParseKey(key)
		if !ok || back != r {
			t.Errorf("ParseKey(%q) = %+v, %v, want %+v", key, back, ok, r)
		}
	}
}

func TestParseAnnouncement(t *testing.T) {
	evt := &nostr.Event{Kind: 30617, PubKey: pk, ID: "id", Tags: nostr.Tags{
		{"d", "repo"},
		{"clone", "https://a.example/npub/repo.git", "https://github.com/x/repo.git"},
		{"relays", "wss://a.example", "wss://b.example"},
		{"relays", "wss://c.example"},
		{"maintainers", "m1", "m2"},
	}}
	a, err := nip34.ParseAnnouncement(evt)
	if err != nil {
		t.Fatal(err)
	}
	if len(a.Clone) != 2 || len(a.Relays) != 3 || len(a.Maintainers) != 2 || a.Ref.Identifier != "repo" {
		t.Fatalf("ParseAnnouncement = %+v", a)
	}
	evt.Tags[0] = nostr.Tag{"d", ""}
	if _, err := nip34.ParseAnnouncement(evt); err == nil {
		t.Fatal("empty identifier accepted")
	}
}

// DecodeID takes exactly an id as it is on the wire: 64 lowercase hex digits.
func TestDecodeID(t *testing.T) {
	id := "00ff10a9" + strings.Repeat("0123456789abcdef", 3) + "fedcba98"
	want := [32]byte{0x00, 0xff, 0x10, 0xa9}
	for i := range 24 {
		want[4+i] = []byte{0x01, 0x23, 0x45, 0x67, 0x89, 0xab, 0xcd, 0xef}[i%8]
	}
	want[28], want[29], want[30], want[31] = 0xfe, 0xdc, 0xba, 0x98
	for _, c := range []struct {
		v  string
		ok bool
	}{
		{id, true},
		{strings.ToUpper(id), false},
		{id[:63] + "A", false},
		{id[:63] + "g", false},
		{id[:63] + "/", false}, // the byte before '0'
		{id[:63] + ":", false}, // the byte after '9'
		{id[:63] + "`", false}, // the byte before 'a'
		{id[:62], false},
		{id + "00", false},
		{"", false},
		{"30617:" + id[6:], false},
	} {
		b, ok := nip34.DecodeID(c.v)
		if ok != c.ok {
			t.Errorf("DecodeID(%q) ok = %v, want %v", c.v, ok, c.ok)
		}
		if ok && b != want {
			t.Errorf("DecodeID(%q) = %x, want %x", c.v, b, want)
		}
	}
}
