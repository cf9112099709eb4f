package relay

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	graspv1 "github.com/grasp-sync/grasp-sync/proto/grasp/v1"

	"github.com/grasp-sync/grasp-sync/pkg/bus"
	"github.com/grasp-sync/grasp-sync/pkg/testkit/natstest"
)

func TestWantsStatusPage(t *testing.T) {
	for _, tc := range []struct {
		method, path, accept string
		want                 bool
	}{
		{"GET", "/", "text/html,application/xhtml+xml,*/*;q=0.8", true},
		{"HEAD", "/", "text/html", true},
		{"GET", "/", "application/nostr+json", false},
		{"GET", "/", "application/nostr+json, text/html", false},
		{"GET", "/", "*/*", false},
		{"GET", "/other", "text/html", false},
		{"POST", "/", "text/html", false},
	} {
		req, _ := http.NewRequest(tc.method, "http://x"+tc.path, nil)
		req.Header.Set("Accept", tc.accept)
		if got := wantsStatusPage(req); got != tc.want {
			t.Errorf("%s %s Accept %q: %v, want %v", tc.method, tc.path, tc.accept, got, tc.want)
		}
	}
}

func fetchPage(t *testing.T, url, accept string) (string, string) {
	t.Helper()
	req, _ := http.NewRequest("GET", url, nil)
	req.Header.Set("Accept", accept)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.Header.Get("Content-Type"), string(body)
}

// The page renders the planner's relay records and the RepoSyncIndex from
// NATS KV, escapes what it shows, and NIP-11 stays JSON.
func TestStatusPage(t *testing.T) {
	ctx := context.Background()
	n := natstest.Start(t)
	b, err := bus.Connect(ctx, n.URL, "status-test", bus.DefaultNames(), bus.Security{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.Close)
	if err := bus.Setup(ctx, b.JS, b.Names, bus.DefaultOptions()); err != nil {
		t.Fatal(err)
	}
	put := func(bucket, key string, m proto.Message) {
		kv, err := b.JS.KeyValue(ctx, bucket)
		if err != nil {
			t.Fatal(err)
		}
		data, _ := proto.Marshal(m)
		if _, err := kv.Put(ctx, key, data); err != nil {
			t.Fatal(err)
		}
	}
	put(b.Names.RelayStateBucket(), "relay.a", &graspv1.RelayState{RelayUrl: "wss://one.example/<b>",
		Status: graspv1.RelayStatus_RELAY_STATUS_SYNCING, PendingBatches: 2, PendingRepos: 1, LastConnected: 1700000000,
		IncompleteBatches: 3, LastIncomplete: `history incomplete: {"#a":["x"]}`})
	put(b.Names.RepoIndexBucket(), "repo.a", &graspv1.RepoSyncNeeds{RepoRef: "30617:aa:demo", Relays: []string{"wss://one.example/<b>"}})

	s := startServer(t, serverOpts{bus: b})
	ct, body := fetchPage(t, s.http+"/", "text/html")
	if !strings.HasPrefix(ct, "text/html") {
		t.Fatalf("content type %q", ct)
	}
	for _, want := range []string{
		`<tr data-relay="wss://one.example/&lt;b&gt;">`,
		`<td class="status syncing">Syncing</td>`,
		`<td class="batches n">2</td>`,
		`<td class="incomplete n" title="history incomplete: {&#34;#a&#34;:[&#34;x&#34;]}">3</td>`,
		`<td class="pending-repos n">1</td>`,
		`<td class="listed n">1</td>`,
		"2023-11-14 22:13:20Z",
		"30617:aa:demo",
		`http-equiv="refresh"`,
		"planner: <span class=\"err\">no leader</span>",
	} {
		if !strings.Contains(body, want) {
			t.Errorf("page lacks %s:\n%s", want, body)
		}
	}
	if strings.Contains(body, "<b>") {
		t.Error("relay URL not escaped")
	}
	if ct, nip11 := fetchPage(t, s.http+"/", "application/nostr+json"); ct != "application/nostr+json" || !strings.Contains(nip11, "supported_grasps") {
		t.Errorf("NIP-11 = %s %s", ct, nip11)
	}
}

// Without NATS the page still renders and says why there is no sync state.
func TestStatusPageWithoutNATS(t *testing.T) {
	s := startServer(t, serverOpts{})
	ct, body := fetchPage(t, s.http+"/", "text/html")
	if !strings.HasPrefix(ct, "text/html") || !strings.Contains(body, "Sync state unavailable: this relay runs without NATS") {
		t.Errorf("page = %s %s", ct, body)
	}
}

// An archive says so on the status page, with what it mirrors; a relay
// that archives nothing does not mention GRASP-05.
func TestStatusPageSaysArchive(t *testing.T) {
	for _, archive := range []string{"", "mirrors every repository of npub1example"} {
		rec := httptest.NewRecorder()
		req := httptest.NewRequest(http.MethodGet, "/", nil)
		req.Header.Set("Accept", "text/html")
		StatusHandler{Name: "r", PublicURL: "ws://127.0.0.1:1", Archive: archive}.ServeHTTP(rec, req)
		body := rec.Body.String()
		if got := strings.Contains(body, "GRASP-05: "+archive); got != (archive != "") {
			t.Errorf("archive %q: page mentions GRASP-05 %v:\n%s", archive, strings.Contains(body, "GRASP-05"), body)
		}
		if archive == "" && strings.Contains(body, "GRASP-05") {
			t.Errorf("a relay without archive mentions GRASP-05")
		}
	}
}
