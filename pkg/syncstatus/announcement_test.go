package syncstatus_test

import (
	"context"
	"strings"
	"testing"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/grasp-sync/grasp-sync/pkg/bus"
	"github.com/grasp-sync/grasp-sync/pkg/syncstatus"
	"github.com/grasp-sync/grasp-sync/pkg/testkit"
)

func TestClassifyAnnouncement(t *testing.T) {
	owner := testkit.NewKey()
	const service = "wss://grasp.example"
	ann := owner.Announcement("demo",
		[]string{testkit.GraspCloneURL(service, owner.PubKey, "demo"), testkit.GraspCloneURL("wss://other.example", owner.PubKey, "demo"), "https://github.com/x/demo.git"},
		[]string{service, "wss://one.example", "wss://user:pw@bad.example", "ws://10.0.0.1", "ftp://nope.example"}, nil)
	repo := syncstatus.Repo{Ref: testkit.RepoRef(owner.PubKey, "demo"), Relays: []string{"wss://one.example", "wss://other.example"}}
	got, err := syncstatus.ClassifyAnnouncement(ann, repo, service)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		service:                         "this service",
		"wss://one.example":             "synced",
		"wss://user:pw@bad.example":     "refused: relayurl: credentials",
		"ws://10.0.0.1":                 "refused: private or internal address",
		"ftp://nope.example":            "refused: ",
		"https://github.com/x/demo.git": "not a GRASP clone URL",
	}
	seen := map[string]bool{}
	for _, v := range got {
		if w, ok := want[v.URL]; ok {
			seen[v.URL] = true
			if !strings.HasPrefix(v.Verdict, w) {
				t.Errorf("%s %s: verdict %q, want %q…", v.Tag, v.URL, v.Verdict, w)
			}
		}
		if v.Tag == "clone" && v.Relay == "wss://other.example" && v.Verdict != "synced" {
			t.Errorf("GRASP clone URL %s: %q, want synced", v.URL, v.Verdict)
		}
	}
	for u := range want {
		if !seen[u] {
			t.Errorf("no verdict on %s: %+v", u, got)
		}
	}
	ex := &syncstatus.Explanation{Repo: repo, Relays: []syncstatus.RepoRelay{{URL: "wss://one.example"}, {URL: "wss://other.example"}}}
	ex.AddAnnouncement(got)
	if !strings.Contains(ex.Relays[0].Why, "relays tag") || !strings.Contains(ex.Relays[1].Why, "clone URL") {
		t.Errorf("why: %q / %q", ex.Relays[0].Why, ex.Relays[1].Why)
	}
}

// collect gathers a collector's samples by metric name (label values
// joined with "/"), with their values.
func collect(t *testing.T, c prometheus.Collector) map[string]float64 {
	t.Helper()
	ch := make(chan prometheus.Metric, 100)
	c.Collect(ch)
	close(ch)
	out := map[string]float64{}
	for m := range ch {
		var pb dto.Metric
		if err := m.Write(&pb); err != nil {
			t.Fatal(err)
		}
		name := m.Desc().String()
		name = name[strings.Index(name, `"`)+1:]
		name = name[:strings.Index(name, `"`)]
		for _, l := range pb.GetLabel() {
			name += "/" + l.GetValue()
		}
		out[name] = pb.GetGauge().GetValue()
	}
	return out
}

func TestNATSCollector(t *testing.T) {
	ctx := context.Background()
	js := startJetStream(t)
	names := bus.DefaultNames()
	c := syncstatus.NewNATSCollector(js, names)
	// Before setup: no stream yet is not a failure.
	if got := collect(t, c); got["grasp_nats_up"] != 1 || len(got) != 1 {
		t.Errorf("before setup: %v, want only grasp_nats_up 1", got)
	}
	if err := bus.Setup(ctx, js, names, bus.DefaultOptions()); err != nil {
		t.Fatal(err)
	}
	st, err := js.Stream(ctx, names.EventsStream())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{Durable: "ingest", AckPolicy: jetstream.AckExplicitPolicy}); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 3; i++ {
		if _, err := js.Publish(ctx, names.EventsSubject(i), []byte(`{}`)); err != nil {
			t.Fatal(err)
		}
	}
	got := collect(t, c)
	ev := names.EventsStream()
	if got["grasp_nats_consumer_pending_messages/ingest/"+ev] != 3 || got["grasp_nats_stream_messages/"+ev] != 3 || got["grasp_nats_up"] != 1 {
		t.Errorf("after three undelivered events: %v", got)
	}
}
