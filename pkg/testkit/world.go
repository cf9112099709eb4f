package testkit

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"math/rand/v2"
	"runtime"
	"sync"

	"github.com/nbd-wtf/go-nostr"
)

// WorldSpec is the shape of a generated NIP-34 world (issue 23): Repos
// repositories over Relays remote relays, each repository listing
// RelaysPerRepo of them, with RootsPerRepo roots (issues and patches,
// alternating) and CommentsPerRoot NIP-22 comments on each root, plus the
// repository's state event. Every event is stored on CopiesMin..CopiesMax
// of its repository's relays. The same spec and Seed give the same events
// (ids), whatever the machine.
type WorldSpec struct {
	Repos, Relays, RelaysPerRepo  int
	RootsPerRepo, CommentsPerRoot int
	CopiesMin, CopiesMax          int
	// Contributors is the size of the pool of keys that author roots and
	// comments (owners sign announcements and states).
	Contributors int
	Seed         uint64
}

// withDefaults fills the zero fields: 5 relays per repository, 2–3 copies,
// 100 contributors.
func (s WorldSpec) withDefaults() WorldSpec {
	if s.RelaysPerRepo <= 0 {
		s.RelaysPerRepo = 5
	}
	s.RelaysPerRepo = min(s.RelaysPerRepo, s.Relays)
	if s.CopiesMin <= 0 {
		s.CopiesMin = 2
	}
	if s.CopiesMax < s.CopiesMin {
		s.CopiesMax = max(s.CopiesMin, 3)
	}
	s.CopiesMin = min(s.CopiesMin, s.RelaysPerRepo)
	s.CopiesMax = min(s.CopiesMax, s.RelaysPerRepo)
	if s.Contributors <= 0 {
		s.Contributors = 100
	}
	return s
}

// EventsPerRepo is how many events each repository has on the remote
// relays: its announcement, its state, its roots and their comments.
func (s WorldSpec) EventsPerRepo() int {
	return 2 + s.RootsPerRepo*(1+s.CommentsPerRoot)
}

// String names the world: "1000x100 (50 roots + 1 comment)".
func (s WorldSpec) String() string {
	return fmt.Sprintf("%dx%d (%d roots + %d comments each)", s.Repos, s.Relays, s.RootsPerRepo, s.CommentsPerRoot)
}

// worldBase is the created_at the world's history ends at: fixed, so the
// same spec gives the same ids on any day. Events spread over the 89 days
// before it.
const worldBase = 1_790_000_000 // 2026-09-21

// WorldEvent is one event of a world and the relays (indexes) holding it.
type WorldEvent struct {
	Event  *nostr.Event
	Relays []int
}

// World is a generated world. Announcements are not in Events: they name
// the service's and the relays' URLs, known only once those run; sign them
// with Announcements.
type World struct {
	Spec WorldSpec
	// Owners, D and Repos are each repository's owner, d tag and address.
	Owners []Key
	D      []string
	Repos  []string
	// RepoRelays are the relay indexes each repository lists.
	RepoRelays [][]int
	// AnnAt is each announcement's created_at.
	AnnAt []nostr.Timestamp
	// Events are the states, roots and comments, repository by
	// repository.
	Events []WorldEvent
}

// worldKey derives a key from the seed and a name, so a world's keys are
// the same on every run.
func worldKey(seed uint64, name string) Key {
	for i := 0; ; i++ {
		h := sha256.Sum256(fmt.Appendf(nil, "grasp-sync world %d %s %d", seed, name, i))
		sk := hex.EncodeToString(h[:])
		if pk, err := nostr.GetPublicKey(sk); err == nil {
			return Key{Secret: sk, PubKey: pk}
		}
	}
}

// GenerateWorld signs a world, using every CPU (signing 100,000 events
// takes seconds).
func GenerateWorld(spec WorldSpec) *World {
	spec = spec.withDefaults()
	w := &World{Spec: spec}
	contributors := make([]Key, spec.Contributors)
	for i := range contributors {
		contributors[i] = worldKey(spec.Seed, fmt.Sprintf("contributor-%d", i))
	}
	per := make([][]WorldEvent, spec.Repos)
	w.Owners = make([]Key, spec.Repos)
	w.D = make([]string, spec.Repos)
	w.Repos = make([]string, spec.Repos)
	w.RepoRelays = make([][]int, spec.Repos)
	w.AnnAt = make([]nostr.Timestamp, spec.Repos)
	var wg sync.WaitGroup
	next := make(chan int)
	for range runtime.GOMAXPROCS(0) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for r := range next {
				per[r] = w.genRepo(r, contributors)
			}
		}()
	}
	for r := range spec.Repos {
		next <- r
	}
	close(next)
	wg.Wait()
	for _, evs := range per {
		w.Events = append(w.Events, evs...)
	}
	return w
}

