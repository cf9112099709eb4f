package store_test

import (
	"context"
	"errors"
	"testing"

	"github.com/nbd-wtf/go-nostr"

	"github.com/grasp-sync/grasp-sync/pkg/nip34"
	"github.com/grasp-sync/grasp-sync/pkg/store"
)

// announcements records what SaveAccepted and Settle announce.
type announcements []string

func (a *announcements) announce(e *nostr.Event) { *a = append(*a, e.ID) }

// failingDeletes is a real store whose deletes fail while broken is set.
type failingDeletes struct {
	*store.Store
	broken bool
}

func (f *failingDeletes) Delete(ctx context.Context, evt *nostr.Event) error {
	if f.broken {
		return errors.New("disk on fire")
	}
	return f.Store.Delete(ctx, evt)
}

func has(t *testing.T, s *store.Store, id string) bool {
	t.Helper()
	ok, err := s.Has(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	return ok
}

func TestSaveAcceptedStoresOnceAndAnnounces(t *testing.T) {
	ctx := context.Background()
	s := embeddedCase("kv", false, true).open(t)
	sk := nostr.GeneratePrivateKey()
	note := signed(t, sk, 1, 100, nil, "hello")
	var got announcements
	for n, want := range []bool{true, false} {
		stored, err := store.SaveAccepted(ctx, s, note, got.announce)
		if err != nil || stored != want {
			t.Fatalf("save %d: stored = %v, err = %v; want %v, nil", n, stored, err, want)
		}
	}
	if len(got) != 1 || got[0] != note.ID {
		t.Fatalf("announced %v, want the note once", got)
	}
}

func TestSaveAcceptedAppliesDeletion(t *testing.T) {
	ctx := context.Background()
	s := embeddedCase("kv", false, true).open(t)
	sk, other := nostr.GeneratePrivateKey(), nostr.GeneratePrivateKey()
	pk, _ := nostr.GetPublicKey(sk)
	byID := signed(t, sk, 1, 100, nil, "mine")
	foreign := signed(t, other, 1, 100, nil, "not mine")
	oldAnn := signed(t, sk, nip34.KindRepoAnnouncement, 100, nostr.Tags{{"d", "repo"}}, "")
	otherRepo := signed(t, sk, nip34.KindRepoAnnouncement, 100, nostr.Tags{{"d", "other"}}, "")
	for _, e := range []*nostr.Event{byID, foreign, oldAnn, otherRepo} {
		mustSave(t, s, e, true)
	}
	coord := nip34.Coordinate{Kind: nip34.KindRepoAnnouncement, PubKey: pk, D: "repo"}.String()
	del := signed(t, sk, nip34.KindDeletion, 200, nostr.Tags{{"e", byID.ID}, {"e", foreign.ID}, {"a", coord}}, "")
	var got announcements
	stored, err := store.SaveAccepted(ctx, s, del, got.announce)
	if err != nil || !stored {
		t.Fatalf("save deletion: stored = %v, err = %v", stored, err)
	}
	if len(got) != 1 || got[0] != del.ID {
		t.Fatalf("announced %v, want the deletion", got)
	}
	for _, c := range []struct {
		name string
		evt  *nostr.Event
		want bool
	}{
		{"the deletion", del, true},
		{"its author's event named by id", byID, false},
		{"another author's event named by id", foreign, true},
		{"its author's announcement named by coordinate", oldAnn, false},
		{"an announcement of another identifier", otherRepo, true},
	} {
		if has(t, s, c.evt.ID) != c.want {
			t.Errorf("%s: stored = %v, want %v", c.name, !c.want, c.want)
		}
	}
	// A version created after the deletion is not deleted by it again.
	newAnn := signed(t, sk, nip34.KindRepoAnnouncement, 300, nostr.Tags{{"d", "repo"}}, "")
	mustSave(t, s, newAnn, true)
	if err := store.ApplyDeletion(ctx, s, del); err != nil {
		t.Fatal(err)
	}
	if !has(t, s, newAnn.ID) {
		t.Error("a newer version of a deleted coordinate was deleted")
	}
}

func TestSettleRetriesAFailedDeletion(t *testing.T) {
	ctx := context.Background()
	s := &failingDeletes{Store: embeddedCase("kv", false, true).open(t), broken: true}
	sk := nostr.GeneratePrivateKey()
	target := signed(t, sk, 1, 100, nil, "mine")
	mustSave(t, s.Store, target, true)
	del := signed(t, sk, nip34.KindDeletion, 200, nostr.Tags{{"e", target.ID}}, "")
	var got announcements
	stored, err := store.SaveAccepted(ctx, s, del, got.announce)
	if !stored || err == nil {
		t.Fatalf("save deletion with failing deletes: stored = %v, err = %v; want true and an error", stored, err)
	}
	if len(got) != 0 {
		t.Fatalf("a deletion not applied was announced: %v", got)
	}
	if !has(t, s.Store, target.ID) {
		t.Fatal("target gone although its delete failed")
	}
	// The retry (a redelivery) settles the stored deletion again.
	s.broken = false
	if err := store.Settle(ctx, s, del, got.announce); err != nil {
		t.Fatal(err)
	}
	if has(t, s.Store, target.ID) || len(got) != 1 {
		t.Fatalf("after the retry: target stored = %v, announced %v", has(t, s.Store, target.ID), got)
	}
}
