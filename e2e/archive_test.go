package e2e

import (
	"context"
	"encoding/json"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nbd-wtf/go-nostr"
	"github.com/nbd-wtf/go-nostr/nip19"

	"github.com/grasp-sync/grasp-sync/pkg/bus"
	"github.com/grasp-sync/grasp-sync/pkg/syncstatus"
	"github.com/grasp-sync/grasp-sync/pkg/testkit"
	"github.com/grasp-sync/grasp-sync/pkg/testkit/testrelay"
)

// archivedRepo is a repository whose announcement does not list us, published
// only to a bootstrap relay, with its content on the repository's own relay.
type archivedRepo struct {
	ann     *nostr.Event
	content []*nostr.Event // state, patch, issue, comment, status: its history
	issue   *nostr.Event
}

// publishArchivedRepo puts k's announcement of d (listing only own as its
// relay and a non-GRASP clone URL) on boot, and its history on own.
func publishArchivedRepo(t *testing.T, k, contributor testkit.Key, d string, boot, own *testrelay.Relay) archivedRepo {
	t.Helper()
	ann := k.Announcement(d, []string{"https://git.example.org/" + k.PubKey + "/" + d + ".git"}, []string{own.URL}, nil)
	ref := testkit.RepoRef(k.PubKey, d)
	state := k.State(d, map[string]string{"refs/heads/main": testkit.FakeCommit()})
	patch := contributor.Patch(ref)
	issue := contributor.Issue(ref, "bug in "+d)
	comment := k.Comment(issue, issue, "looking")
	status := k.Status(1632, issue)
	boot.Add(t, ann)
	own.Add(t, state, patch, issue, comment, status)
	return archivedRepo{ann: ann, content: []*nostr.Event{state, patch, issue, comment, status}, issue: issue}
}

func (r archivedRepo) all() []*nostr.Event { return append([]*nostr.Event{r.ann}, r.content...) }

func npubOf(t *testing.T, k testkit.Key) string {
	t.Helper()
	n, err := nip19.EncodePublicKey(k.PubKey)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// TestArchiveWhitelistedMaintainer is issue 34's main scenario: a
// whitelisted maintainer's repository that does not list us, announced only
// on a bootstrap relay, is synced completely — history, then live — while
// another pubkey's repository with the same layout is not; a client cannot
// write about the archived repository through our relay; NIP-11 says
// GRASP-05; the metrics count it.
func TestArchiveWhitelistedMaintainer(t *testing.T) {
	boot := testrelay.Start(t, testrelay.Options{Negentropy: true})
	own := testrelay.Start(t, testrelay.Options{})
	bob, mallory, contributor := testkit.NewKey(), testkit.NewKey(), testkit.NewKey()
	app := start(t, Env{"GRASP_BOOTSTRAP_RELAYS": boot.URL, "GRASP_ARCHIVE_WHITELIST": npubOf(t, bob), "GRASP_NATS_LISTEN": "127.0.0.1:0"})

	archived := publishArchivedRepo(t, bob, contributor, "tool", boot, own)
	other := publishArchivedRepo(t, mallory, contributor, "tool2", boot, own)

	mustArrive(t, app, 30*time.Second, archived.all()...)
	waitConnected(t, app, own.URL, true)
	// Live: new events on the repository's own relay arrive.
	liveIssue := contributor.Issue(testkit.RepoRef(bob.PubKey, "tool"), "live one")
	liveComment := bob.Comment(liveIssue, liveIssue, "on it")
	mustPublish(t, own, liveIssue, liveComment)
	mustArrive(t, app, 20*time.Second, liveIssue, liveComment)
	mustNotArrive(t, app, 2*time.Second, other.all()...)

	// Read-only: a client's comment on the archived issue, a state by bob
	// and a new version of bob's announcement are refused with the reason.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := testrelay.Dial(ctx, app.RelayURL())
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = c.Close() }()
	newer := bob.Announcement("tool", []string{"https://git.example.org/x.git"}, []string{own.URL}, nil, testkit.At(archived.ann.CreatedAt+1))
	for _, evt := range []*nostr.Event{
		contributor.Comment(archived.issue, archived.issue, "written to the archive"),
		bob.State("tool", map[string]string{"refs/heads/main": testkit.FakeCommit()}, testkit.At(nostr.Now()+1)),
		newer,
	} {
		ok, reason, err := c.Send(ctx, evt)
		if err != nil {
			t.Fatal(err)
		}
		if ok || !strings.HasPrefix(reason, "blocked:") || !strings.Contains(reason, "archived") || !strings.Contains(reason, testkit.RepoRef(bob.PubKey, "tool")) {
			t.Fatalf("client write of kind %d about the archive: ok=%v %q, want a blocked: refusal naming the archived repository", evt.Kind, ok, reason)
		}
	}
	// A repository that lists us is still writable.
	hosted := ourAnnouncement(contributor, app, "mine", nil, nil)
	announce(t, app, hosted, contributor.Issue(testkit.RepoRef(contributor.PubKey, "mine"), "fine"))

	doc := nip11(t, app)
	if !slices.Contains(doc.SupportedGrasps, "GRASP-05") || !strings.Contains(doc.Curation, "GRASP-05") {
		t.Fatalf("NIP-11 supported_grasps %v curation %q, want GRASP-05", doc.SupportedGrasps, doc.Curation)
	}
	waitMetric(t, app, "grasp_discovery_archived_repos", 1)
	// graspctl repos reads the index through syncstatus: bob's repository
	// is marked archived, the hosted one is not.
	b, err := bus.Connect(ctx, app.(Graspd).NATSURL(), "e2e-repos", bus.Names{Prefix: "grasp"}, bus.Security{})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		snap, err := syncstatus.Read(ctx, b.JS, b.Names)
		if err != nil {
			t.Fatal(err)
		}
		modes := map[string]bool{}
		for _, r := range snap.Repos {
			modes[r.Ref] = r.Archived
		}
		bobs, bobIn := modes[testkit.RepoRef(bob.PubKey, "tool")]
		mine, mineIn := modes[testkit.RepoRef(contributor.PubKey, "mine")]
		if bobIn && bobs && mineIn && !mine {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("index: bob's repository archived=%v (present %v), the hosted one archived=%v (present %v); want true and false", bobs, bobIn, mine, mineIn)
		}
	}
	m, err := Metrics(ctx, app)
	if err != nil {
		t.Fatal(err)
	}
	if n := MetricSum(m, "grasp_relay_refused_total", `reason="archive-read-only"`); n != 3 {
		t.Fatalf("archive-read-only refusals = %v, want 3", n)
	}
}

