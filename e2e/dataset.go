package e2e

import (
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/nbd-wtf/go-nostr"

	"github.com/grasp-sync/grasp-sync/pkg/testkit"
)

// Dataset is a generated NIP-34 world spread over remote relays: every
// repository lists a few of the relays, and each of its events is stored on
// every relay it lists, so relays overlap the way real ones do.
type Dataset struct {
	// Announcements list the service (they go to our relay).
	Announcements []*nostr.Event
	// PerRelay[i] are the events to seed on relay i.
	PerRelay [][]*nostr.Event
	// Distinct is every distinct remote event, once.
	Distinct []*nostr.Event
	// RepoRelays[r] are the relay indexes repository r lists.
	RepoRelays [][]int
	// Owners and Repos are each repository's owner key and coordinate.
	Owners []testkit.Key
	Repos  []string
	// Roots are the issues and patches (layer 3 roots), per repository.
	Roots [][]*nostr.Event
}

// GenerateDataset signs a dataset of repos repositories with eventsPerRepo
// events each (half roots: issues and patches; half comments on them), each
// repository listing relaysPerRepo of nRelays relays. serviceURL is the URL
// the announcements list; relayURLs names the remote relays. seed makes the
// layout (not the keys) reproducible.
func GenerateDataset(serviceURL string, relayURLs []string, repos, eventsPerRepo, relaysPerRepo int, seed uint64) *Dataset {
	rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	n := len(relayURLs)
	ds := &Dataset{PerRelay: make([][]*nostr.Event, n)}
	contributors := make([]testkit.Key, 20)
	for i := range contributors {
		contributors[i] = testkit.NewKey()
	}
	base := time.Now().Add(-90 * 24 * time.Hour).Unix()
	for r := 0; r < repos; r++ {
		owner := testkit.NewKey()
		d := fmt.Sprintf("repo-%04d", r)
		perm := rng.Perm(n)[:relaysPerRepo]
		urls := []string{serviceURL}
		for _, i := range perm {
			urls = append(urls, relayURLs[i])
		}
		// Announcements are spread over the same 90 days as the events: a
		// relay holding more of them in one second than it returns for a
		// REQ cannot be read completely without NIP-77 (docs/decisions/0032-failed-batches-back-off.md), and signing them all now would
		// crowd a thousand into a second or two on a fast machine.
		ann := owner.Announcement(d, []string{testkit.GraspCloneURL(serviceURL, owner.PubKey, d)}, urls, nil,
			testkit.At(nostr.Timestamp(base+rng.Int64N(89*24*3600))))
		repo := testkit.RepoRef(owner.PubKey, d)
		ds.Announcements = append(ds.Announcements, ann)
		ds.Owners = append(ds.Owners, owner)
		ds.Repos = append(ds.Repos, repo)
		ds.RepoRelays = append(ds.RepoRelays, perm)
		var evts, roots []*nostr.Event
		for e := 0; e < eventsPerRepo; e++ {
			who := contributors[rng.IntN(len(contributors))]
			at := testkit.At(nostr.Timestamp(base + rng.Int64N(89*24*3600)))
			switch {
			case e%2 == 0 && e%4 == 0:
				roots = append(roots, who.Issue(repo, fmt.Sprintf("issue %d", e), at))
				evts = append(evts, roots[len(roots)-1])
			case e%2 == 0:
				roots = append(roots, who.Patch(repo, at))
				evts = append(evts, roots[len(roots)-1])
			default:
				root := roots[rng.IntN(len(roots))]
				evts = append(evts, who.Comment(root, root, fmt.Sprintf("comment %d", e), at))
			}
		}
		ds.Roots = append(ds.Roots, roots)
		ds.Distinct = append(ds.Distinct, evts...)
		for _, i := range perm {
			ds.PerRelay[i] = append(ds.PerRelay[i], evts...)
		}
	}
	return ds
}

// KindCounts counts evts per kind.
func KindCounts(evts []*nostr.Event) map[int]int {
	out := map[int]int{}
	for _, e := range evts {
		out[e.Kind]++
	}
	return out
}
