// Package leader elects one active instance of a role (discovery, planner)
// among hot standbys, with a lease in a JetStream KV bucket.
//
// The lease is one key. A candidate acquires it with Create (compare-and-set
// on "no value"), renews it with Update at the revision it last wrote, and
// releases it with a revision-checked Delete on a clean stop. The bucket's TTL
// (MaxAge, see bus.SetupLeases) removes the key when its holder dies without
// releasing: every renewal is a new message, so the key lives TTL past the
// last one. Standbys watch the key and retry Create as soon as it is deleted
// or expires (and poll, in case a notification is missed).
//
// The epoch of a term is the stream revision of the Create that won it.
// JetStream sequence numbers only grow, even after every message of the
// bucket has expired, so every term's epoch is strictly greater than every
// earlier term's epoch, with nothing extra to persist. (Deleting and
// recreating the lease bucket would restart them; nothing in grasp-sync does
// that.)
//
// Safety: a holder stops leading (cancels the lead context) at
// lastRenewalSent + TTL − TTL/5, and the server cannot expire the key before
// lastRenewalStored + bucketTTL, which is later as long as TTL ≤ the bucket's
// TTL and the two clocks run at the same rate. So two leads never overlap,
// provided lead returns promptly when its context ends.
//
// Liveness under load (docs/decisions/0014-leases-survive-load.md): until
// that deadline a holder keeps leading. A renewal that fails is retried every
// TTL/15, and a renewal refused or unanswered is judged by reading the key
// back: one of our own renewals stored with its answer lost (the key names
// this holder and term at a newer revision) continues the term, counted from
// the first unanswered renewal's sending (pkg/lease). Only a key held by
// someone else, a key gone, or the deadline ends the term.
package leader

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/grasp-sync/grasp-sync/pkg/clock"
	"github.com/grasp-sync/grasp-sync/pkg/lease"
)

// DefaultTTL is the lease duration when neither Config.TTL nor the bucket
// says otherwise.
const DefaultTTL = 10 * time.Second

// Config of an election.
type Config struct {
	// KV is a bucket created for leases (bus.SetupLeases): it must have a
	// TTL, which is what takes the lease from a holder that died.
	KV jetstream.KeyValue
	// Key names the role being elected, e.g. "discovery".
	Key string
	// ID identifies this candidate in the lease value and in logs.
	ID string
	// TTL is the lease: the holder renews every TTL/4, retries a renewal
	// that failed until 4/5 of the TTL after the last stored one was sent,
	// and stops leading then. Default: the bucket's TTL; it must
	// not exceed the bucket's TTL, or the server could expire the key while
	// the holder still thinks it leads.
	TTL time.Duration
	// Clock times renewals and the holder's own deadline. It must run at
	// real speed relative to the NATS server, whose clock expires the key.
	Clock clock.Clock
	// Log receives term changes (acquired, lost, released).
	Log *slog.Logger
}

// Lease is the value stored under the lease key, for operators and tools.
type Lease struct {
	// Holder is the ID of the candidate holding the lease.
	Holder string `json:"holder"`
	// Epoch is the holder's term (0 in the instant between acquiring and
	// the first renewal).
	Epoch uint64 `json:"epoch"`
}

// ErrLost is the cause of a lead context cancelled because the lease was
// lost (renewal refused or not confirmed in time).
var ErrLost = errors.New("leader: lease lost")

// ErrStopped is the cause of a lead context cancelled because Run's context
// ended.
var ErrStopped = errors.New("leader: stopping")

// Current returns the lease currently stored under key, or ok=false when no
// one holds it.
func Current(ctx context.Context, kv jetstream.KeyValue, key string) (l Lease, ok bool, err error) {
	e, err := kv.Get(ctx, key)
	if errors.Is(err, jetstream.ErrKeyNotFound) || errors.Is(err, jetstream.ErrKeyDeleted) {
		return Lease{}, false, nil
	}
	if err != nil {
		return Lease{}, false, fmt.Errorf("read lease %s: %w", key, err)
	}
	if err := json.Unmarshal(e.Value(), &l); err != nil {
		return Lease{}, false, fmt.Errorf("decode lease %s: %w", key, err)
	}
	return l, true, nil
}

