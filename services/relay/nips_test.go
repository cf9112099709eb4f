package relay

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nbd-wtf/go-nostr"

	"github.com/grasp-sync/grasp-sync/pkg/policy"
	"github.com/grasp-sync/grasp-sync/pkg/testkit"
)

// nipBehaviours holds, for each NIP the relay may advertise in NIP-11, a
// check of the behaviour that makes the claim true, run against a real
// relay over websockets.
var nipBehaviours = map[int]func(t *testing.T, s *server){
	// NIP-01: a valid event is stored and served by REQ; a forged one is
	// refused.
	1: func(t *testing.T, s *server) {
		c := dial(t, s.url)
		ann := served(testkit.NewKey(), "repo")
		if ok, msg := c.publish(ann); !ok {
			t.Fatalf("valid event refused: %s", msg)
		}
		if got := c.query(nostr.Filter{IDs: []string{ann.ID}}); len(got) != 1 || got[0].ID != ann.ID {
			t.Fatalf("REQ by id returned %d events", len(got))
		}
		forged := served(testkit.NewKey(), "other")
		forged.Content += " (changed after signing)"
		if ok, msg := c.publish(forged); ok || !strings.HasPrefix(msg, "invalid: ") {
			t.Fatalf("forged event: %v %q, want refused as invalid", ok, msg)
		}
	},
	// NIP-09: an author's deletion request removes the event.
	9: func(t *testing.T, s *server) {
		c := dial(t, s.url)
		alice, bob := testkit.NewKey(), testkit.NewKey()
		issue := bob.Issue(testkit.RepoRef(alice.PubKey, "repo"), "bug")
		for _, e := range []*nostr.Event{served(alice, "repo"), issue, bob.Deletion([]*nostr.Event{issue})} {
			if ok, msg := c.publish(e); !ok {
				t.Fatalf("kind %d refused: %s", e.Kind, msg)
			}
		}
		if got := c.query(nostr.Filter{IDs: []string{issue.ID}}); len(got) != 0 {
			t.Fatal("deleted event still served")
		}
	},
	// NIP-11: the information document, on the relay's URL.
	11: func(t *testing.T, s *server) {
		req, _ := http.NewRequest(http.MethodGet, s.http, nil)
		req.Header.Set("Accept", "application/nostr+json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var doc struct {
			SupportedNIPs []int `json:"supported_nips"`
		}
		if err := json.NewDecoder(resp.Body).Decode(&doc); err != nil {
			t.Fatal(err)
		}
		if resp.Header.Get("Content-Type") != "application/nostr+json" || !slices.Equal(doc.SupportedNIPs, advertised(t)) {
			t.Fatalf("document %s %+v", resp.Header.Get("Content-Type"), doc)
		}
	},
	// NIP-34: repository announcements that list this service are kept,
	// with the events about them; others are refused (GRASP).
	34: func(t *testing.T, s *server) {
		c := dial(t, s.url)
		alice := testkit.NewKey()
		issue := alice.Issue(testkit.RepoRef(alice.PubKey, "repo"), "bug")
		for _, e := range []*nostr.Event{served(alice, "repo"), issue} {
			if ok, msg := c.publish(e); !ok {
				t.Fatalf("kind %d refused: %s", e.Kind, msg)
			}
		}
		if got := c.query(nostr.Filter{Kinds: []int{1621}, Tags: nostr.TagMap{"a": {testkit.RepoRef(alice.PubKey, "repo")}}}); len(got) != 1 {
			t.Fatalf("issues of the repository: %d, want 1", len(got))
		}
		elsewhere := announce(testkit.NewKey(), "repo", "https://github.com/someone/repo.git", "wss://relay.damus.io")
		if ok, msg := c.publish(elsewhere); ok || !strings.HasPrefix(msg, "blocked: ") {
			t.Fatalf("announcement not listing us: %v %q, want blocked", ok, msg)
		}
	},
	// NIP-77: negentropy reconciliation answers NEG-OPEN with NEG-MSG.
	77: func(t *testing.T, s *server) {
		c := dial(t, s.url)
		if ok, msg := c.publish(served(testkit.NewKey(), "repo")); !ok {
			t.Fatal(msg)
		}
		c.write([]any{"NEG-OPEN", "n1", nostr.Filter{Kinds: []int{30617}}, "6100000200"})
		_, raw := c.next(func(_ nostr.Envelope, raw string) bool {
			return strings.HasPrefix(raw, `["NEG-`) && strings.Contains(raw, `"n1"`)
		})
		if !strings.HasPrefix(raw, `["NEG-MSG","n1",`) {
			t.Fatalf("NEG-OPEN answered %s", raw)
		}
	},
}

