// Package lease is the arithmetic of a lease kept as one key in a JetStream
// KV bucket whose MaxAge expires it (pkg/leader's leadership, the fetcher's
// shards): until when its holder may act, when to renew it, and what a
// renewal whose answer did not come means, judged from the key read back.
// It does no I/O, so the rules are tested with explicit times.
//
// The clock rule (docs/decisions/0014-leases-survive-load.md): the server
// expires a key MaxAge after it stored the key's last write, and it stored
// that write after the holder sent it. So a holder that counts its lease from
// the moment it sent its last stored write, and stops Guard before that plus
// the TTL, has stopped before the server can expire the key and let another
// holder in — whatever the write's round trip took — as long as the two
// clocks run at the same rate and TTL ≤ the bucket's MaxAge. Until then a
// renewal that failed is only retried: under load a write can be slow, or be
// stored while its answer is lost, and neither loses the lease.
package lease

import "time"

// Timing is how a holder times one lease.
type Timing struct {
	// TTL is the lease, at most the bucket's MaxAge.
	TTL time.Duration
	// Guard is how long before the earliest possible server-side expiry the
	// holder stops: the time it needs to stop acting (closing connections,
	// returning from a leadership term) plus slack for late timers.
	Guard time.Duration
}

// RenewEvery is the renewal period after a stored write. A quarter of the
// TTL leaves TTL·3/4 − Guard after a renewal is due (7/12 of the TTL with
// the fetcher's TTL/6 guard) for it and its retries: a server that does not
// answer for over a third of the TTL — one renewal's timeout — still gets
// its next answer in before the deadline.
func (t Timing) RenewEvery() time.Duration { return t.TTL / 4 }

// RetryEvery is the pause after a renewal that failed before the next
// attempt: short, so a slow server gets many chances before the deadline,
// and not zero, so a server that refuses at once is not hammered.
func (t Timing) RetryEvery() time.Duration { return max(t.TTL/15, 10*time.Millisecond) }

// AttemptTimeout bounds one renewal sent at now: a third of the TTL, and
// never past the holder's deadline, so a hung call cannot keep the holder
// acting past it. It is zero or negative once the deadline has passed. A
// renewal that timed out may still have been stored: Judge tells from the
// key read back.
func (t Timing) AttemptTimeout(h Held, now time.Time) time.Duration {
	return min(t.TTL/3, h.Deadline(t).Sub(now))
}

// Held is what a holder knows of its lease.
type Held struct {
	// Rev is the revision of the last write known to be stored.
	Rev uint64
	// Sent is when that write was sent. The server stored it later, so the
	// key cannot expire before Sent + TTL.
	Sent time.Time
	// Unconfirmed is when the first write sent since Rev was sent whose
	// answer has not come (zero: none). Every renewal is a compare-and-set
	// at Rev, so at most one of them can be stored, and if one was, it was
	// sent at Unconfirmed or later.
	Unconfirmed time.Time
}

// Deadline is when the holder must have stopped acting: Guard before the
// earliest moment the server can expire the key.
func (h Held) Deadline(t Timing) time.Time { return h.Sent.Add(t.TTL - t.Guard) }

// Expired reports whether the holder has reached its deadline and must stop.
func (h Held) Expired(t Timing, now time.Time) bool { return !now.Before(h.Deadline(t)) }

// Sending records a renewal sent at now.
func (h Held) Sending(now time.Time) Held {
	if h.Unconfirmed.IsZero() {
		h.Unconfirmed = now
	}
	return h
}

// Stored records the answer to the renewal sent at sent: it was stored as
// rev. Earlier attempts at the same revision were not stored (this one would
// have been refused), so the lease runs from this one's sending.
func (h Held) Stored(rev uint64, sent time.Time) Held {
	return Held{Rev: rev, Sent: sent}
}

// ReadBack is the lease key as read after a renewal that failed.
type ReadBack struct {
	// Err is set when the read itself failed: nothing was learned.
	Err error
	// Found is false when the key is gone (expired or deleted).
	Found bool
	// Ours is true when the stored value names this holder (and term).
	Ours bool
	// Rev is the stored revision.
	Rev uint64
}

// Verdict is what a failed renewal means.
type Verdict int

const (
	// Retry: nothing changed that the holder can see (the write was not
	// stored, or the read failed); renew again before the deadline.
	Retry Verdict = iota
	// Adopted: a renewal was stored though its answer did not come; the
	// lease continues at the stored revision.
	Adopted
	// Lost: another holder has the key, or it is gone; stop at once.
	Lost
)

func (v Verdict) String() string {
	switch v {
	case Retry:
		return "retry"
	case Adopted:
		return "adopted"
	case Lost:
		return "lost"
	}
	return "unknown"
}

// Judge decides what a failed renewal means from the key read back. A key
// that names this holder at a newer revision than Rev holds one of its own
// renewals, stored with its answer lost or late (nothing else writes our
// value at a newer revision: every renewal is a compare-and-set at Rev); the
// lease then runs from Unconfirmed, the earliest moment that write can have
// been sent. A key that names another holder, or no key, means the lease is
// lost: a refused compare-and-set is never retried blindly.
func (h Held) Judge(rb ReadBack) (Held, Verdict) {
	switch {
	case rb.Err != nil:
		return h, Retry
	case !rb.Found || !rb.Ours:
		return h, Lost
	case rb.Rev > h.Rev && !h.Unconfirmed.IsZero():
		return Held{Rev: rb.Rev, Sent: h.Unconfirmed}, Adopted
	default:
		// Ours at the revision we know: the renewal was not stored.
		return h, Retry
	}
}
