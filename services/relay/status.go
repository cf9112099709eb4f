package relay

import (
	"bytes"
	"context"
	"html/template"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"github.com/grasp-sync/grasp-sync/pkg/bus"
	"github.com/grasp-sync/grasp-sync/pkg/syncstatus"
	"github.com/grasp-sync/grasp-sync/pkg/targetstatus"
)

// statusRefreshSeconds is how often the status page reloads itself: live
// enough to watch a sync move, cheap enough that an open tab costs nothing.
const statusRefreshSeconds = 5

// wantsStatusPage says whether a request is a browser asking for the root
// page: NIP-11 clients send Accept: application/nostr+json and keep getting
// JSON; websocket upgrades never reach here.
func wantsStatusPage(req *http.Request) bool {
	return req.URL.Path == "/" && (req.Method == http.MethodGet || req.Method == http.MethodHead) &&
		strings.Contains(req.Header.Get("Accept"), "text/html") &&
		!strings.Contains(req.Header.Get("Accept"), "application/nostr+json")
}

// StatusPage is what the status page template renders.
type StatusPage struct {
	Name, Description, PublicURL string
	Refresh                      int
	// Archive is set when the relay also mirrors repositories that do not
	// list it (GRASP-05): what it mirrors, as NIP-11's curation says.
	Archive  string
	Snapshot *syncstatus.Snapshot
	Progress syncstatus.Progress
	// Target is set in bolt-on mode: how publishing to the target relay
	// stands (backlog, expected time, refusals).
	Target *targetstatus.Status
	// Error is set when the sync state could not be read (NATS down, buckets
	// missing): the page still renders and says so.
	Error string
}

var statusTemplate = template.Must(template.New("status").Funcs(template.FuncMap{
	"when": func(t time.Time) string {
		if t.IsZero() {
			return "never"
		}
		return t.UTC().Format("2006-01-02 15:04:05Z")
	},
	"lower": strings.ToLower,
}).Parse(`<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta http-equiv="refresh" content="{{.Refresh}}">
<title>{{.Name}} — grasp-sync status</title>
<style>
body{font:14px/1.4 system-ui,sans-serif;margin:1.5em;color:#222}
table{border-collapse:collapse;margin:.5em 0 1.5em}
th,td{border:1px solid #ccc;padding:.25em .6em;text-align:left}
th{background:#f3f3f3}
td.n{text-align:right}
.connected{color:#176d17}.syncing,.connecting{color:#8a6d00}.disconnected,.dead,.connectedwithfailures{color:#a31515}
.err{color:#a31515}
</style></head><body>
<h1>{{.Name}}</h1>
<p>{{.Description}}</p>
<p>Relay URL: <code>{{.PublicURL}}</code>. GRASP-01 and GRASP-02 (proactive sync){{if .Archive}}, and GRASP-05: {{.Archive}}{{end}}. This page refreshes every {{.Refresh}} s.</p>
{{with .Target}}<h2>Target relay</h2>
<p id="target">Bolt-on mode: accepted events are published to <code>{{.URL}}</code> ({{if .Connected}}connected{{else}}<span class="err">not connected</span>{{end}}).
{{.Written}} written, {{.Duplicates}} already there, {{.Refused}} refused, {{.RateLimited}} rate-limited answers.
Writing {{printf "%.2f" .WriteRate}} events/s (limit {{printf "%.4g" .Rate}}/s, burst {{.Burst}}, {{.Concurrency}} in flight).
Backlog <span id="backlog">{{.Backlog}}</span> events{{if .Backlog}}, about <span id="eta">{{.ETA}}</span> to go{{end}}.
{{if .Paused}}Paused {{.Paused}} after the target asked us to slow down or went away.{{end}}
{{if .LastRefusal}}Last refusal: <span class="err">{{.LastRefusal}}</span>.{{end}}</p>{{end}}
{{if .Error}}<p class="err" id="error">Sync state unavailable: {{.Error}}</p>{{end}}
{{with .Snapshot}}
<p id="summary">{{$.Progress.Relays}} remote relays: {{$.Progress.Connected}} connected, {{$.Progress.Syncing}} syncing; {{$.Progress.PendingBatches}} batches pending. {{len .Repos}} repositories hosted. As of {{when .Taken}}.</p>
<h2>Remote relays</h2>
<table id="relays"><thead><tr><th>Relay</th><th>Status</th><th>Health</th><th>Repos listed</th><th>Repos confirmed</th><th>Repos pending</th><th>Roots confirmed</th><th>Roots pending</th><th>Batches pending</th><th>Batches incomplete</th><th>Live filters</th><th>Last connected</th><th>Last error</th></tr></thead><tbody>
{{range .Relays}}<tr data-relay="{{.URL}}"><td class="url">{{.URL}}{{if .Bootstrap}} (bootstrap){{end}}</td><td class="status {{lower .Status}}">{{.Status}}</td><td class="health {{.Health}}">{{or .Health "–"}}</td><td class="listed n">{{.ListedRepos}}</td><td class="confirmed-repos n">{{.ConfirmedRepos}}</td><td class="pending-repos n">{{.PendingRepos}}</td><td class="confirmed-roots n">{{.ConfirmedRoots}}</td><td class="pending-roots n">{{.PendingRoots}}</td><td class="batches n">{{.PendingBatches}}</td><td class="incomplete n"{{if .LastIncomplete}} title="{{.LastIncomplete}}"{{end}}>{{.IncompleteBatches}}</td><td class="live-filters n">{{.LiveFilters}}</td><td>{{when .LastConnected}}</td><td class="err">{{.LastError}}</td></tr>
{{else}}<tr><td colspan="12">No remote relay tracked yet.</td></tr>{{end}}
</tbody></table>
<h2>Repositories</h2>
<table id="repos"><thead><tr><th>Repository</th><th>Root events</th><th>Synced from</th></tr></thead><tbody>
{{range .Repos}}<tr><td><code>{{.Ref}}</code></td><td class="n">{{.Roots}}</td><td>{{range $i, $u := .Relays}}{{if $i}}, {{end}}{{$u}}{{end}}</td></tr>
{{else}}<tr><td colspan="3">No repository announcement lists this service yet.</td></tr>{{end}}
</tbody></table>
<h2>Leadership</h2>
<ul>{{range .Leases}}<li>{{.Role}}: {{if .Held}}held by {{.Holder}} (epoch {{.Epoch}}){{else}}<span class="err">no leader</span>{{end}}</li>{{end}}</ul>
{{end}}
</body></html>
`))

