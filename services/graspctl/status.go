package graspctl

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/nbd-wtf/go-nostr"

	"github.com/grasp-sync/grasp-sync/pkg/bus"
	"github.com/grasp-sync/grasp-sync/pkg/relaylimits"
	"github.com/grasp-sync/grasp-sync/pkg/syncstatus"
	"github.com/grasp-sync/grasp-sync/pkg/targetstatus"
)

// StatusOptions are graspctl status's flags.
type StatusOptions struct {
	JSON bool
	// Watch redraws the table in place every Interval until ctx is done.
	Watch    bool
	Interval time.Duration
	// MetricsURL, when set, is graspd's /metrics: the ingester's stored
	// counter adds events stored and their rate to the progress line, the
	// same line graspd logs every 10 s while a relay is Syncing.
	MetricsURL string
}

// StoredEvents reads grasp_ingester_stored_total (summed over series) from
// a Prometheus text page.
func StoredEvents(ctx context.Context, metricsURL string) (float64, error) {
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, metricsURL, nil)
	if err != nil {
		return 0, fmt.Errorf("metrics URL %q: %w", metricsURL, err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, fmt.Errorf("scrape %s: %w", metricsURL, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("scrape %s: %s", metricsURL, resp.Status)
	}
	var n float64
	sc := bufio.NewScanner(io.LimitReader(resp.Body, 16<<20))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "grasp_ingester_stored_total") {
			continue
		}
		f := strings.Fields(line)
		if v, err := strconv.ParseFloat(f[len(f)-1], 64); err == nil {
			n += v
		}
	}
	return n, sc.Err()
}

