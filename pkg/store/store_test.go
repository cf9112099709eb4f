package store_test

import (
	"context"
	"strings"
	"testing"

	"github.com/grasp-sync/grasp-sync/pkg/store"
	"github.com/nbd-wtf/go-nostr"
)

func signed(t *testing.T, sk string, kind int, ts nostr.Timestamp, tags nostr.Tags) *nostr.Event {
	t.Helper()
	evt := &nostr.Event{Kind: kind, CreatedAt: ts, Tags: tags}
	if err := evt.Sign(sk); err != nil {
		t.Fatal(err)
	}
	return evt
}

func TestSaveSemantics(t *testing.T) {
	ctx := context.Background()
	s, err := store.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	sk := nostr.GeneratePrivateKey()

	note := signed(t, sk, 1, 100, nil)
	if ok, err := s.Save(ctx, note); !ok || err != nil {
		t.Fatalf("first save = %v, %v", ok, err)
	}
	if ok, err := s.Save(ctx, note); ok || err != nil {
		t.Fatalf("duplicate save = %v, %v, want false, nil", ok, err)
	}

	d := nostr.Tags{{"d", "repo"}}
	v1 := signed(t, sk, 30617, 100, d)
	v2 := signed(t, sk, 30617, 200, d)
	if ok, _ := s.Save(ctx, v1); !ok {
		t.Fatal("v1 not stored")
	}
	if ok, _ := s.Save(ctx, v2); !ok {
		t.Fatal("v2 not stored")
	}
	if ok, _ := s.Save(ctx, v1); ok {
		t.Fatal("older version stored again")
	}
	got, err := s.Query(ctx, nostr.Filter{Kinds: []int{30617}})
	if err != nil || len(got) != 1 || got[0].ID != v2.ID {
		t.Fatalf("versions stored = %d (err %v), want only the newest", len(got), err)
	}
}

func TestOpenRefusesPostgresUntilSupported(t *testing.T) {
	if _, err := store.Open("postgres://user:secret@127.0.0.1/db"); err == nil {
		t.Fatal("postgres URL accepted")
	} else if strings.Contains(err.Error(), "secret") {
		t.Fatalf("error leaks the password: %v", err)
	}
}