// serveStatus renders the HTML status page from the same state graspctl
// status reads.
func (r *Relay) serveStatus(w http.ResponseWriter, req *http.Request) {
	h := StatusHandler{Name: r.cfg.Name, Description: r.cfg.Description, PublicURL: r.cfg.PublicURL, Bus: r.bus, Log: r.log}
	if r.cfg.Archive.Enabled() {
		h.Archive = r.cfg.Archive.Curation()
	}
	h.ServeHTTP(w, req)
}

// StatusHandler serves the status page on its own, where there is no relay
// of ours to serve it: graspd in bolt-on mode mounts it on the metrics
// address.
type StatusHandler struct {
	Name, Description, PublicURL string
	// Archive is NIP-11's curation when the relay archives (GRASP-05).
	Archive string
	// Bus reads the sync state; nil renders the page with an error.
	Bus *bus.Bus
	Log *slog.Logger
	// Target, when set, adds the target relay's section (bolt-on mode).
	Target func() targetstatus.Status
}

// ServeHTTP renders the page.
func (h StatusHandler) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	r := struct {
		bus *bus.Bus
		log *slog.Logger
	}{h.Bus, h.Log}
	page := StatusPage{Name: h.Name, Description: h.Description, PublicURL: h.PublicURL, Refresh: statusRefreshSeconds, Archive: h.Archive}
	if h.Target != nil {
		t := h.Target()
		t.ETA, t.Paused = t.ETA.Round(time.Second), t.Paused.Round(time.Second)
		page.Target = &t
	}
	if page.Name == "" {
		page.Name = "grasp-sync relay"
	}
	if r.bus == nil {
		page.Error = "this relay runs without NATS"
	} else {
		ctx, cancel := context.WithTimeout(req.Context(), 5*time.Second)
		snap, err := syncstatus.Read(ctx, r.bus.JS, r.bus.Names)
		cancel()
		if err != nil {
			page.Error = err.Error()
			r.log.Warn("status page: sync state unavailable", "err", err)
		} else {
			page.Snapshot, page.Progress = snap, snap.Progress()
		}
	}
	var buf bytes.Buffer
	if err := statusTemplate.Execute(&buf, page); err != nil {
		r.log.Error("status page render failed", "err", err)
		http.Error(w, "status page render failed", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	_, _ = w.Write(buf.Bytes())
}