// genRepo generates repository r's layout and events (announcement aside)
// from its own random stream, so workers can run in any order.
func (w *World) genRepo(r int, contributors []Key) []WorldEvent {
	s := w.Spec
	rng := rand.New(rand.NewPCG(s.Seed, uint64(r)))
	owner := worldKey(s.Seed, fmt.Sprintf("owner-%d", r))
	d := fmt.Sprintf("repo-%05d", r)
	w.Owners[r], w.D[r] = owner, d
	w.Repos[r] = RepoRef(owner.PubKey, d)
	w.RepoRelays[r] = rng.Perm(s.Relays)[:s.RelaysPerRepo]
	at := func() Option { return At(nostr.Timestamp(worldBase - rng.Int64N(89*24*3600))) }
	copies := func() []int {
		n := s.CopiesMin + rng.IntN(s.CopiesMax-s.CopiesMin+1)
		out := make([]int, 0, n)
		for _, j := range rng.Perm(len(w.RepoRelays[r]))[:n] {
			out = append(out, w.RepoRelays[r][j])
		}
		return out
	}
	w.AnnAt[r] = nostr.Timestamp(worldBase - rng.Int64N(89*24*3600))
	out := []WorldEvent{{Event: owner.State(d, map[string]string{"refs/heads/main": hexOf(rng)}, at()), Relays: copies()}}
	for i := range s.RootsPerRepo {
		who := contributors[rng.IntN(len(contributors))]
		var root *nostr.Event
		if i%2 == 0 {
			root = who.Issue(w.Repos[r], fmt.Sprintf("issue %d of %s", i, d), at())
		} else {
			root = who.patchWithCommit(w.Repos[r], hexOf(rng), at())
		}
		out = append(out, WorldEvent{Event: root, Relays: copies()})
		for c := range s.CommentsPerRoot {
			who := contributors[rng.IntN(len(contributors))]
			// A comment is never older than its root, as in real threads.
			ts := root.CreatedAt + nostr.Timestamp(rng.Int64N(3*24*3600))
			out = append(out, WorldEvent{Event: who.Comment(root, root, fmt.Sprintf("comment %d on %s", c, root.ID[:8]), At(ts)), Relays: copies()})
		}
	}
	return out
}

// hexOf is a 40-hex-digit id (a commit) from rng.
func hexOf(rng *rand.Rand) string {
	var b [20]byte
	for i := range b {
		b[i] = byte(rng.UintN(256))
	}
	return hex.EncodeToString(b[:])
}

// patchWithCommit is Patch with a given commit id, so a world's patches
// have the same ids on every run.
func (k Key) patchWithCommit(repoRef, commit string, opts ...Option) *nostr.Event {
	content := fmt.Sprintf("From %s Mon Sep 17 00:00:00 2001\nFrom: testkit <testkit@example.invalid>\nSubject: [PATCH] world change %s\n\n---\n README.md | 1 +\n\ndiff --git a/README.md b/README.md\n--- a/README.md\n+++ b/README.md\n@@ -1 +1,2 @@\n # test\n+change %s\n", commit, commit[:7], commit[:7])
	tags := repoTags(repoRef)
	tags = append(tags, nostr.Tag{"t", "root"}, nostr.Tag{"commit", commit})
	return k.build(KindPatch, content, tags, opts)
}

// Announcements signs every repository's announcement: listed relays are
// serviceURL and the repository's relays among relayURLs (by index), and
// the clone URL is the service's GRASP URL, so the service hosts each
// repository (GRASP-01) and syncs it from the relays.
func (w *World) Announcements(serviceURL string, relayURLs []string) []*nostr.Event {
	out := make([]*nostr.Event, len(w.Repos))
	var wg sync.WaitGroup
	next := make(chan int)
	for range runtime.GOMAXPROCS(0) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for r := range next {
				urls := []string{serviceURL}
				for _, i := range w.RepoRelays[r] {
					urls = append(urls, relayURLs[i])
				}
				out[r] = w.Owners[r].Announcement(w.D[r], []string{GraspCloneURL(serviceURL, w.Owners[r].PubKey, w.D[r])}, urls, nil, At(w.AnnAt[r]))
			}
		}()
	}
	for r := range w.Repos {
		next <- r
	}
	close(next)
	wg.Wait()
	return out
}
