package fetcher

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/grasp-sync/grasp-sync/pkg/bus"
	"github.com/grasp-sync/grasp-sync/pkg/clock"
	"github.com/grasp-sync/grasp-sync/pkg/lease"
)

// Shard ownership is a lease per shard in a JetStream KV bucket whose
// MaxAge is the lease TTL (see docs/decisions/0014-leases-survive-load.md): a key written by its
// owner every TTL/4 stays, the key of a replica that died disappears after
// the TTL and the next replica in line creates it (compare-and-set). Live
// replicas announce themselves with member keys in the same bucket and
// split the shards by rendezvous hashing, so shards spread evenly and move
// only when membership changes. An owner keeps a shard while its lease is
// valid: a renewal that fails is retried, and one stored with its answer
// lost is recognised, until TTL − TTL/6 after the send of the last write
// known stored; only then, or when another replica holds the key, does it
// stop serving — before the server can expire the key — so two replicas
// never serve one shard (or relay) longer than the TTL (docs/decisions/0013-fetcher-shard-leases.md, pkg/lease).

// ShardLeaseConfig configures shard ownership.
type ShardLeaseConfig struct {
	// TTL is the lease time-to-live (bucket MaxAge).
	TTL time.Duration
	// Shards is the total shard count.
	Shards int
	// Fixed, when not empty, is the exact set of shards this replica
	// serves (no rendezvous); leases still keep two replicas off one shard.
	Fixed []int
}

// RendezvousShards returns the shards member should own among members:
// each shard goes to the member with the highest hash of (member, shard).
// It is pure, so every replica computes the same split from the same view.
func RendezvousShards(members []string, me string, shards int) []int {
	var out []int
	for s := range shards {
		best, bestScore := "", uint64(0)
		for _, m := range members {
			h := sha256.Sum256([]byte(m + "\x00" + strconv.Itoa(s)))
			if sc := binary.BigEndian.Uint64(h[:8]); best == "" || sc > bestScore || (sc == bestScore && m < best) {
				best, bestScore = m, sc
			}
		}
		if best == me {
			out = append(out, s)
		}
	}
	return out
}

// Why a shard stops being served (lose's reason), and the label each has on
// grasp_fetcher_shard_releases_total: under load alone only the first two
// should ever be counted (docs/decisions/0014-leases-survive-load.md).
const (
	releaseRebalanced = "rebalanced to another replica"
	releaseStopping   = "fetcher stopping"
	releaseTakenOver  = "lease taken over by another replica"
	releaseGone       = "lease expired or deleted on the server"
	releaseExpired    = "lease not renewed before it could expire"
)

// releaseLabel is the metric label of a release reason.
func releaseLabel(reason string) string {
	switch reason {
	case releaseRebalanced:
		return "rebalanced"
	case releaseStopping:
		return "stopping"
	case releaseTakenOver:
		return "taken_over"
	case releaseGone:
		return "gone"
	case releaseExpired:
		return "not_renewed"
	}
	return "other"
}

// shardLeases runs the lease protocol for one replica. Each shard held has
// a holder goroutine of its own that renews its lease on the lease's own
// timeline (see hold), so a slow round of membership and claims, or a slow
// renewal of one shard, never delays another shard's renewal; run's
// goroutine announces the member, computes the split, claims and hands
// shards over.
type shardLeases struct {
	kv     jetstream.KeyValue
	id     string
	cfg    ShardLeaseConfig
	timing lease.Timing
	// clock times renewals and deadlines. It must run at real speed
	// against the NATS server, whose clock expires the keys, so the
	// fetcher passes clock.Real even where its other timers are faked.
	clock  clock.Clock
	log    *slog.Logger
	gain   func(shard int)
	lose   func(shard int, reason string)
	member string

	held map[int]*holder // run's goroutine only
	// seen and want are the last round's view (run's goroutine only):
	// the replicas seen and the shards this one should hold.
	seen []string
	want []int
	gone chan int // a holder's shard when its holder has ended
}

// holder is run's handle on one shard's holder goroutine.
type holder struct {
	release   chan string // the reason to stop serving on purpose (at most one is sent)
	releasing bool
	// interrupt cuts short a renewal in progress when release is sent, so a
	// hand-over is not delayed by a renewal waiting on a silent server.
	interrupt context.CancelFunc
}

