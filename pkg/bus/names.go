// Package bus is grasp-sync's NATS layer: subject and bucket names, idempotent
// creation of the streams and KV buckets the services share, typed publishing
// of control messages and typed durable consumers.
//
// Every subject, stream and bucket is named by a method of Names, and every
// KV key layout by a function of this package (keys.go) or of the pkg/
// package that owns the data (nip34 for repository keys, leader for lease
// roles, rejected, parking): nothing else builds such a name, so the NATS
// permissions generated from the code's use of Names (deploy/validate)
// cover everything the services do. Grep for the method to find where a
// message is produced and consumed.
package bus

import (
	"fmt"
	"strconv"
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

// StoredKind returns the event kind a StoredSubject names, so a subscriber
// can pass over kinds it has no use for without decoding the event.
func StoredKind(subject string) (int, bool) {
	i := strings.LastIndexByte(subject, '.')
	if i < 0 || !strings.HasSuffix(subject[:i], ".stored") {
		return 0, false
	}
	kind, err := strconv.Atoi(subject[i+1:])
	if err != nil || kind < 0 {
		return 0, false
	}
	return kind, true
}

// RepoIndexBucket is the KV bucket holding the RepoSyncIndex.
func (n Names) RepoIndexBucket() string { return n.prefix() + "_repo_index" }

// RelayStateBucket is the KV bucket holding the planner's per-relay state.
func (n Names) RelayStateBucket() string { return n.prefix() + "_relay_state" }

// LeaseBucket is the KV bucket holding leadership leases (pkg/leader): one
// key per elected role ("discovery", "planner"). Its TTL is the lease
// duration, so a holder that dies without releasing loses the lease.
func (n Names) LeaseBucket() string { return n.prefix() + "_leases" }

// FetcherLeaseBucket holds the fetchers' shard leases and their membership
// (services/fetcher, keys FetcherShardKey and FetcherMemberKey). Its TTL is
// the fetchers' lease duration; the fetchers create it, so only they need
// the right to.
func (n Names) FetcherLeaseBucket() string { return n.prefix() + "_fetcher_leases" }

// FetcherRelayBucket records, per shard, the relays the planner asked the
// fetchers to keep connected (keys FetcherRelayKey), so the replica that
// takes a shard over reconnects them. The fetchers create it.
func (n Names) FetcherRelayBucket() string { return n.prefix() + "_fetcher_relays" }

// RelayLimitsBucket keeps what the fetchers know of each remote relay's
// limits (keys RelayLimitsKey, values graspv1.RelayLimits): advertised in
// NIP-11, learned from refusals, and the reads it refuses. It outlives
// restarts and shard moves, so a relay's budget is learned once. The
// fetchers create and write it; graspctl reads it.
func (n Names) RelayLimitsBucket() string { return n.prefix() + "_relay_limits" }

// BootstrapRelaysKey is the reserved key of RepoIndexBucket under which
// discovery publishes the configured bootstrap relays (a
// graspv1.BootstrapRelays value) so the planner keeps them connected. It can
// never collide with a repository key ("<pubkey>.<base64url(d)>").
const BootstrapRelaysKey = "bootstrap-relays"

// RejectedBucket remembers events the policy refused for good (pkg/rejected),
// so NIP-77 reconciliation does not fetch them again.
func (n Names) RejectedBucket() string { return n.prefix() + "_rejected" }

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

// AllSubjects matches every subject of the deployment (graspctl tap). It
// has no single-subject counterpart: nothing is sent on it as such.
func (n Names) AllSubjects() string { return n.prefix() + ".>" }

// ParkedStream holds events the policy refused only because something they
// reference has not arrived yet, one message per parked event on
// ParkedSubject (written and read by services/ingester/internal/parking in the ingesters).
func (n Names) ParkedStream() string { return n.upper() + "_PARKED" }

// ParkedSubject is the subject of one parked event, by event id.
func (n Names) ParkedSubject(id string) string { return n.prefix() + ".parked.event." + id }

// ParkedSubjects matches every ParkedSubject.
func (n Names) ParkedSubjects() string { return n.all("parked.event") }

// ParkedWakeStream holds the wake-up index of parked events: one empty
// message per (reference a parked event waits for, parked event id) on
// ParkedWakeSubject, so the arrival of a reference finds its waiters with one
// subject-filtered lookup.
func (n Names) ParkedWakeStream() string { return n.upper() + "_PARKED_WAKE" }

// ParkedWakeSubject is the wake-up entry of parked event id for reference
// token (a KV- and subject-safe token, see services/ingester/internal/parking).
func (n Names) ParkedWakeSubject(token, id string) string {
	return n.prefix() + ".parked.wake." + token + "." + id
}

// ParkedWakeSubjects matches every ParkedWakeSubject; with a token, only that
// token's entries.
func (n Names) ParkedWakeSubjects(token string) string {
	if token == "" {
		return n.all("parked.wake")
	}
	return n.prefix() + ".parked.wake." + token + ".*"
}

// ParkingWakeQueue is the queue group in which the ingester replicas share
// StoredSubjects to wake parked events (one replica handles each stored
// event).
func (n Names) ParkingWakeQueue() string { return n.prefix() + "-ingester-parking" }

// DeadLetterSubject receives events that kept failing for infrastructure
// reasons (store errors) after the ingester's MaxDeliver attempts, with the
// reason in a header, so one poison message never blocks the events stream.
// It lies outside EventsSubjects ("<prefix>.events.>") on purpose: a dead
// letter must not be consumed again as an event.
func (n Names) DeadLetterSubject() string { return n.prefix() + ".deadletter.events" }

// DeadLetterStream holds DeadLetterSubject for an operator to inspect and
// replay (created by the ingester).
func (n Names) DeadLetterStream() string { return n.upper() + "_DEADLETTER" }

// DeadLetterSubjects matches every dead-letter subject (one today; the
// family leaves room for dead letters of other streams).
func (n Names) DeadLetterSubjects() string { return n.all("deadletter") }