// advertised is SupportedNIPs as numbers.
func advertised(t *testing.T) []int {
	t.Helper()
	nips := make([]int, 0, len(SupportedNIPs))
	for _, n := range SupportedNIPs {
		i, ok := n.(int)
		if !ok {
			t.Fatalf("supported_nips entry %v (%T) is not a number", n, n)
		}
		nips = append(nips, i)
	}
	return nips
}

// nipsDecision is the decision record whose table lists what NIP-11
// advertises, and why.
const nipsDecision = "../../docs/decisions/0024-nip11-advertises-what-is-served.md"

// documentedNIPs reads the NIPs decision 0024 says the relay advertises:
// the "| NIP-NN |" rows of the table under its NIP-11 heading.
func documentedNIPs(t *testing.T) []int {
	t.Helper()
	f, err := os.Open(nipsDecision)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var nips []int
	in := false
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "#") {
			in = strings.Contains(line, "NIP-11")
			continue
		}
		if !in || !strings.HasPrefix(line, "| NIP-") {
			continue
		}
		n, err := strconv.Atoi(strings.TrimSpace(strings.SplitN(strings.TrimPrefix(line, "| NIP-"), "|", 2)[0]))
		if err != nil {
			t.Fatalf("%s: bad row %q", nipsDecision, line)
		}
		nips = append(nips, n)
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return nips
}

// NIP-11 advertises only what the relay serves: every NIP in
// supported_nips has its reason in decision 0024 and a behaviour shown
// here.
func TestAdvertisedNIPsAreServed(t *testing.T) {
	nips := advertised(t)
	if doc := documentedNIPs(t); !slices.Equal(doc, nips) {
		t.Errorf("supported_nips %v, %s lists %v: the two must agree", nips, nipsDecision, doc)
	}
	for _, n := range nips {
		check, ok := nipBehaviours[n]
		if !ok {
			t.Errorf("supported_nips lists NIP-%02d, but no test shows the relay serves it", n)
			continue
		}
		t.Run(fmt.Sprintf("NIP-%02d", n), func(t *testing.T) {
			check(t, startServer(t, serverOpts{}))
		})
	}
}

func TestNIP11(t *testing.T) {
	pk := strings.Repeat("ab", 32)
	s := startServer(t, serverOpts{cfg: Config{Name: "my grasp", Description: "desc", PubKey: pk}})
	req, _ := http.NewRequest(http.MethodGet, s.http, nil)
	req.Header.Set("Accept", "application/nostr+json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var doc struct {
		Name            string   `json:"name"`
		Description     string   `json:"description"`
		PubKey          string   `json:"pubkey"`
		SupportedNIPs   []int    `json:"supported_nips"`
		SupportedGrasps []string `json:"supported_grasps"`
		Limitation      struct {
			MaxLimit int `json:"max_limit"`
		} `json:"limitation"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&doc); err != nil {
		t.Fatal(err)
	}
	if doc.Name != "my grasp" || doc.Description != "desc" || doc.PubKey != pk {
		t.Fatalf("document %+v", doc)
	}
	for _, n := range []int{1, 9, 11, 34, 77} {
		if !slices.Contains(doc.SupportedNIPs, n) {
			t.Errorf("supported_nips %v lacks %d", doc.SupportedNIPs, n)
		}
	}
	if !slices.Equal(doc.SupportedGrasps, []string{"GRASP-01", "GRASP-02"}) {
		t.Errorf("supported_grasps = %v", doc.SupportedGrasps)
	}
	if doc.Limitation.MaxLimit != 500 {
		t.Errorf("max_limit = %d", doc.Limitation.MaxLimit)
	}
	if ct := resp.Header.Get("Content-Type"); ct != "application/nostr+json" {
		t.Errorf("content type %q", ct)
	}
}

func TestInfoDocument(t *testing.T) {
	r := &Relay{cfg: Config{MaxMessageBytes: 1000, MaxSubscriptions: 3, MaxLimit: 50, Limits: policy.Limits{MaxTags: 9, MaxEventBytes: 900}}}
	r.khatru = newRelay(Config{Addr: "127.0.0.1:1", Name: "n", Description: "d", PubKey: strings.Repeat("ab", 32)}, nil, nil, discard(), time.Now).khatru
	b, _ := json.Marshal(r.Info())
	var doc map[string]any
	_ = json.Unmarshal(b, &doc)
	if doc["name"] != "n" || doc["pubkey"] != strings.Repeat("ab", 32) {
		t.Fatalf("info %s", b)
	}
	lim := doc["limitation"].(map[string]any)
	if lim["max_subscriptions"] != 3.0 || lim["max_limit"] != 50.0 || lim["max_message_length"] != 1000.0 {
		t.Fatalf("limitation %v", lim)
	}
}
