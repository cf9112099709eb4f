package nip34_test

import (
	"strings"
	"testing"

	"github.com/nbd-wtf/go-nostr"

	"github.com/grasp-sync/grasp-sync/pkg/nip34"
)

func TestIsLowerHex(t *testing.T) {
	tests := []struct {
		in   string
		n    int
		want bool
	}{
		{pk, 64, true},
		{strings.ToUpper(pk), 64, false},
		{pk[:63], 64, false},
		{pk + pk, 128, true},
		{pk[:63] + "g", 64, false},
		{"", 0, true},
	}
	for _, tt := range tests {
		if got := nip34.IsLowerHex(tt.in, tt.n); got != tt.want {
			t.Errorf("IsLowerHex(%q, %d) = %v, want %v", tt.in, tt.n, got, tt.want)
		}
	}
	if !nip34.IsSignature(pk+pk) || nip34.IsSignature(pk) {
		t.Error("IsSignature accepts only 128 lower-case hex characters")
	}
}

func TestParseCoordinate(t *testing.T) {
	tests := []struct {
		in   string
		ok   bool
		want nip34.Coordinate
	}{
		{"30617:" + pk + ":repo", true, nip34.Coordinate{Kind: 30617, PubKey: pk, D: "repo"}},
		{"30617:" + pk + ":a:b", true, nip34.Coordinate{Kind: 30617, PubKey: pk, D: "a:b"}},
		{"10317:" + pk + ":", true, nip34.Coordinate{Kind: 10317, PubKey: pk}},
		{"10317:" + pk + ":x", false, nip34.Coordinate{}}, // replaceable kinds have no d
		{"1621:" + pk + ":", false, nip34.Coordinate{}},   // a regular kind has no coordinate
		{"30617:" + strings.ToUpper(pk) + ":repo", false, nip34.Coordinate{}},
		{"+30617:" + pk + ":repo", false, nip34.Coordinate{}},
		{"300000:" + pk + ":repo", false, nip34.Coordinate{}},
		{"30617:" + pk, false, nip34.Coordinate{}},
	}
	for _, tt := range tests {
		c, ok := nip34.ParseCoordinate(tt.in)
		if ok != tt.ok || c != tt.want {
			t.Errorf("ParseCoordinate(%q) = %+v, %v; want %+v, %v", tt.in, c, ok, tt.want, tt.ok)
		}
		if ok && c.String() != tt.in {
			t.Errorf("ParseCoordinate(%q).String() = %q", tt.in, c.String())
		}
	}
}

func TestCoordinateOfMatches(t *testing.T) {
	ann := &nostr.Event{Kind: nip34.KindRepoAnnouncement, PubKey: pk, Tags: nostr.Tags{{"d", "repo"}}}
	c, ok := nip34.CoordinateOf(ann)
	if !ok || c.String() != "30617:"+pk+":repo" || !c.Matches(ann) {
		t.Fatalf("CoordinateOf(announcement) = %+v, %v", c, ok)
	}
	other := &nostr.Event{Kind: nip34.KindRepoAnnouncement, PubKey: pk, Tags: nostr.Tags{{"d", "other"}}}
	if c.Matches(other) {
		t.Error("a coordinate matches another identifier's announcement")
	}
	list := &nostr.Event{Kind: nip34.KindUserGraspList, PubKey: pk, Tags: nostr.Tags{{"d", "ignored"}}}
	if c, ok := nip34.CoordinateOf(list); !ok || c.D != "" || !c.Matches(list) {
		t.Errorf("CoordinateOf(replaceable) = %+v, %v", c, ok)
	}
	if _, ok := nip34.CoordinateOf(&nostr.Event{Kind: nip34.KindIssue, PubKey: pk}); ok {
		t.Error("a regular event has no coordinate")
	}
}
