// Package bus is grasp-sync's NATS layer: subject and bucket names, idempotent
// creation of the streams and KV buckets the services share, typed publishing
// of control messages and typed durable consumers.
//
// Every subject is named by a method of Names; grep for the method to find
// where a message is produced and consumed.
package bus

import (
	"fmt"
	"strings"
)

// DefaultPrefix is the subject and bucket prefix of a deployment. Two
// deployments can share one NATS by choosing different prefixes.
const DefaultPrefix = "grasp"

// Names derives every subject, stream and bucket name from one prefix.
type Names struct {
	Prefix string
}

// DefaultNames returns the names for DefaultPrefix.
func DefaultNames() Names { return Names{Prefix: DefaultPrefix} }

func (n Names) prefix() string {
	if n.Prefix == "" {
		return DefaultPrefix
	}
	return n.Prefix
}

func (n Names) upper() string { return strings.ToUpper(n.prefix()) }

// FetchCmdSubject is where the planner sends commands for relays of one shard
// (consumed by the fetcher owning the shard).
func (n Names) FetchCmdSubject(shard int) string {
	return fmt.Sprintf("%s.fetch.cmd.%d", n.prefix(), shard)
}

// FetchCmdStream holds every FetchCmdSubject.
func (n Names) FetchCmdStream() string { return n.upper() + "_FETCH_CMD" }

// FetchReportSubject is where fetchers report lifecycle facts of the relays
// of one shard (consumed by the planner).
func (n Names) FetchReportSubject(shard int) string {
	return fmt.Sprintf("%s.fetch.report.%d", n.prefix(), shard)
}

// FetchReportStream holds every FetchReportSubject.
func (n Names) FetchReportStream() string { return n.upper() + "_FETCH_REPORT" }

// EventsSubject carries raw nostr event JSON received from relays of one
// shard (produced by fetchers, consumed by ingesters).
func (n Names) EventsSubject(shard int) string {
	return fmt.Sprintf("%s.events.%d", n.prefix(), shard)
}

// EventsStream holds every EventsSubject.
func (n Names) EventsStream() string { return n.upper() + "_EVENTS" }

// StoredSubject carries events that a writer (ingester or relay) has just
// stored, so every relay replica broadcasts them to its live subscribers.
func (n Names) StoredSubject(kind int) string {
	return fmt.Sprintf("%s.stored.%d", n.prefix(), kind)
}

// RepoIndexBucket is the KV bucket holding the RepoSyncIndex.
func (n Names) RepoIndexBucket() string { return n.prefix() + "_repo_index" }

// RelayStateBucket is the KV bucket holding the planner's per-relay state.
func (n Names) RelayStateBucket() string { return n.prefix() + "_relay_state" }

// all returns the wildcard subject for one family, e.g. "grasp.events.>".
func (n Names) all(family string) string { return n.prefix() + "." + family + ".>" }

// FetchCmdSubjects matches every FetchCmdSubject.
func (n Names) FetchCmdSubjects() string { return n.all("fetch.cmd") }

// FetchReportSubjects matches every FetchReportSubject.
func (n Names) FetchReportSubjects() string { return n.all("fetch.report") }

// EventsSubjects matches every EventsSubject.
func (n Names) EventsSubjects() string { return n.all("events") }

// StoredSubjects matches every StoredSubject.
func (n Names) StoredSubjects() string { return n.all("stored") }