// Run campaigns until ctx is done; whenever this candidate holds the lease it
// calls lead with a context that is cancelled as soon as the lease is lost or
// ctx ends, and an epoch that is strictly greater than every earlier term's
// epoch for this Key. Run returns nil when ctx is done, after lead has
// returned and the lease has been released; it returns an error for an
// invalid configuration or when lead returns an error while leading (after
// releasing the lease). A lead that returns nil early gives the lease back and
// campaigns again.
func Run(ctx context.Context, cfg Config, lead func(ctx context.Context, epoch uint64) error) error {
	e, err := newElection(ctx, cfg)
	if err != nil {
		if ctx.Err() != nil {
			return nil // stopped before the election started
		}
		return err
	}
	for {
		rev, acquiredAt, err := e.campaign(ctx)
		if err != nil {
			return nil // ctx done
		}
		if err := e.term(ctx, rev, acquiredAt, lead); err != nil {
			return err
		}
		if ctx.Err() != nil {
			return nil
		}
	}
}

// election is one candidate's state.
type election struct {
	cfg     Config
	log     *slog.Logger
	ttl     time.Duration
	timing  lease.Timing  // TTL and the holder's guard (TTL/5) before the server's expiry
	renew   time.Duration // renewal period
	poll    time.Duration // standby's retry period when no watch notification comes
	timeout time.Duration // bound of one KV call
}

func newElection(ctx context.Context, cfg Config) (*election, error) {
	switch {
	case cfg.KV == nil:
		return nil, errors.New("leader: Config.KV is nil")
	case cfg.Key == "":
		return nil, errors.New("leader: Config.Key is empty")
	case cfg.ID == "":
		return nil, errors.New("leader: Config.ID is empty")
	case cfg.TTL < 0:
		return nil, fmt.Errorf("leader: negative TTL %s", cfg.TTL)
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.Real{}
	}
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	st, err := cfg.KV.Status(ctx)
	if err != nil {
		return nil, fmt.Errorf("leader: status of lease bucket: %w", err)
	}
	bucketTTL := st.TTL()
	if bucketTTL <= 0 {
		return nil, fmt.Errorf("leader: lease bucket %s has no TTL, so a dead holder would keep the lease forever", st.Bucket())
	}
	ttl := cfg.TTL
	if ttl == 0 {
		ttl = bucketTTL
	}
	if ttl > bucketTTL {
		return nil, fmt.Errorf("leader: TTL %s exceeds the lease bucket's TTL %s", ttl, bucketTTL)
	}
	return &election{
		cfg:     cfg,
		log:     cfg.Log.With("lease", cfg.Key, "candidate", cfg.ID),
		ttl:     ttl,
		timing:  lease.Timing{TTL: ttl, Guard: ttl / 5},
		renew:   lease.Timing{TTL: ttl}.RenewEvery(),
		poll:    max(bucketTTL/4, 50*time.Millisecond),
		timeout: max(ttl/3, 100*time.Millisecond),
	}, nil
}

func (e *election) value(epoch uint64) []byte {
	b, _ := json.Marshal(Lease{Holder: e.cfg.ID, Epoch: epoch})
	return b
}

