package configdoc

import (
	"fmt"
	"strings"
)

// EnvGroup is one group of the settings an operator of graspd sets, named
// by what the operator is doing. The packaged env file and graspd's section
// of docs/configuration.md list graspd's variables in these groups, in this
// order; every other variable graspd reads is tuning (TuningIntro).
type EnvGroup struct {
	Title string
	// Intro says when to touch the group, in a sentence or two.
	Intro string
	Names []string
}

// MaxEnvSettings bounds the settings the packaged env file offers: an
// operator reads each one, so each must be worth reading.
const MaxEnvSettings = 60

// EnvGroups are the settings an operator sets, by what they are doing.
var EnvGroups = []EnvGroup{
	{
		Title: "Where it listens and keeps its data",
		Intro: "PUBLIC_URL is the one setting a public server must get right: announcements that list it are the repositories this server hosts.",
		Names: []string{"GRASP_PUBLIC_URL", "GRASP_RELAY_ADDR", "GRASP_DATA_DIR", "GRASP_METRICS_ADDR", "GRASP_NATS_LISTEN", "GRASP_SERVICES"},
	},
	{
		Title: "How the relay presents itself (NIP-11)",
		Names: []string{"GRASP_RELAY_NAME", "GRASP_RELAY_DESCRIPTION", "GRASP_RELAY_CONTACT", "GRASP_RELAY_PUBKEY"},
	},
	{
		Title: "Clients: a reverse proxy in front, and per-address limits",
		Intro: "Behind nginx, caddy or an ingress controller, list the proxy's addresses in TRUSTED_PROXIES so clients are counted by their own address (docs/deploy.md, \"Behind a reverse proxy\").",
		Names: []string{"GRASP_RELAY_TRUSTED_PROXIES", "GRASP_RELAY_TRUSTED_ADDRESSES", "GRASP_RELAY_CONNECT_RATE", "GRASP_RELAY_CONNECT_BURST", "GRASP_RELAY_MAX_CONNS_PER_ADDR", "GRASP_RELAY_EVENT_RATE", "GRASP_RELAY_EVENT_BURST"},
	},
	{
		Title: "What the relay accepts",
		Intro: "The write policy's limits apply alike to events clients send and to events synced from other relays (docs/policy.md).",
		Names: []string{"GRASP_POLICY_MAX_EVENT_BYTES", "GRASP_POLICY_MAX_TAGS", "GRASP_POLICY_MAX_TAG_VALUE_BYTES", "GRASP_POLICY_MAX_FUTURE_SKEW", "GRASP_RELAY_MAX_MESSAGE_BYTES"},
	},
	{
		Title: "Where events are stored, and memory",
		Intro: "Which store: leave STORE_URL unset for the embedded store (kv on pebble under DATA_DIR), the one to pick on one host: batch writes, exact tag queries, no size caps, a bounded memory budget (docs/decisions/0036-kv-on-pebble.md). " +
			"Use postgres://user:password@host/db (or postgresql://) when several processes share the store: the separate services, or relay replicas. " +
			"kv+badger:// is only for a directory an older graspd wrote with badger (a plain path opens it too); kv+pebble:// names the engine explicitly. " +
			"badger://, lmdb:// and sqlite3:// (the last two in cgo builds only) are eventstore's backends, kept for measurements: none should be picked. Each needs a workaround in pkg/store (badger: serialised deletes; lmdb: duplicates removed, a crash on close avoided, one fsync per write, 324 writes/s; sqlite3: tag queries by substring, full scans), and badger and lmdb refuse content over 65,535 bytes and do not index tag values over 100 bytes (docs/decisions/0006-embedded-store-kv.md).",
		Names: []string{"GRASP_STORE_URL", "GRASP_STORE_MEMORY", "GRASP_MEMORY_LIMIT"},
	},
	{
		Title: "Which relays it syncs from",
		Names: []string{"GRASP_BOOTSTRAP_RELAYS", "GRASP_MAX_RELAYS_PER_ANNOUNCEMENT", "GRASP_RELAY_ALLOWLIST", "GRASP_FETCHER_AUTH_KEY", "GRASP_FETCHER_DISABLE_NEGENTROPY"},
	},
	{
		Title: "How often it checks again",
		Intro: "A full resync of every relay runs about daily; failed batches and unreachable relays are retried with growing waits (docs/sync.md).",
		Names: []string{"GRASP_PLANNER_RESYNC_MIN", "GRASP_PLANNER_RESYNC_MAX", "GRASP_DISCOVERY_RESYNC_INTERVAL", "GRASP_PLANNER_FAILURE_RETRY", "GRASP_PLANNER_FAILURE_RETRY_MAX", "GRASP_FETCHER_DEAD_AFTER", "GRASP_FETCHER_DEAD_RETRY"},
	},
	{
		Title: "Events waiting for what they reference",
		Intro: "A synced comment whose issue is not stored yet is parked until it is, within these bounds (docs/policy.md).",
		Names: []string{"GRASP_PARKING_MAX_EVENTS", "GRASP_PARKING_MAX_AGE"},
	},
	{
		Title: "Running an archive or mirror (GRASP-05)",
		Intro: "Sync repositories whose announcements do not list this server (docs/deploy.md, \"Running an archive\"; docs/policy.md).",
		Names: []string{"GRASP_ARCHIVE_WHITELIST", "GRASP_ARCHIVE_ALL", "GRASP_ARCHIVE_MAX_REPOS", "GRASP_ARCHIVE_READ_ONLY"},
	},
	{
		Title: "Bolt-on: syncing into a GRASP relay you already run",
		Intro: "Set TARGET_RELAY to publish accepted events to that relay instead of running our own (docs/bolt-on.md).",
		Names: []string{"GRASP_TARGET_RELAY", "GRASP_TARGET_AUTH_KEY", "GRASP_TARGET_PUBLISH_RATE", "GRASP_TARGET_PUBLISH_BURST", "GRASP_TARGET_PUBLISH_CONCURRENCY", "GRASP_TARGET_REFRESH_INTERVAL"},
	},
	{
		Title: "An external NATS",
		Intro: "Unset, graspd runs NATS embedded. Set NATS_URL to use a NATS server or cluster you run; PREFIX lets two deployments share one.",
		Names: []string{"GRASP_NATS_URL", "GRASP_NATS_CREDS", "GRASP_NATS_CA", "GRASP_NATS_CERT", "GRASP_NATS_KEY", "GRASP_PREFIX"},
	},
	{
		Title: "Logs and diagnosis",
		Names: []string{"GRASP_LOG_LEVEL", "GRASP_LOG_FORMAT", "GRASP_PPROF"},
	},
}