func newShardLeases(kv jetstream.KeyValue, id string, cfg ShardLeaseConfig, log *slog.Logger,
	gain func(int), lose func(int, string)) *shardLeases {
	return &shardLeases{kv: kv, id: id, cfg: cfg, log: log, gain: gain, lose: lose,
		// The owner stops TTL/6 before the earliest server-side expiry: the
		// time its relays' connections take to close (docs/decisions/0013-fetcher-shard-leases.md).
		timing: lease.Timing{TTL: cfg.TTL, Guard: cfg.TTL / 6},
		clock:  clock.Real{},
		held:   map[int]*holder{}, gone: make(chan int, max(cfg.Shards, 1)),
		member: bus.FetcherMemberKey(id)}
}

// run keeps the leases until ctx ends, then releases them so another
// replica takes over at once (a killed replica's leases expire instead).
//
// A round runs every TTL/3, and at once when the bucket shows a change the
// split depends on: a replica that was not a member (it joined: hand its
// shards over) or a member key deleted (it left), or the lease of a shard we
// want and do not hold deleted (its holder handed it over: claim it). A
// hand-over then takes the time the old holder needs to close its
// connections, not up to two rounds (docs/decisions/0073-shard-hand-over-on-change.md).
func (l *shardLeases) run(ctx context.Context) {
	changes := l.watch(ctx)
	for {
		l.step(ctx)
		next := l.clock.After(l.cfg.TTL / 3)
	wait:
		for {
			select {
			case <-ctx.Done():
				l.releaseAll()
				return
			case s := <-l.gone:
				delete(l.held, s)
			case e, ok := <-changes:
				if !ok {
					changes = nil // rounds on the timer alone
					continue
				}
				if l.changeMatters(e) {
					break wait
				}
			case <-next:
				break wait
			}
		}
	}
}

// watch returns the changes to member and shard keys from now on, or nil
// (rounds on the timer alone) when the bucket cannot be watched. The watch
// ends with ctx.
func (l *shardLeases) watch(ctx context.Context) <-chan jetstream.KeyValueEntry {
	w, err := l.kv.WatchFiltered(ctx, []string{bus.FetcherMemberKeys, bus.FetcherShardKeys}, jetstream.UpdatesOnly())
	if err != nil {
		l.log.Warn("fetcher leases not watched; shards move on the round's timer alone", "err", err)
		return nil
	}
	return w.Updates()
}

// changeMatters reports whether a change to the lease bucket can change
// what this replica should hold or can claim now.
func (l *shardLeases) changeMatters(e jetstream.KeyValueEntry) bool {
	if e == nil {
		return false
	}
	deleted := e.Operation() != jetstream.KeyValuePut
	if strings.HasPrefix(e.Key(), strings.TrimSuffix(bus.FetcherMemberKeys, "*")) {
		// Members renew their keys every round: only a new one or one
		// leaving changes the split.
		return len(l.cfg.Fixed) == 0 && (deleted || !slices.Contains(l.seen, string(e.Value())))
	}
	if !deleted {
		return false
	}
	for _, s := range l.want {
		if _, held := l.held[s]; !held && e.Key() == bus.FetcherShardKey(s) {
			return true
		}
	}
	return false
}

// step is one round: announce ourselves, hand over what moved to another
// replica, claim what we should hold and is free. Renewals are the
// holders' (hold). Every call has its own deadline, so one slow call does
// not starve the rest of the round.
func (l *shardLeases) step(ctx context.Context) {
	pctx, cancel := context.WithTimeout(ctx, l.cfg.TTL/3)
	_, err := l.kv.Put(pctx, l.member, []byte(l.id))
	cancel()
	if err != nil && ctx.Err() == nil {
		l.log.Warn("fetcher membership not renewed", "err", err)
	}
	want := l.cfg.Fixed
	if len(want) == 0 {
		mctx, cancel := context.WithTimeout(ctx, l.cfg.TTL/3)
		members, err := l.members(mctx)
		cancel()
		if err != nil {
			// A partial or empty view only makes us want more shards, which
			// other holders' leases refuse: it never gives one up.
			l.log.Warn("fetcher members not listed", "err", err)
			members = nil
		}
		if !slices.Contains(members, l.id) {
			members = append(members, l.id)
		}
		l.seen = members
		want = RendezvousShards(members, l.id, l.cfg.Shards)
	}
	l.want = want
	for s, h := range l.held {
		if !slices.Contains(want, s) && !h.releasing {
			// Stop serving first, then free the lease for the new owner (hold).
			h.releasing = true
			h.release <- releaseRebalanced
			h.interrupt()
		}
	}
	for _, s := range want {
		if _, ok := l.held[s]; ok || ctx.Err() != nil {
			continue
		}
		l.claim(ctx, s)
	}
}