// campaign returns once this candidate has created the lease key: its
// revision (the epoch) and when the Create was sent (the lease runs from
// then, conservatively). It returns an error only when ctx ends.
func (e *election) campaign(ctx context.Context) (rev uint64, sent time.Time, err error) {
	// Watch before the first attempt, so a release between the attempt and
	// the watch cannot be missed. The watch is an optimisation (prompt
	// takeover); polling alone is correct.
	var updates <-chan jetstream.KeyValueEntry
	if w, err := e.cfg.KV.Watch(ctx, e.cfg.Key, jetstream.UpdatesOnly()); err == nil {
		defer func() { _ = w.Stop() }()
		updates = w.Updates()
	} else {
		e.log.Warn("cannot watch lease, polling only", "err", err)
	}
	standby := false
	for {
		sent = e.cfg.Clock.Now()
		cctx, cancel := context.WithTimeout(ctx, e.timeout)
		rev, err := e.cfg.KV.Create(cctx, e.cfg.Key, e.value(0))
		cancel()
		switch {
		case err == nil:
			return rev, sent, nil
		case ctx.Err() != nil:
			return 0, time.Time{}, ctx.Err()
		case errors.Is(err, jetstream.ErrKeyExists):
			if !standby {
				standby = true
				e.log.Info("standing by: lease held by another candidate")
			}
		default:
			e.log.Warn("lease acquisition failed", "err", err)
		}
		if err := e.waitForRelease(ctx, &updates); err != nil {
			return 0, time.Time{}, err
		}
	}
}

// waitForRelease returns when the lease key was deleted or expired (as
// reported by the watch), when the poll period has passed, or with ctx's
// error.
func (e *election) waitForRelease(ctx context.Context, updates *<-chan jetstream.KeyValueEntry) error {
	poll := e.cfg.Clock.After(e.poll)
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-poll:
			return nil
		case entry, ok := <-*updates:
			if !ok {
				*updates = nil // watch ended (connection closed): poll only
				continue
			}
			if entry != nil && entry.Operation() != jetstream.KeyValuePut {
				return nil
			}
		}
	}
}

// term runs lead while the lease is held, renewing it. It returns nil when
// the term ended (lease lost, lead returned nil, or ctx done) and lead's
// error when lead failed.
func (e *election) term(ctx context.Context, rev uint64, acquiredAt time.Time, lead func(context.Context, uint64) error) error {
	epoch := rev
	log := e.log.With("epoch", epoch)
	log.Info("lease acquired, leading")

	leadCtx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	done := make(chan error, 1)
	go func() { done <- lead(leadCtx, epoch) }()

	held := lease.Held{Rev: rev, Sent: acquiredAt}
	renewAt := e.cfg.Clock.After(0) // stamp the epoch into the value at once
	expired := e.cfg.Clock.After(held.Deadline(e.timing).Sub(e.cfg.Clock.Now()))
	for {
		select {
		case <-renewAt:
			sent := e.cfg.Clock.Now()
			if held.Expired(e.timing, sent) {
				// The deadline's own case may not have been chosen yet.
				log.Warn("lease lost: not renewed in time", "deadline", held.Deadline(e.timing))
				return e.stepDown(cancel, done, ErrLost)
			}
			held = held.Sending(sent)
			rctx, rcancel := context.WithTimeout(ctx, e.timing.AttemptTimeout(held, sent))
			next, err := e.cfg.KV.Update(rctx, e.cfg.Key, e.value(epoch), held.Rev)
			rcancel()
			if err == nil {
				held = held.Stored(next, sent)
				expired = e.cfg.Clock.After(held.Deadline(e.timing).Sub(e.cfg.Clock.Now()))
				renewAt = e.cfg.Clock.After(sent.Add(e.renew).Sub(e.cfg.Clock.Now()))
				continue
			}
			if ctx.Err() != nil {
				continue // stopping: handled by the ctx.Done case
			}
			// Refused, or no answer in time: the key read back tells whether
			// the renewal was stored after all, or someone else holds it.
			var verdict lease.Verdict
			held, verdict = held.Judge(e.readBack(ctx, held, epoch))
			switch verdict {
			case lease.Adopted:
				log.Info("lease renewal was stored though its answer was lost; still leading", "err", err)
				expired = e.cfg.Clock.After(held.Deadline(e.timing).Sub(e.cfg.Clock.Now()))
				renewAt = e.cfg.Clock.After(held.Sent.Add(e.renew).Sub(e.cfg.Clock.Now()))
			case lease.Lost:
				// Someone else wrote the key: our lease expired and was taken,
				// or was deleted. Stop at once.
				log.Warn("lease lost: renewal refused", "err", err)
				return e.stepDown(cancel, done, ErrLost)
			default:
				log.Warn("lease renewal failed, retrying until the lease runs out", "err", err,
					"deadline", held.Deadline(e.timing))
				renewAt = e.cfg.Clock.After(e.timing.RetryEvery())
			}
		case <-expired:
			if !held.Expired(e.timing, e.cfg.Clock.Now()) {
				continue // a stale timer from before the last renewal
			}
			log.Warn("lease lost: not renewed in time", "deadline", held.Deadline(e.timing))
			return e.stepDown(cancel, done, ErrLost)
		case err := <-done:
			e.release(epoch, held.Rev, log)
			if err != nil && ctx.Err() == nil {
				return fmt.Errorf("leader %s (epoch %d): %w", e.cfg.Key, epoch, err)
			}
			if ctx.Err() == nil {
				// Give the others a chance before campaigning again.
				select {
				case <-ctx.Done():
				case <-e.cfg.Clock.After(e.renew):
				}
			}
			return nil
		case <-ctx.Done():
			_ = e.stepDown(cancel, done, ErrStopped)
			e.release(epoch, held.Rev, log)
			return nil
		}
	}
}

