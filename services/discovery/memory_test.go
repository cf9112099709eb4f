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
