package store_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/grasp-sync/grasp-sync/pkg/store"
	"github.com/nbd-wtf/go-nostr"
)

// A kv directory keeps opening with the engine that wrote it, whatever the
// default for new directories is, and a URL naming the other engine is
// refused without touching the data: an operator's events are never lost
// or silently ignored (docs/decisions/0036-kv-on-pebble.md).
func TestKVOpensTheEngineTheDirectoryHolds(t *testing.T) {
	ctx := context.Background()
	sk := nostr.GeneratePrivateKey()
	for _, engine := range []string{"badger", "pebble"} {
		other := map[string]string{"badger": "pebble", "pebble": "badger"}[engine]
		t.Run(engine, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "events")
			s, err := store.Open("kv+" + engine + "://" + dir)
			if err != nil {
				t.Fatal(err)
			}
			evt := signed(t, sk, 1621, 1000, nostr.Tags{{"a", "30617:" + strings.Repeat("a", 64) + ":repo"}}, "an issue")
			if stored, err := s.Save(ctx, evt); err != nil || !stored {
				t.Fatalf("save: %v, %v", stored, err)
			}
			s.Close()

			if _, err := store.Open("kv+" + other + "://" + dir); err == nil || !strings.Contains(err.Error(), "holds a "+engine+" database") {
				t.Fatalf("opening a %s directory as kv+%s: %v; want a refusal naming %s", engine, other, err, engine)
			}
			for _, url := range []string{dir, "kv://" + dir, "kv+" + engine + "://" + dir} {
				s, err := store.Open(url)
				if err != nil {
					t.Fatalf("open %s: %v", url, err)
				}
				if s.Backend() != "kv+"+engine {
					t.Errorf("open %s: backend %s, want kv+%s", url, s.Backend(), engine)
				}
				got, err := s.Query(ctx, nostr.Filter{Tags: nostr.TagMap{"a": {evt.Tags[0][1]}}})
				s.Close()
				if err != nil || len(got) != 1 || got[0].ID != evt.ID {
					t.Fatalf("open %s: the stored event is %v (%v); want it found", url, got, err)
				}
			}
		})
	}
}

// A directory with both engines' files is refused rather than one of them
// ignored.
func TestKVRefusesTwoEnginesInOneDirectory(t *testing.T) {
	dir := t.TempDir()
	s, err := store.Open("kv+pebble://" + dir)
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
	// What badger leaves in a directory it opened.
	for _, name := range []string{"MANIFEST", "KEYREGISTRY"} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for _, url := range []string{dir, "kv+pebble://" + dir, "kv+badger://" + dir} {
		if s, err := store.Open(url); err == nil || !strings.Contains(err.Error(), "both") {
			if s != nil {
				s.Close()
			}
			t.Fatalf("open %s: %v; want a refusal", url, err)
		}
	}
}

// eventstore's badger layout opened as kv is still refused, as before, now
// after the directory was found to be badger's.
func TestKVRefusesEventstoreBadgerDirectory(t *testing.T) {
	dir := t.TempDir()
	s, err := store.Open("badger://" + dir)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Save(context.Background(), signed(t, nostr.GeneratePrivateKey(), 1, 1000, nil, "x")); err != nil {
		t.Fatal(err)
	}
	s.Close()
	for _, url := range []string{dir, "kv://" + dir, "kv+pebble://" + dir} {
		if s, err := store.Open(url); err == nil {
			s.Close()
			t.Fatalf("open %s: an eventstore badger directory opened as kv", url)
		}
	}
}
