package fetcher

import (
	"crypto/sha256"
	"sync"
	"time"
)

// recentTTL is how long an acknowledged publish is remembered. It must not
// exceed the events stream's duplicate window (pkg/bus: 2 minutes, not
// configurable): within that window the stream would drop a second publish
// with the same Nats-Msg-Id anyway, so skipping it changes nothing the
// ingesters see. Past it, a republish is stored again, and so it is here.
const recentTTL = 30 * time.Second

// recentKey names one Nats-Msg-Id: its SHA-256, so an entry costs 32 bytes
// whatever the id's length, and no two ids share a key in practice.
type recentKey [sha256.Size]byte

func recentKeyOf(msgID string) recentKey { return sha256.Sum256([]byte(msgID)) }

// recentIDs remembers the Nats-Msg-Ids the events stream has acknowledged
// in the last recentTTL, at most a fixed number (the oldest is forgotten
// first). Every event lives on several relays and an initial sync reads them
// concurrently, so the same event arrives twice or more within moments: the
// fetcher skips the checks, encoding and publish of a copy whose id the
// stream already holds (docs/decisions/0043-fetcher-copies-already-published.md). It is shared by every relay worker of a fetcher.
type recentIDs struct {
	mu   sync.Mutex
	ttl  time.Duration
	m    map[recentKey]uint64 // key → sequence of its latest insert
	ring []recentEntry        // by sequence modulo its length
	next uint64
}

type recentEntry struct {
	key recentKey
	seq uint64
	at  int64 // unix nanoseconds; 0: never used
}

// newRecentIDs remembers up to size ids (nil, which remembers nothing, for
// size < 1).
func newRecentIDs(size int, ttl time.Duration) *recentIDs {
	if size < 1 {
		return nil
	}
	return &recentIDs{ttl: ttl, m: make(map[recentKey]uint64, size), ring: make([]recentEntry, size)}
}

// add records that the stream acknowledged k at now.
func (r *recentIDs) add(k recentKey, now time.Time) {
	if r == nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	seq := r.next
	r.next++
	slot := &r.ring[seq%uint64(len(r.ring))]
	if old, ok := r.m[slot.key]; ok && old == slot.seq && slot.at != 0 {
		delete(r.m, slot.key)
	}
	*slot = recentEntry{key: k, seq: seq, at: now.UnixNano()}
	r.m[k] = seq
}

// has reports whether the stream acknowledged k less than the TTL before now.
func (r *recentIDs) has(k recentKey, now time.Time) bool {
	if r == nil {
		return false
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	seq, ok := r.m[k]
	if !ok {
		return false
	}
	e := r.ring[seq%uint64(len(r.ring))]
	return e.seq == seq && now.UnixNano()-e.at < int64(r.ttl)
}

// len is how many ids are remembered (expired ones included until replaced).
func (r *recentIDs) len() int {
	if r == nil {
		return 0
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.m)
}
