package bus

import (
	"context"
	"errors"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// Options tunes the streams and buckets Setup creates.
type Options struct {
	// Replicas for every stream and bucket (1 single node, 3 in a cluster).
	Replicas int
	// DuplicateWindow is how long the events stream remembers Nats-Msg-Id
	// values, so one event fetched from many relays is ingested once.
	DuplicateWindow time.Duration
	// EventsMaxBytes bounds the events stream; publishers block (their async
	// window fills) rather than the stream growing without limit.
	EventsMaxBytes int64
	// ReportsMaxAge is how long fetch reports are kept for a planner that is
	// restarting.
	ReportsMaxAge time.Duration
	// Storage is file or memory storage.
	Storage jetstream.StorageType
	// LeaseTTL is the lifetime of a leadership lease in LeaseBucket: a
	// holder that stops renewing loses it this long after its last renewal.
	LeaseTTL time.Duration
}

// DefaultOptions are the single-node defaults.
func DefaultOptions() Options {
	return Options{
		Replicas:        1,
		DuplicateWindow: 2 * time.Minute,
		EventsMaxBytes:  1 << 30,
		ReportsMaxAge:   24 * time.Hour,
		Storage:         jetstream.FileStorage,
		LeaseTTL:        10 * time.Second,
	}
}

// Setup creates or updates every stream and KV bucket of the contract. It is
// idempotent, so every service calls it at start and any of them can come up
// first; in a cluster, where concurrent callers can time out on a stream
// another one just created, each step is retried within ctx (EnsureStream).
func Setup(ctx context.Context, js jetstream.JetStream, n Names, o Options) error {
	if o.Replicas <= 0 {
		o.Replicas = 1
	}
	streams := []jetstream.StreamConfig{
		{
			// Work queue: a command is executed once, by the shard's owner.
			Name:        n.FetchCmdStream(),
			Subjects:    []string{n.FetchCmdSubjects()},
			Retention:   jetstream.WorkQueuePolicy,
			MaxAge:      time.Hour,
			Storage:     o.Storage,
			Replicas:    o.Replicas,
			Description: "planner → fetcher commands, one subject per shard",
		},
		{
			Name:        n.FetchReportStream(),
			Subjects:    []string{n.FetchReportSubjects()},
			Retention:   jetstream.LimitsPolicy,
			MaxAge:      o.ReportsMaxAge,
			Storage:     o.Storage,
			Replicas:    o.Replicas,
			Description: "fetcher → planner lifecycle reports",
		},
		{
			Name:        n.EventsStream(),
			Subjects:    []string{n.EventsSubjects()},
			Retention:   jetstream.WorkQueuePolicy,
			Duplicates:  o.DuplicateWindow,
			MaxBytes:    o.EventsMaxBytes,
			Discard:     jetstream.DiscardNew,
			Storage:     o.Storage,
			Replicas:    o.Replicas,
			Description: "raw nostr events from remote relays, for the ingesters",
		},
	}
	for _, cfg := range streams {
		if _, err := EnsureStream(ctx, js, cfg); err != nil {
			return err
		}
	}
	buckets := []jetstream.KeyValueConfig{
		{Bucket: n.RepoIndexBucket(), Description: "RepoSyncIndex: repo → relays and root events", Storage: o.Storage, Replicas: o.Replicas},
		{Bucket: n.RelayStateBucket(), Description: "planner state per relay", Storage: o.Storage, Replicas: o.Replicas},
		{
			// Bounded: a week of refusals, at most 200,000 events (about
			// 60 MB in each fetcher's cache); older ones are fetched again
			// at most once more and refused again.
			Bucket: n.RejectedBucket(), Description: "events the policy refused for good (NIP-77 local set)",
			TTL: 7 * 24 * time.Hour, MaxBytes: 256 << 20, Storage: o.Storage, Replicas: o.Replicas,
		},
	}
	for _, cfg := range buckets {
		if _, err := EnsureKeyValue(ctx, js, cfg); err != nil {
			return err
		}
	}
	return SetupLeases(ctx, js, n, o)
}

// SetupLeases creates or updates LeaseBucket. Its TTL (MaxAge) is the lease
// duration: every renewal is a new message, so the key disappears LeaseTTL
// after the holder's last renewal. Limit markers make that expiry visible to
// watchers, so a standby takes over at once instead of at its next poll; a
// server too old for markers (before 2.11) still works, by polling.
func SetupLeases(ctx context.Context, js jetstream.JetStream, n Names, o Options) error {
	if o.Replicas <= 0 {
		o.Replicas = 1
	}
	if o.LeaseTTL <= 0 {
		o.LeaseTTL = DefaultOptions().LeaseTTL
	}
	cfg := jetstream.KeyValueConfig{
		Bucket:         n.LeaseBucket(),
		Description:    "leadership leases (one active discovery, one active planner)",
		TTL:            o.LeaseTTL,
		LimitMarkerTTL: max(o.LeaseTTL, time.Second), // the server's minimum
		Storage:        o.Storage,
		Replicas:       o.Replicas,
	}
	_, err := EnsureKeyValue(ctx, js, cfg)
	if errors.Is(err, jetstream.ErrLimitMarkerTTLNotSupported) {
		cfg.LimitMarkerTTL = 0
		_, err = EnsureKeyValue(ctx, js, cfg)
	}
	return err
}