// claim takes shard s if its lease is free (or ours from before a restart
// under the same id), then serves it and starts its holder.
func (l *shardLeases) claim(ctx context.Context, s int) {
	key := bus.FetcherShardKey(s)
	cctx, cancel := context.WithTimeout(ctx, l.cfg.TTL/3)
	defer cancel()
	sent := l.clock.Now()
	rev, err := l.kv.Create(cctx, key, []byte(l.id))
	if errors.Is(err, jetstream.ErrKeyExists) {
		// Ours from before a restart under the same id, or from a Create or a
		// term of ours that ended (its shard stopped since)?
		e, gerr := l.kv.Get(cctx, key)
		if gerr != nil || string(e.Value()) != l.id {
			return
		}
		sent = l.clock.Now()
		rev, err = l.kv.Update(cctx, key, []byte(l.id), e.Revision())
	}
	if err != nil {
		return
	}
	l.gain(s)
	hctx, interrupt := context.WithCancel(context.Background())
	h := &holder{release: make(chan string, 1), interrupt: interrupt}
	l.held[s] = h
	go l.hold(hctx, s, h, lease.Held{Rev: rev, Sent: sent})
}

// hold keeps shard s's lease while the shard is served: it renews every
// TTL/4 from the send of the last stored write, retries a failed renewal
// every TTL/15 until the lease's deadline, and recognises a renewal stored
// with its answer lost (pkg/lease). It calls lose only when another holder
// has the key, the key is gone, or the deadline passed (the server may
// expire the key from then on: docs/decisions/0014-leases-survive-load.md). Asked to release, it hands the shard over (handOver). It tells
// run when it ends.
func (l *shardLeases) hold(ctx context.Context, s int, h *holder, ls lease.Held) {
	defer func() { l.gone <- s }()
	defer h.interrupt()
	log := l.log.With("shard", s)
	next := ls.Sent.Add(l.timing.RenewEvery())
	for {
		wake := next
		if d := ls.Deadline(l.timing); d.Before(wake) {
			wake = d
		}
		select {
		case reason := <-h.release:
			l.handOver(s, ls, reason)
			return
		case <-l.clock.After(wake.Sub(l.clock.Now())):
		}
		now := l.clock.Now()
		if ls.Expired(l.timing, now) {
			log.Warn("shard lease not renewed before it could expire; releasing the shard",
				"last_renewal_sent", ls.Sent, "ttl", l.cfg.TTL)
			l.lose(s, releaseExpired)
			return
		}
		var (
			v      lease.Verdict
			reason string
			err    error
		)
		ls, v, reason, err = l.renew(ctx, s, ls, ls.Deadline(l.timing))
		switch {
		case err == nil || v == lease.Adopted:
			if v == lease.Adopted {
				log.Info("shard lease renewal was stored though its answer was lost; kept", "err", err)
			}
			next = ls.Sent.Add(l.timing.RenewEvery())
		case v == lease.Lost:
			log.Warn("shard lease lost", "reason", reason, "err", err)
			l.lose(s, reason)
			return
		default:
			log.Warn("shard lease renewal failed; retrying until the lease could expire", "err", err,
				"deadline", ls.Deadline(l.timing))
			next = l.clock.Now().Add(l.timing.RetryEvery())
		}
	}
}