// ago renders a timestamp for a table cell.
func ago(t, now time.Time) string {
	if t.IsZero() {
		return "never"
	}
	d := now.Sub(t).Round(time.Second)
	if d < 0 {
		d = 0
	}
	return d.String() + " ago"
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// WriteStatus prints the relay table of a snapshot, with the progress line
// and the leadership above it.
func WriteStatus(out io.Writer, s *syncstatus.Snapshot) error {
	p := s.Progress()
	fmt.Fprintf(out, "relays %d  connected %d  syncing %d  batches pending %d  roots confirmed %d pending %d  repos %d\n",
		p.Relays, p.Connected, p.Syncing, p.PendingBatches, p.ConfirmedRoots, p.PendingRoots, len(s.Repos))
	var leases []string
	for _, l := range s.Leases {
		if l.Held {
			leases = append(leases, fmt.Sprintf("%s: %s (epoch %d)", l.Role, l.Holder, l.Epoch))
		} else {
			leases = append(leases, l.Role+": NO LEADER")
		}
	}
	fmt.Fprintf(out, "leaders %s\n\n", strings.Join(leases, ", "))
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "RELAY\tSTATUS\tHEALTH\tREPOS\tCONFIRMED\tPENDING\tROOTS OK\tROOTS PENDING\tBATCHES\tINCOMPLETE\tMISSED\tLIVE FILTERS\tLIMITS\tLAST CONNECTED\tLAST ERROR")
	for _, r := range s.Relays {
		url := r.URL
		if r.Bootstrap {
			url += " (bootstrap)"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%s\t%s\t%s\n", url, r.Status, dash(r.Health),
			r.ListedRepos, r.ConfirmedRepos, r.PendingRepos, r.ConfirmedRoots, r.PendingRoots, r.PendingBatches,
			r.IncompleteBatches, r.ResyncMissed, r.LiveFilters, limitsColumn(r.Limits), ago(r.LastConnected, s.Taken), dash(r.LastError))
	}
	if len(s.Relays) == 0 {
		fmt.Fprintln(tw, "(no remote relay tracked yet: is the planner running?)\t\t\t\t\t\t\t\t\t\t\t\t\t\t")
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	// What an incomplete batch could not read, below the table: too long
	// for a column.
	for _, r := range s.Relays {
		if r.IncompleteBatches > 0 {
			fmt.Fprintf(out, "\nincomplete %s (%d batches): %s\n", r.URL, r.IncompleteBatches, r.LastIncomplete)
		}
	}
	// LIMITS: the budgets in force; where they came from and what the
	// relay refused, below the table (docs/sync.md, "What relays allow").
	for _, r := range s.Relays {
		writeLimits(out, r, s.Taken)
	}
	// MISSED: events only a daily resync found, so each reached us up to a
	// day late (docs/sync.md, "Counting what the daily resync finds").
	for _, r := range s.Relays {
		if r.ResyncMissed > 0 {
			fmt.Fprintf(out, "\nmissed %s: %d events found only by a daily resync (missed by live and catch-up), the last %s\n",
				r.URL, r.ResyncMissed, ago(r.LastMissedAt, s.Taken))
		}
	}
	return nil
}

// limitsColumn is the LIMITS column: bytes per message, subscriptions,
// filters per REQ in force, "learned" when a refusal lowered one of them,
// "-" when the fetchers recorded nothing yet.
func limitsColumn(l *syncstatus.Limits) string {
	if l == nil {
		return "-"
	}
	v := fmt.Sprintf("%dK/%d/%d", l.InForce.MaxMessageBytes>>10, l.InForce.MaxSubscriptions, l.InForce.MaxFilters)
	switch {
	case !l.Learned.IsZero():
		v += " learned"
	case l.Advertised.IsZero():
		v += " default"
	default:
		v += " nip11"
	}
	return v
}

// writeLimits prints what lowered a relay's budgets and the reads it
// refuses.
func writeLimits(out io.Writer, r syncstatus.Relay, now time.Time) {
	l := r.Limits
	if l == nil {
		return
	}
	if !l.Learned.IsZero() || len(l.LimitRefusals) > 0 {
		var kinds []string
		for k, n := range l.LimitRefusals {
			kinds = append(kinds, fmt.Sprintf("%s %d", k, n))
		}
		sort.Strings(kinds)
		fmt.Fprintf(out, "\nlimits %s: in force %d bytes per message, %d subscriptions, %d filters per REQ, %d per filter; advertised %s; learned %s; refusals %s\n",
			r.URL, l.InForce.MaxMessageBytes, l.InForce.MaxSubscriptions, l.InForce.MaxFilters, l.InForce.MaxLimit,
			limitsText(l.Advertised), limitsText(l.Learned), dash(strings.Join(kinds, ", ")))
	}
	for _, rf := range l.Refusals {
		fmt.Fprintf(out, "\nrefused %s: %s reads: %q (last %s, asked again %s)\n", r.URL, rf.FilterKind, rf.Reason,
			ago(rf.At, now), until(rf.RetryAt, now))
	}
}

func limitsText(l relaylimits.Limits) string {
	if l.IsZero() {
		return "nothing"
	}
	var parts []string
	for _, p := range []struct {
		name string
		v    int
	}{{"message bytes", l.MaxMessageBytes}, {"subscriptions", l.MaxSubscriptions}, {"filters", l.MaxFilters}, {"per filter", l.MaxLimit}} {
		if p.v > 0 {
			parts = append(parts, fmt.Sprintf("%s %d", p.name, p.v))
		}
	}
	return strings.Join(parts, ", ")
}

// until says how long until t, or "now".
func until(t, now time.Time) string {
	if !t.After(now) {
		return "now"
	}
	return "in " + t.Sub(now).Round(time.Minute).String()
}

// Status prints the relay table (or JSON) once, or with Watch until ctx is
// done, redrawing in place.
func Status(ctx context.Context, b *bus.Bus, opts StatusOptions, out io.Writer) error {
	if opts.Interval <= 0 {
		opts.Interval = 2 * time.Second
	}
	var prevStored float64
	var prev time.Time
	for {
		snap, err := syncstatus.Read(ctx, b.JS, b.Names)
		if err != nil {
			return err
		}
		if opts.Watch && !opts.JSON {
			fmt.Fprint(out, "\x1b[H\x1b[2J") // home and clear: redraw in place
		}
		if !opts.JSON {
			stored, serr := 0.0, error(nil)
			if opts.MetricsURL != "" {
				stored, serr = StoredEvents(ctx, opts.MetricsURL)
			}
			if line, ok := syncstatus.NextProgress(snap.Progress(), stored, prevStored, snap.Taken, prev); ok {
				fmt.Fprintln(out, line.String())
			}
			if serr != nil {
				fmt.Fprintf(out, "(events stored unknown: %v)\n", serr)
			} else if opts.MetricsURL != "" {
				// Bolt-on mode: how writing to the target stands, with
				// the backlog and the time it should take.
				if t, ok, err := TargetStatus(ctx, opts.MetricsURL); err == nil && ok {
					fmt.Fprintln(out, t.String())
				}
			}
			prevStored, prev = stored, snap.Taken
		}
		if opts.JSON {
			enc := json.NewEncoder(out)
			if !opts.Watch {
				enc.SetIndent("", "  ")
			}
			if err := enc.Encode(snap); err != nil {
				return err
			}
		} else if err := WriteStatus(out, snap); err != nil {
			return err
		}
		if !opts.Watch {
			return nil
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(opts.Interval):
		}
	}
}

// Repos prints the RepoSyncIndex, one repository per line, optionally only
// those listing relay; MODE says whether we host it (its announcement lists
// us) or keep it as an archive (GRASP-05).
func Repos(ctx context.Context, b *bus.Bus, relay string, asJSON bool, out io.Writer) error {
	snap, err := syncstatus.Read(ctx, b.JS, b.Names)
	if err != nil {
		return err
	}
	repos := snap.Repos
	if relay != "" {
		repos = snap.ReposOfRelay(relay)
	}
	if asJSON {
		enc := json.NewEncoder(out)
		enc.SetIndent("", "  ")
		return enc.Encode(repos)
	}
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "REPO\tMODE\tROOTS\tRELAYS")
	for _, r := range repos {
		mode := "hosted"
		if r.Archived {
			mode = "archived"
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\n", r.Ref, mode, r.Roots, strings.Join(r.Relays, ","))
	}
	return tw.Flush()
}

// TargetStatus reads the grasp_target_* series from graspd's (or the
// ingester's) /metrics: ok is false when the process is not in bolt-on
// mode.
func TargetStatus(ctx context.Context, metricsURL string) (t targetstatus.Status, ok bool, err error) {
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, metricsURL, nil)
	if err != nil {
		return t, false, fmt.Errorf("metrics URL %q: %w", metricsURL, err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return t, false, fmt.Errorf("scrape %s: %w", metricsURL, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return t, false, fmt.Errorf("scrape %s: %s", metricsURL, resp.Status)
	}
	return targetstatus.ParseMetrics(resp.Body)
}

// EventExplanation is graspctl explain's answer for one event id: where it
// went and what was answered.
type EventExplanation struct {
	ID string `json:"id"`
	// Relay is the relay asked whether it holds the event (--relay-url:
	// the own relay, or the target in bolt-on mode); Held its answer.
	Relay string `json:"relay,omitempty"`
	Held  bool   `json:"held"`
	// Kind and CreatedAt describe the held event.
	Kind      int   `json:"kind,omitempty"`
	CreatedAt int64 `json:"created_at,omitempty"`
	// RefusedBy is "target" (the target relay refused it, bolt-on mode) or
	// "policy" (our write policy), with Reason; empty when no refusal is
	// recorded.
	RefusedBy string `json:"refused_by,omitempty"`
	Reason    string `json:"reason,omitempty"`
	// RelayError is why the relay could not be asked.
	RelayError string `json:"relay_error,omitempty"`
}

// targetRefusal is the prefix the ingester records target refusals under
// (services/ingester.TargetRefusalPrefix; not imported, graspctl does not
// depend on the services).
const targetRefusal = "target: "

// ExplainEvent prints where one event (64 hex id) went: whether the relay
// at opts.RelayURL holds it and any refusal recorded for it, by the target
// relay (with its reason) or by our policy.
func ExplainEvent(ctx context.Context, b *bus.Bus, id string, opts ExplainOptions, out io.Writer) error {
	ex := EventExplanation{ID: id, Relay: opts.RelayURL}
	// The bucket is read here, not through pkg/rejected: graspctl only
	// reads (deploy/validate grants read rights to graspctl's own code).
	kv, err := b.JS.KeyValue(ctx, b.Names.RejectedBucket())
	if err != nil {
		return fmt.Errorf("open %s: %w", b.Names.RejectedBucket(), err)
	}
	reason, found := "", false
	switch e, err := kv.Get(ctx, id); {
	case errors.Is(err, jetstream.ErrKeyNotFound):
	case err != nil:
		return fmt.Errorf("read %s %s: %w", b.Names.RejectedBucket(), id, err)
	default:
		var rec struct {
			Reason string `json:"reason"`
		}
		if err := json.Unmarshal(e.Value(), &rec); err != nil {
			return fmt.Errorf("decode %s %s: %w", b.Names.RejectedBucket(), id, err)
		}
		reason, found = rec.Reason, true
	}
	if found {
		ex.RefusedBy, ex.Reason = "policy", reason
		if r, ok := strings.CutPrefix(reason, targetRefusal); ok {
			ex.RefusedBy, ex.Reason = "target", r
		}
	}
	if opts.RelayURL != "" {
		evt, err := syncstatus.FetchEvent(ctx, opts.RelayURL, id)
		switch {
		case err == nil:
			ex.Held, ex.Kind, ex.CreatedAt = true, evt.Kind, int64(evt.CreatedAt)
		case !errors.Is(err, syncstatus.ErrNotHeld):
			ex.RelayError = err.Error()
		}
	}
	if opts.JSON {
		enc := json.NewEncoder(out)
		enc.SetIndent("", "  ")
		return enc.Encode(ex)
	}
	fmt.Fprintf(out, "event %s\n", id)
	switch {
	case ex.Relay == "":
	case ex.RelayError != "":
		fmt.Fprintf(out, "  %s not asked: %s\n", ex.Relay, ex.RelayError)
	case ex.Held:
		fmt.Fprintf(out, "  held by %s (kind %d, created_at %d)\n", ex.Relay, ex.Kind, ex.CreatedAt)
	default:
		fmt.Fprintf(out, "  not held by %s\n", ex.Relay)
	}
	switch ex.RefusedBy {
	case "target":
		fmt.Fprintf(out, "  refused by the target relay: %s (not retried; fetchers count it as held)\n", ex.Reason)
	case "policy":
		fmt.Fprintf(out, "  refused by our write policy: %s\n", ex.Reason)
	default:
		fmt.Fprintln(out, "  no refusal recorded")
	}
	return nil
}

// ExplainOptions are graspctl explain's flags.
type ExplainOptions struct {
	JSON bool
	// RelayURL is this service's own relay, where the announcement in force
	// is read from to say why each URL it lists is synced or refused; ""
	// skips that part.
	RelayURL string
	// ServiceURL is this service's public URL (the announcement lists it);
	// RelayURL when empty.
	ServiceURL string
}

// Explain prints which relays a repository is synced from, how far, and
// why: with RelayURL set, each URL of the announcement with its verdict.
func Explain(ctx context.Context, b *bus.Bus, ref string, opts ExplainOptions, out io.Writer) error {
	snap, err := syncstatus.Read(ctx, b.JS, b.Names)
	if err != nil {
		return err
	}
	ex, err := snap.Explain(ref)
	if err != nil {
		return err
	}
	var annErr error
	if opts.RelayURL != "" && ex.Repo.AnnouncementID != "" {
		service := opts.ServiceURL
		if service == "" {
			service = opts.RelayURL
		}
		var evt *nostr.Event
		if evt, annErr = syncstatus.FetchEvent(ctx, opts.RelayURL, ex.Repo.AnnouncementID); annErr == nil {
			var verdicts []syncstatus.URLVerdict
			if verdicts, annErr = syncstatus.ClassifyAnnouncement(evt, ex.Repo, service); annErr == nil {
				ex.AddAnnouncement(verdicts)
			}
		}
	}
	asJSON := opts.JSON
	if asJSON {
		enc := json.NewEncoder(out)
		enc.SetIndent("", "  ")
		return enc.Encode(ex)
	}
	fmt.Fprintf(out, "repository %s\n  announcement %s, %d root events, index updated %s\n",
		ex.Repo.Ref, dash(ex.Repo.AnnouncementID), ex.Repo.Roots, ago(ex.Repo.UpdatedAt, snap.Taken))
	if len(ex.Relays) == 0 {
		fmt.Fprintln(out, "  synced from no relay: the announcement lists none besides this service (or only refused URLs)")
		return writeAnnouncement(out, ex, annErr)
	}
	fmt.Fprintf(out, "  synced from %d relays:\n", len(ex.Relays))
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "  RELAY\tSTATUS\tREPO HISTORY\tROOTS CONFIRMED\tROOTS PENDING\tWHY")
	for _, r := range ex.Relays {
		hist := "pending"
		if r.RepoConfirmed {
			hist = "confirmed"
		}
		fmt.Fprintf(tw, "  %s\t%s\t%s\t%d\t%d\t%s\n", r.URL, r.Status, hist, r.ConfirmedRoots, r.PendingRoots, r.Why)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, r := range ex.Relays {
		if r.Incomplete != "" {
			fmt.Fprintf(out, "  not complete from %s: %s\n", r.URL, r.Incomplete)
		}
	}
	return writeAnnouncement(out, ex, annErr)
}

// writeAnnouncement prints the verdict on each URL of the announcement.
func writeAnnouncement(out io.Writer, ex *syncstatus.Explanation, annErr error) error {
	if annErr != nil {
		fmt.Fprintf(out, "  announcement URLs not checked: %v (pass --relay-url with this service's relay)\n", annErr)
		return nil
	}
	if len(ex.Announcement) == 0 {
		return nil
	}
	fmt.Fprintln(out, "  announcement URLs:")
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	for _, v := range ex.Announcement {
		fmt.Fprintf(tw, "  %s\t%s\t%s\n", v.Tag, v.URL, v.Verdict)
	}
	return tw.Flush()
}
