package graspd_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/nbd-wtf/go-nostr"

	"github.com/grasp-sync/grasp-sync/pkg/testkit"

	"github.com/grasp-sync/grasp-sync/pkg/testkit/testrelay"
	"github.com/grasp-sync/grasp-sync/services/graspd"
)

// TestOnePolicy: the policy's limits are configured once (GRASP_POLICY_*)
// and decide the same way for an event a client publishes to our relay and
// for one that arrives through sync (fetcher → ingester). One limit is
// raised above its default (tags: 2,000 → 2,500), one lowered (tag value:
// 64 KiB → 1,000 bytes); for each path, an event within both limits, one
// over the raised default but within the new limit, one over the new tag
// limit and one over the lowered value limit.
func TestOnePolicy(t *testing.T) {
	t.Setenv("GRASP_POLICY_MAX_TAGS", "2500")
	t.Setenv("GRASP_POLICY_MAX_TAG_VALUE_BYTES", "1000")
	remote := testrelay.Start(t, testrelay.Options{Negentropy: true})
	app := startGraspd(t, graspd.AllServices)

	owner, contributor := testkit.NewKey(), testkit.NewKey()
	ann := owner.Announcement("policy",
		[]string{testkit.GraspCloneURL(app.PublicURL(), owner.PubKey, "policy")},
		[]string{app.PublicURL(), remote.URL}, nil)
	repo := testkit.RepoRef(owner.PubKey, "policy")
	// cases builds the four issues of one path.
	type issue struct {
		name   string
		evt    *nostr.Event
		accept bool
		reason string // the refusal's prefix
	}
	cases := func(path string) []issue {
		labels := func(n int) testkit.Option {
			tags := make(nostr.Tags, n)
			for i := range tags {
				tags[i] = nostr.Tag{"t", fmt.Sprint("l", i)}
			}
			return testkit.WithTags(tags...)
		}
		return []issue{
			{"within the limits", contributor.Issue(repo, path+" small"), true, ""},
			{"2,200 tags: over the default, within the raised limit", contributor.Issue(repo, path+" many tags", labels(2200)), true, ""},
			{"2,600 tags: over the raised limit", contributor.Issue(repo, path+" too many tags", labels(2600)), false, "invalid: too many tags"},
			{"a 2,000-byte tag value: over the lowered limit", contributor.Issue(repo, path+" "+strings.Repeat("x", 2000)), false, "invalid: tag value too long"},
		}
	}

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := testrelay.Publish(ctx, app.RelayURL(), ann); err != nil {
		t.Fatalf("publish announcement: %v", err)
	}

	// A client publishes to our relay.
	c, err := testrelay.Dial(ctx, app.RelayURL())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for _, tc := range cases("client") {
		if err := c.Write(ctx, nostr.EventEnvelope{Event: *tc.evt}); err != nil {
			t.Fatal(err)
		}
		var ok *nostr.OKEnvelope
		for ok == nil {
			env, _, err := c.Read(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if o, is := env.(*nostr.OKEnvelope); is && o.EventID == tc.evt.ID {
				ok = o
			}
		}
		if ok.OK != tc.accept || (!tc.accept && !strings.HasPrefix(ok.Reason, tc.reason)) {
			t.Errorf("client, %s: OK %v %q; want accepted %v (%s)", tc.name, ok.OK, ok.Reason, tc.accept, tc.reason)
		}
	}

	// The same kinds of event arrive through sync from the remote relay.
	synced := cases("synced")
	for _, tc := range synced {
		remote.Add(t, tc.evt)
	}
	// Wait until the ingester has decided all four: the two accepted are
	// stored and its refusal counters account for the other two.
	var accepted []*nostr.Event
	for _, tc := range synced {
		if tc.accept {
			accepted = append(accepted, tc.evt)
		}
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		stored := waitStored(t, app, accepted, 0)
		refused := ingesterRefusals(t, app)
		if stored == len(accepted) && refused["too-many-tags"] >= 1 && refused["too-large"] >= 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("through sync: %d of %d acceptable events stored, refusals %v after 30 s; want all stored and one too-many-tags and one too-large refusal",
				stored, len(accepted), refused)
		}
		time.Sleep(200 * time.Millisecond)
	}
	for _, tc := range synced {
		has, err := app.Store().Has(ctx, tc.evt.ID)
		if err != nil {
			t.Fatal(err)
		}
		if has != tc.accept {
			t.Errorf("through sync, %s: stored %v, want %v", tc.name, has, tc.accept)
		}
	}
}

// ingesterRefusals reads grasp_ingester_refused_total by reason from
// graspd's /metrics.
func ingesterRefusals(t *testing.T, app *graspd.App) map[string]float64 {
	t.Helper()
	resp, err := http.Get("http://" + app.MetricsAddr() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, line := range strings.Split(string(body), "\n") {
		var n float64
		rest, ok := strings.CutPrefix(line, `grasp_ingester_refused_total{reason="`)
		if !ok {
			continue
		}
		reason, value, ok := strings.Cut(rest, `"} `)
		if !ok {
			continue
		}
		if _, err := fmt.Sscan(value, &n); err == nil {
			out[reason] = n
		}
	}
	return out
}

// TestSplitPolicyRefused: a configuration built in code cannot give the
// relay and the ingester different limits.
func TestSplitPolicyRefused(t *testing.T) {
	var c graspd.Configs
	c.Graspd.DataDir = t.TempDir()
	c.Relay.Addr = "127.0.0.1:0"
	c.Relay.MaxTags = 10
	_, err := graspd.Start(context.Background(), c, slog.New(slog.DiscardHandler))
	if err == nil || !strings.Contains(err.Error(), "GRASP_POLICY_") {
		t.Fatalf("Start with split limits: %v, want an error naming GRASP_POLICY_*", err)
	}
}

// TestSplitArchiveRefused: a configuration built in code cannot give the
// relay, the ingester and discovery different archive settings.
func TestSplitArchiveRefused(t *testing.T) {
	var c graspd.Configs
	c.Graspd.DataDir = t.TempDir()
	c.Relay.Addr = "127.0.0.1:0"
	c.Discovery.All = true
	_, err := graspd.Start(context.Background(), c, slog.New(slog.DiscardHandler))
	if err == nil || !strings.Contains(err.Error(), "GRASP_ARCHIVE_") {
		t.Fatalf("Start with split archive settings: %v, want an error naming GRASP_ARCHIVE_*", err)
	}
}
