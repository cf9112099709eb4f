package syncstatus

import (
	"context"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/grasp-sync/grasp-sync/pkg/bus"
)

// RelayReader reads the planner's relay records as ReadRelays does, again
// and again, and reads them only when the bucket changed since its last
// read. ReadRelays lists the bucket and gets every record: two messages per
// relay. graspd's progress line asks every ProgressInterval, at rest too,
// and at 500 relays those reads and the collections they caused were the
// largest part of graspd's CPU at rest
// (docs/decisions/0075-what-waits-is-kept-small.md). Asking the bucket's
// stream for its state is one request.
//
// A RelayReader is not safe for concurrent use.
type RelayReader struct {
	js    jetstream.JetStream
	names bus.Names
	kv    jetstream.KeyValue
	// version is the bucket's last sequence and message count when last
	// was read: a put or delete moves the first, a purge the second.
	version [2]uint64
	last    *Snapshot
}

// NewRelayReader returns a RelayReader of the relay records under names.
func NewRelayReader(js jetstream.JetStream, names bus.Names) *RelayReader {
	return &RelayReader{js: js, names: names}
}

// Read returns a Snapshot of the relay records (no index, health, leases
// or per-repository records: Progress and Relay answer, Explain does not),
// the one it read last if the bucket has not changed since. The Snapshot
// is shared between calls that return it: callers must not change it.
func (r *RelayReader) Read(ctx context.Context) (*Snapshot, error) {
	if r.kv == nil {
		kv, err := openKV(ctx, r.js, r.names.RelayStateBucket())
		if err != nil {
			return nil, err
		}
		r.kv = kv
	}
	st, err := r.kv.Status(ctx)
	if err != nil {
		return nil, fmt.Errorf("status of %s: %w", r.kv.Bucket(), err)
	}
	// A status without its stream's state (another KV implementation)
	// tells nothing: read.
	bs, known := st.(*jetstream.KeyValueBucketStatus)
	var version [2]uint64
	if known {
		version = [2]uint64{bs.StreamInfo().State.LastSeq, bs.StreamInfo().State.Msgs}
	}
	if known && r.last != nil && version == r.version {
		return r.last, nil
	}
	s := &Snapshot{Taken: time.Now().UTC()}
	if err := readRelays(ctx, r.js, r.names, s); err != nil {
		return nil, err
	}
	// Kept until the bucket changes: without each relay's per-repository
	// record, which only Explain and ReposOfRelay read (at 500 relays
	// ~6.5 MB of graspd's heap at rest).
	for i := range s.Relays {
		s.Relays[i].state = nil
	}
	r.version, r.last = version, s
	return s, nil
}
