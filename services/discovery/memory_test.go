package discovery

import (
	"fmt"
	"runtime"
	"testing"

	"github.com/nbd-wtf/go-nostr"

	"github.com/grasp-sync/grasp-sync/pkg/nip34"
	"github.com/grasp-sync/grasp-sync/pkg/testkit"
)

// heapInUse is the live heap after two collections.
func heapInUse() uint64 {
	var m runtime.MemStats
	runtime.GC()
	runtime.GC()
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

// TestIndexBytesPerRoot bounds what the index keeps per root event: at
// design scale (50 roots × 1,000 repositories) discovery holds every root
// for as long as it runs (docs/measurements/2026-12-04-design-scale-memory.md). The events are decoded from JSON, as the store hands
// them over, so no string is shared between events; they are dropped once
// applied.
func TestIndexBytesPerRoot(t *testing.T) {
	const repos, perRepo = 100, 50
	owner := testkit.NewKey()
	x := newIndex()
	var refs []nip34.RepoRef
	for r := range repos {
		id := fmt.Sprintf("repo-%d", r)
		refs = append(refs, nip34.RepoRef{PubKey: owner.PubKey, Identifier: id})
		x.Apply(owner.Announcement(id, []string{testkit.GraspCloneURL(service, owner.PubKey, id)}, []string{service, "wss://a.example"}, nil, testkit.At(100)))
	}
	before := heapInUse()
	for _, ref := range refs {
		for i := range perRepo {
			b, err := owner.Issue(ref.String(), fmt.Sprintf("issue %d", i)).MarshalJSON()
			if err != nil {
				t.Fatal(err)
			}
			var e nostr.Event
			if err := e.UnmarshalJSON(b); err != nil {
				t.Fatal(err)
			}
			x.Apply(&e)
		}
	}
	after := heapInUse()
	per := float64(after-before) / float64(repos*perRepo)
	t.Logf("%.0f bytes per root (%d roots)", per, repos*perRepo)
	if st := x.Stats(); st.RootEvents != repos*perRepo {
		t.Fatalf("%d roots indexed, want %d", st.RootEvents, repos*perRepo)
	}
	if per > 200 {
		t.Errorf("%.0f bytes per root indexed, want at most 200", per)
	}
	runtime.KeepAlive(x)
}

// TestIndexBytesPerAnnouncement bounds what the index keeps per
// announcement: it keeps the newest of every repository for as long as it
// runs, 10,000 of them at the upper design scale, and keeps only what it
// reads again (slimAnnouncement), not the decoded event's description,
// clone and web URLs, relays and signature.
func TestIndexBytesPerAnnouncement(t *testing.T) {
	const repos = 2000
	owner := testkit.NewKey()
	maintainer := testkit.NewKey()
	raw := make([][]byte, 0, repos)
	for r := range repos {
		id := fmt.Sprintf("repo-%d", r)
		a := owner.Announcement(id, []string{testkit.GraspCloneURL(service, owner.PubKey, id), "https://git.example/" + id},
			[]string{service, "wss://a.example", "wss://b.example", "wss://c.example", "wss://d.example"}, []string{maintainer.PubKey}, testkit.At(100))
		a.Tags = append(a.Tags, nostr.Tag{"description", fmt.Sprintf("repository %d: a description of the kind people write, a sentence or two long", r)},
			nostr.Tag{"web", "https://git.example/" + id})
		b, err := a.MarshalJSON()
		if err != nil {
			t.Fatal(err)
		}
		raw = append(raw, b)
	}
	x := newIndex()
	before := heapInUse()
	for _, b := range raw {
		var e nostr.Event // decoded as the store hands it over: no string shared
		if err := e.UnmarshalJSON(b); err != nil {
			t.Fatal(err)
		}
		x.Apply(&e)
	}
	after := heapInUse()
	per := float64(after-before) / repos
	t.Logf("%.0f bytes per announcement (%d repositories)", per, repos)
	if st := x.Stats(); st.Repos != repos {
		t.Fatalf("%d repositories indexed, want %d", st.Repos, repos)
	}
	if e := x.Entry(nip34.RepoRef{PubKey: owner.PubKey, Identifier: "repo-7"}); e == nil || len(e.Maintainers) != 1 || e.Maintainers[0] != maintainer.PubKey || len(e.Relays) != 3 { // newIndex: 3 relays per announcement
		t.Fatalf("entry of repo-7: %v", e)
	}
	if per > 900 { // 1,821 when the index kept the decoded event
		t.Errorf("%.0f bytes per announcement indexed, want at most 900", per)
	}
	runtime.KeepAlive(x)
}