// readBack reads the lease after a renewal that failed, waiting at most
// until the holder's deadline: a server slow to answer the renewal is slow
// to answer this too, and what it answers decides (lease.Held.Judge).
func (e *election) readBack(ctx context.Context, held lease.Held, epoch uint64) lease.ReadBack {
	rctx, cancel := context.WithTimeout(ctx, held.Deadline(e.timing).Sub(e.cfg.Clock.Now()))
	defer cancel()
	cur, err := e.cfg.KV.Get(rctx, e.cfg.Key)
	switch {
	case errors.Is(err, jetstream.ErrKeyNotFound), errors.Is(err, jetstream.ErrKeyDeleted):
		return lease.ReadBack{}
	case err != nil:
		return lease.ReadBack{Err: err}
	}
	return lease.ReadBack{Found: true, Ours: e.ours(cur, epoch), Rev: cur.Revision()}
}

// stepDown cancels lead and waits for it to return, so a new term (here or
// elsewhere, once the lease expires) never overlaps with this one.
func (e *election) stepDown(cancel context.CancelCauseFunc, done <-chan error, cause error) error {
	cancel(cause)
	if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
		e.log.Warn("lead returned an error while stepping down", "err", err)
	}
	return nil
}

// release deletes the lease if it is still ours, so a standby takes over at
// once instead of after the TTL. rev is the revision this term last knew it
// wrote; a renewal cut short by the stop may still have been stored after it
// (the request was sent, only its answer was not awaited), so when the
// revision-checked Delete is refused, the lease is read back and deleted at
// its stored revision if it still names this holder and term.
func (e *election) release(epoch, rev uint64, log *slog.Logger) {
	ctx, cancel := context.WithTimeout(context.Background(), e.timeout)
	defer cancel()
	err := e.cfg.KV.Delete(ctx, e.cfg.Key, jetstream.LastRevision(rev))
	if err != nil && !errors.Is(err, jetstream.ErrKeyNotFound) {
		if cur, gerr := e.cfg.KV.Get(ctx, e.cfg.Key); gerr == nil && cur.Revision() != rev && e.ours(cur, epoch) {
			err = e.cfg.KV.Delete(ctx, e.cfg.Key, jetstream.LastRevision(cur.Revision()))
		}
	}
	if err != nil {
		log.Warn("lease not released; it will expire", "err", err)
		return
	}
	log.Info("lease released")
}

// ours reports whether a stored lease is this candidate's term epoch: its
// value names us and the epoch, or it is the term's Create itself (stored
// with epoch 0 before the first renewal stamps it).
func (e *election) ours(cur jetstream.KeyValueEntry, epoch uint64) bool {
	if cur.Operation() != jetstream.KeyValuePut {
		return false
	}
	var l Lease
	if json.Unmarshal(cur.Value(), &l) != nil || l.Holder != e.cfg.ID {
		return false
	}
	return l.Epoch == epoch || (l.Epoch == 0 && cur.Revision() == epoch)
}