// TestArchiveForms: an npub/identifier entry archives that repository only,
// an identifier entry that identifier from any author.
func TestArchiveForms(t *testing.T) {
	for _, tc := range []struct {
		name      string
		whitelist func(bob testkit.Key) string
		synced    []string // of bob:tool, bob:lib, mallory:tool, mallory:lib
	}{
		{"npub/identifier", func(bob testkit.Key) string { return npubOf(t, bob) + "/tool" }, []string{"bob:tool"}},
		{"identifier", func(testkit.Key) string { return "tool" }, []string{"bob:tool", "mallory:tool"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			boot := testrelay.Start(t, testrelay.Options{Negentropy: true})
			own := testrelay.Start(t, testrelay.Options{})
			bob, mallory, contributor := testkit.NewKey(), testkit.NewKey(), testkit.NewKey()
			app := start(t, Env{"GRASP_BOOTSTRAP_RELAYS": boot.URL, "GRASP_ARCHIVE_WHITELIST": tc.whitelist(bob)})
			repos := map[string]archivedRepo{}
			for _, who := range []struct {
				name string
				k    testkit.Key
			}{{"bob", bob}, {"mallory", mallory}} {
				for _, d := range []string{"tool", "lib"} {
					repos[who.name+":"+d] = publishArchivedRepo(t, who.k, contributor, d, boot, own)
				}
			}
			var want, unwanted []*nostr.Event
			for name, r := range repos {
				if slices.Contains(tc.synced, name) {
					want = append(want, r.all()...)
				} else {
					unwanted = append(unwanted, r.all()...)
				}
			}
			mustArrive(t, app, 30*time.Second, want...)
			mustNotArrive(t, app, 2*time.Second, unwanted...)
		})
	}
}