// renew sends one renewal of shard s's lease, waiting at most TTL/3 and
// not past until for its answer. On failure it reads the key back, waiting
// until `until` at most, to learn what happened (lease.Held.Judge): the
// renewal may have been stored with its answer late or lost, or another
// replica may hold the key. err is the renewal's error (nil: renewed).
func (l *shardLeases) renew(ctx context.Context, s int, ls lease.Held, until time.Time) (_ lease.Held, _ lease.Verdict, reason string, err error) {
	key := bus.FetcherShardKey(s)
	sent := l.clock.Now()
	ls = ls.Sending(sent)
	uctx, cancel := context.WithTimeout(ctx, min(l.cfg.TTL/3, until.Sub(sent)))
	rev, err := l.kv.Update(uctx, key, []byte(l.id), ls.Rev)
	cancel()
	if err == nil {
		return ls.Stored(rev, sent), lease.Retry, "", nil
	}
	// The read may use all the time left: a server slow to answer the
	// renewal is slow to answer this too, and what it answers decides.
	rctx, cancel := context.WithTimeout(ctx, until.Sub(l.clock.Now()))
	defer cancel()
	var rb lease.ReadBack
	e, gerr := l.kv.Get(rctx, key)
	switch {
	case errors.Is(gerr, jetstream.ErrKeyNotFound), errors.Is(gerr, jetstream.ErrKeyDeleted):
		reason = releaseGone
	case gerr != nil:
		rb.Err = gerr
	default:
		rb = lease.ReadBack{Found: true, Ours: string(e.Value()) == l.id, Rev: e.Revision()}
		if !rb.Ours {
			reason = releaseTakenOver
		}
	}
	next, v := ls.Judge(rb)
	return next, v, reason, err
}

func (l *shardLeases) members(ctx context.Context) ([]string, error) {
	lister, err := l.kv.ListKeysFiltered(ctx, bus.FetcherMemberKeys)
	if err != nil {
		return nil, err
	}
	var out []string
	for k := range lister.Keys() {
		e, err := l.kv.Get(ctx, k)
		if err != nil {
			continue
		}
		out = append(out, string(e.Value()))
	}
	return out, nil
}

// releaseAll hands every shard over and gives up the membership (graceful
// stop): the holders stop their shards concurrently, each freeing its lease
// once its shard has stopped.
func (l *shardLeases) releaseAll() {
	for _, h := range l.held {
		if !h.releasing {
			h.releasing = true
			h.release <- releaseStopping
			h.interrupt()
		}
	}
	for len(l.held) > 0 {
		delete(l.held, <-l.gone)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_ = l.kv.Delete(ctx, l.member)
}

// releaseRenewMax bounds how long handOver keeps renewing a lease while
// its shard's connections close: a close that hangs longer lets it lapse,
// so another replica takes the shard over anyway.
const releaseRenewMax = 30 * time.Second

// handOver stops serving shard s, then deletes its lease so the next owner
// takes over at once. Stopping a shard waits for its relay connections to
// close — 2 s for a relay that ignores the close handshake, more under
// load — which can outlast a lease not renewed meanwhile: the other replica
// would then connect to a relay ours is still connected to. So the lease is
// renewed as usual until the shard has stopped (for at most
// releaseRenewMax); the other shards' holders keep renewing theirs.
func (l *shardLeases) handOver(s int, ls lease.Held, reason string) {
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		l.lose(s, reason)
	}()
	renewUntil := l.clock.Now().Add(releaseRenewMax)
	next := ls.Sent.Add(l.timing.RenewEvery())
	held := true
	for held {
		var wake <-chan time.Time
		if next.Before(renewUntil) {
			wake = l.clock.After(next.Sub(l.clock.Now()))
		}
		select {
		case <-stopped:
			l.free(s, ls)
			return
		case <-wake:
		}
		var v lease.Verdict
		var err error
		now := l.clock.Now()
		ls, v, _, err = l.renew(context.Background(), s, ls, now.Add(l.cfg.TTL/3))
		switch {
		case err == nil || v == lease.Adopted:
			next = ls.Sent.Add(l.timing.RenewEvery())
		case v == lease.Lost:
			held = false
		default:
			l.log.Warn("shard lease not renewed while its connections close", "shard", s, "err", err)
			next = l.clock.Now().Add(l.timing.RetryEvery())
		}
	}
	<-stopped // the lease is gone: nothing to free
}

// free deletes shard s's lease if it is still ours: at the revision last
// known stored, or — when a renewal was stored with its answer lost — at
// the revision read back, if it still names us.
func (l *shardLeases) free(s int, ls lease.Held) {
	key := bus.FetcherShardKey(s)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	err := l.kv.Delete(ctx, key, jetstream.LastRevision(ls.Rev))
	if err != nil {
		if e, gerr := l.kv.Get(ctx, key); gerr == nil && e.Revision() > ls.Rev && string(e.Value()) == l.id {
			err = l.kv.Delete(ctx, key, jetstream.LastRevision(e.Revision()))
		}
	}
	if err != nil {
		l.log.Warn("shard lease not freed; it will expire", "shard", s, "err", err)
	}
}