// TuningIntro heads the variables graspd reads that no group lists.
const TuningIntro = "graspd reads these too, but they are not in the packaged env file: each default was chosen by a measurement or by the code's own limits (the decision records in docs/decisions/ say which), and some exist only so tests can run faster. Change one only with a measurement of your own. Internal names and bounds no operator has a reason to change are constants, not variables (\"No longer read\", at the end)."

// groupVars sorts graspd's variables into EnvGroups and the rest (tuning),
// and checks the groups: every name one of graspd's, none twice, each with
// a meaning, at most MaxEnvSettings in all.
func groupVars(vars []Var) (groups [][]Var, tuning []Var, err error) {
	byName := map[string]Var{}
	for _, v := range vars {
		byName[v.Name] = v
	}
	grouped := map[string]bool{}
	for _, g := range EnvGroups {
		var gv []Var
		for _, n := range g.Names {
			v, ok := byName[n]
			switch {
			case !ok:
				return nil, nil, fmt.Errorf("configdoc: EnvGroups names %s, which graspd does not read", n)
			case grouped[n]:
				return nil, nil, fmt.Errorf("configdoc: EnvGroups names %s twice", n)
			case strings.TrimSpace(v.Doc) == "":
				return nil, nil, fmt.Errorf("configdoc: %s has no doc comment: every setting of the env file says what it means", n)
			}
			grouped[n] = true
			gv = append(gv, v)
		}
		groups = append(groups, gv)
	}
	if len(grouped) > MaxEnvSettings {
		return nil, nil, fmt.Errorf("configdoc: EnvGroups offer %d settings, more than MaxEnvSettings (%d): make the least needed a constant or tuning", len(grouped), MaxEnvSettings)
	}
	for _, v := range vars {
		if !grouped[v.Name] {
			tuning = append(tuning, v)
		}
	}
	return groups, tuning, nil
}
