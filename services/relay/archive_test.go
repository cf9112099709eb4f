package relay

import (
	"strings"
	"testing"

	"github.com/nbd-wtf/go-nostr"
	"github.com/nbd-wtf/go-nostr/nip19"

	"github.com/grasp-sync/grasp-sync/pkg/policy"
	"github.com/grasp-sync/grasp-sync/pkg/testkit"
)

// archiveConfig archives every repository of bob.
func archiveConfig(t *testing.T, bob testkit.Key, readOnly bool) Config {
	t.Helper()
	n, err := nip19.EncodePublicKey(bob.PubKey)
	if err != nil {
		t.Fatal(err)
	}
	w, err := policy.ParseArchiveWhitelist(n)
	if err != nil {
		t.Fatal(err)
	}
	return Config{Archive: policy.Archive{Whitelist: w}, ArchiveReadOnly: readOnly}
}

// TestArchiveReadOnly: with GRASP_ARCHIVE_READ_ONLY a client cannot write
// about an archived repository (its events come through sync only), and
// can about a hosted one; with it off, it can write about both. The store
// is filled directly, as the ingester would.
func TestArchiveReadOnly(t *testing.T) {
	alice, bob, carol := testkit.NewKey(), testkit.NewKey(), testkit.NewKey()
	archived := announce(bob, "tool", "https://github.com/bob/tool.git", "wss://bob.example")
	issue := carol.Issue(testkit.RepoRef(bob.PubKey, "tool"), "synced issue")
	for _, readOnly := range []bool{true, false} {
		s := startServer(t, serverOpts{cfg: archiveConfig(t, bob, readOnly)})
		for _, e := range []*nostr.Event{archived, issue} {
			if _, err := s.store.Save(t.Context(), e); err != nil {
				t.Fatal(err)
			}
		}
		c := dial(t, s.url)
		if ok, msg := c.publish(served(alice, "repo")); !ok {
			t.Fatalf("hosted announcement refused: %s", msg)
		}
		for _, evt := range []*nostr.Event{
			carol.Comment(issue, issue, "through the archive"),
			carol.Issue(testkit.RepoRef(bob.PubKey, "tool"), "new issue"),
			bob.State("tool", map[string]string{"refs/heads/main": testkit.FakeCommit()}),
			announce(bob, "other", "https://github.com/bob/other.git", "wss://bob.example"),
		} {
			ok, msg := c.publish(evt)
			if readOnly && (ok || !strings.HasPrefix(msg, "blocked: ") || !strings.Contains(msg, "archived")) {
				t.Fatalf("read-only: kind %d ok=%v %q, want an archive refusal", evt.Kind, ok, msg)
			}
			if !readOnly && !ok {
				t.Fatalf("writable archive: kind %d refused: %s", evt.Kind, msg)
			}
		}
		if ok, msg := c.publish(carol.Issue(testkit.RepoRef(alice.PubKey, "repo"), "hosted")); !ok {
			t.Fatalf("issue on a hosted repository refused: %s", msg)
		}
		if ok, msg := c.publish(bob.Deletion([]*nostr.Event{archived})); !ok {
			t.Fatalf("the maintainer's own deletion refused: %s", msg)
		}
	}
}

// TestNIP11Archive: NIP-11 lists GRASP-05 and says what is mirrored only
// when something is archived.
func TestNIP11Archive(t *testing.T) {
	bob := testkit.NewKey()
	s := startServer(t, serverOpts{cfg: archiveConfig(t, bob, true)})
	doc := s.relay.Info()
	if !strings.Contains(strings.Join(doc.SupportedGrasps, ","), "GRASP-05") || !strings.Contains(doc.Curation, "1 maintainer") ||
		!strings.Contains(doc.Curation, "read-only") {
		t.Fatalf("supported_grasps %v curation %q", doc.SupportedGrasps, doc.Curation)
	}
	plain := startServer(t, serverOpts{})
	if d := plain.relay.Info(); strings.Contains(strings.Join(d.SupportedGrasps, ","), "GRASP-05") || d.Curation != "" {
		t.Fatalf("without archive: %v %q", d.SupportedGrasps, d.Curation)
	}
	if strings.Join(SupportedGrasps, ",") != "GRASP-01,GRASP-02" {
		t.Fatalf("SupportedGrasps changed: %v", SupportedGrasps)
	}
}