// TestArchiveAllBounded: GRASP_ARCHIVE_ALL archives every announcement
// found, but at most GRASP_ARCHIVE_MAX_REPOS of them are synced; what is left
// out is counted.
func TestArchiveAllBounded(t *testing.T) {
	boot := testrelay.Start(t, testrelay.Options{Negentropy: true})
	own := testrelay.Start(t, testrelay.Options{})
	contributor := testkit.NewKey()
	app := start(t, Env{"GRASP_BOOTSTRAP_RELAYS": boot.URL, "GRASP_ARCHIVE_ALL": "true", "GRASP_ARCHIVE_MAX_REPOS": "2"})
	var repos []archivedRepo
	for _, d := range []string{"a", "b", "c"} {
		repos = append(repos, publishArchivedRepo(t, testkit.NewKey(), contributor, d, boot, own))
	}
	// Every announcement is stored (accepted by the policy); two
	// repositories are synced and the third waits.
	var anns []*nostr.Event
	for _, r := range repos {
		anns = append(anns, r.ann)
	}
	mustArrive(t, app, 30*time.Second, anns...)
	waitMetric(t, app, "grasp_discovery_archive_over_limit", 1)
	waitMetric(t, app, "grasp_discovery_archived_repos", 2)
	deadline := time.Now().Add(30 * time.Second)
	for {
		synced, left := 0, 0
		for _, r := range repos {
			n, err := CountStored(context.Background(), app, IDs(r.content...))
			if err != nil {
				t.Fatal(err)
			}
			switch n {
			case len(r.content):
				synced++
			case 0:
				left++
			}
		}
		if synced == 2 && left == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d repositories synced and %d untouched, want 2 and 1", synced, left)
		}
		time.Sleep(200 * time.Millisecond)
	}
	time.Sleep(2 * time.Second)
	for _, r := range repos {
		if n, _ := CountStored(context.Background(), app, IDs(r.content...)); n != 0 && n != len(r.content) {
			t.Fatalf("a repository synced in part: %d of %d", n, len(r.content))
		}
	}
	m, err := Metrics(context.Background(), app)
	if err != nil {
		t.Fatal(err)
	}
	if n := MetricSum(m, "grasp_discovery_archive_over_limit_total"); n < 1 {
		t.Fatalf("grasp_discovery_archive_over_limit_total = %v", n)
	}
}

type nip11Doc struct {
	SupportedGrasps []string `json:"supported_grasps"`
	Curation        string   `json:"curation"`
}

func nip11(t *testing.T, app Target) nip11Doc {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, "http"+strings.TrimPrefix(app.RelayURL(), "ws"), nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Accept", "application/nostr+json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var doc nip11Doc
	if err := json.NewDecoder(resp.Body).Decode(&doc); err != nil {
		t.Fatal(err)
	}
	return doc
}

// waitMetric waits until the sum of metric name is want.
func waitMetric(t *testing.T, app Target, name string, want float64) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		m, err := Metrics(context.Background(), app)
		if err == nil && MetricSum(m, name) == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s = %v (err %v), want %v", name, MetricSum(m, name), err, want)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestArchiveWhitelistAddedLater: an announcement refused (and remembered
// as refused) before its author was whitelisted is synced after the
// operator adds the npub and restarts: the remembered refusal is forgotten
// at start, so the restart's NIP-77 catch-up of layer 1 fetches it again.
func TestArchiveWhitelistAddedLater(t *testing.T) {
	boot := testrelay.Start(t, testrelay.Options{Negentropy: true})
	own := testrelay.Start(t, testrelay.Options{})
	bob, contributor := testkit.NewKey(), testkit.NewKey()
	repo := publishArchivedRepo(t, bob, contributor, "tool", boot, own)
	env := BaseEnv(t.TempDir())
	env["GRASP_BOOTSTRAP_RELAYS"] = boot.URL
	app, stop := StartGraspd(t, env, nil, "")
	metricAtLeast(t, app, 20*time.Second, 1, "grasp_ingester_refused_total", `reason="not-maintainer"`)
	mustNotArrive(t, app, 0, repo.ann)
	stop()

	env["GRASP_ARCHIVE_WHITELIST"] = npubOf(t, bob)
	app, _ = StartGraspd(t, env, nil, "")
	mustArrive(t, app, 30*time.Second, repo.all()...)
}

// TestArchiveFoundThroughRelayList: a whitelisted maintainer's announcement
// that is on no bootstrap relay but on a relay their relay list (10002, on a
// bootstrap relay) names is found there and its repository synced; so is
// one on a GRASP server their grasp list (10317) names.
func TestArchiveFoundThroughRelayList(t *testing.T) {
	boot := testrelay.Start(t, testrelay.Options{Negentropy: true})
	outbox := testrelay.Start(t, testrelay.Options{})
	grasp := testrelay.Start(t, testrelay.Options{Negentropy: true})
	own := testrelay.Start(t, testrelay.Options{})
	bob, carol, contributor := testkit.NewKey(), testkit.NewKey(), testkit.NewKey()
	boot.Add(t,
		bob.Sign(&nostr.Event{Kind: 10002, Tags: nostr.Tags{{"r", outbox.URL, "write"}}}),
		carol.GraspList([]string{grasp.URL}))
	app := start(t, Env{"GRASP_BOOTSTRAP_RELAYS": boot.URL, "GRASP_ARCHIVE_WHITELIST": npubOf(t, bob) + "," + npubOf(t, carol)})
	viaOutbox := publishArchivedRepo(t, bob, contributor, "tool", outbox, own)
	viaGrasp := publishArchivedRepo(t, carol, contributor, "lib", grasp, own)
	mustArrive(t, app, 30*time.Second, append(viaOutbox.all(), viaGrasp.all()...)...)
}
