package fetcher

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/grasp-sync/grasp-sync/pkg/bus"
)

// Shard ownership is a lease per shard in a JetStream KV bucket whose
// MaxAge is the lease TTL (see docs/decisions.md): a key written by its
// owner every TTL/3 stays, the key of a replica that died disappears after
// the TTL and the next replica in line creates it (compare-and-set). Live
// replicas announce themselves with member keys in the same bucket and
// split the shards by rendezvous hashing, so shards spread evenly and move
// only when membership changes. An owner that cannot renew stops serving a
// shard before its lease can expire on the server, so two replicas never
// serve one shard (or relay) longer than the TTL.

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

// shardLeases runs the lease protocol for one replica.
type shardLeases struct {
	kv     jetstream.KeyValue
	id     string
	cfg    ShardLeaseConfig
	log    *slog.Logger
	gain   func(shard int)
	lose   func(shard int, reason string)
	owned  map[int]lease
	member string
}

type lease struct {
	rev        uint64
	renewStart time.Time // before the last successful write: the server's expiry is later
}

func newShardLeases(kv jetstream.KeyValue, id string, cfg ShardLeaseConfig, log *slog.Logger,
	gain func(int), lose func(int, string)) *shardLeases {
	return &shardLeases{kv: kv, id: id, cfg: cfg, log: log, gain: gain, lose: lose,
		owned: map[int]lease{}, member: bus.FetcherMemberKey(id)}
}

// run keeps the leases until ctx ends, then releases them so another
// replica takes over at once (a killed replica's leases expire instead).
func (l *shardLeases) run(ctx context.Context) {
	tick := l.cfg.TTL / 3
	t := time.NewTicker(tick)
	defer t.Stop()
	for {
		l.step(ctx)
		select {
		case <-ctx.Done():
			l.releaseAll()
			return
		case <-t.C:
		}
	}
}

// step is one round: announce ourselves, renew or release what we hold,
// claim what we should hold and is free.
func (l *shardLeases) step(ctx context.Context) {
	octx, cancel := context.WithTimeout(ctx, l.cfg.TTL/3)
	defer cancel()
	if _, err := l.kv.Put(octx, l.member, []byte(l.id)); err != nil && ctx.Err() == nil {
		l.log.Warn("fetcher membership not renewed", "err", err)
	}
	want := l.cfg.Fixed
	if len(want) == 0 {
		members, err := l.members(octx)
		if err != nil {
			l.log.Warn("fetcher members not listed", "err", err)
			members = nil
		}
		if !slices.Contains(members, l.id) {
			members = append(members, l.id)
		}
		want = RendezvousShards(members, l.id, l.cfg.Shards)
	}
	var moved []int
	for s := range l.owned {
		if !slices.Contains(want, s) {
			moved = append(moved, s)
		}
	}
	if len(moved) > 0 {
		// Stop serving first, then free the lease for the new owner.
		slices.Sort(moved)
		l.release(moved, "rebalanced to another replica")
		// Releasing took its time: the rest of the round gets its own.
		var cancelRest context.CancelFunc
		octx, cancelRest = context.WithTimeout(ctx, l.cfg.TTL/3)
		defer cancelRest()
	}
	now := time.Now()
	for s, ls := range l.owned {
		start := time.Now()
		rev, err := l.kv.Update(octx, bus.FetcherShardKey(s), []byte(l.id), ls.rev)
		switch {
		case err == nil:
			l.owned[s] = lease{rev: rev, renewStart: start}
		case isConflict(err):
			delete(l.owned, s)
			l.lose(s, "lease taken over by another replica")
		case now.Sub(ls.renewStart) >= l.cfg.TTL-l.cfg.TTL/6:
			// Not renewed in time: the lease may expire on the server any
			// moment; stop before another replica can start.
			delete(l.owned, s)
			l.lose(s, fmt.Sprintf("lease not renewed: %v", err))
		default:
			l.log.Warn("shard lease renewal failed; retrying", "shard", s, "err", err)
		}
	}
	for _, s := range want {
		if _, ok := l.owned[s]; ok || ctx.Err() != nil {
			continue
		}
		start := time.Now()
		rev, err := l.kv.Create(octx, bus.FetcherShardKey(s), []byte(l.id))
		if errors.Is(err, jetstream.ErrKeyExists) {
			// Ours from before a restart under the same id?
			e, gerr := l.kv.Get(octx, bus.FetcherShardKey(s))
			if gerr != nil || string(e.Value()) != l.id {
				continue
			}
			rev, err = l.kv.Update(octx, bus.FetcherShardKey(s), []byte(l.id), e.Revision())
		}
		if err != nil {
			continue
		}
		l.owned[s] = lease{rev: rev, renewStart: start}
		l.gain(s)
	}
}

func isConflict(err error) bool {
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) && apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence {
		return true
	}
	return errors.Is(err, jetstream.ErrKeyNotFound) || errors.Is(err, jetstream.ErrKeyDeleted) ||
		strings.Contains(err.Error(), "wrong last sequence")
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

// releaseAll gives up every lease and the membership (graceful stop).
func (l *shardLeases) releaseAll() {
	shards := make([]int, 0, len(l.owned))
	for s := range l.owned {
		shards = append(shards, s)
	}
	slices.Sort(shards)
	l.release(shards, "fetcher stopping")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_ = l.kv.Delete(ctx, l.member)
}

// releaseRenewMax bounds how long release keeps renewing leases while
// shards' connections close: a close that hangs longer lets them lapse, so
// another replica takes the shards over anyway.
const releaseRenewMax = 30 * time.Second

// release stops serving shards, then deletes their leases so the next
// owner takes over at once. Stopping a shard waits for its relay
// connections to close — 2 s for a relay that ignores the close handshake,
// more under load — which can outlast a lease not renewed meanwhile: the
// other replica would then connect to a relay ours is still connected to.
// So every lease still held, these included, is renewed every TTL/3 until
// their shards are stopped (for at most releaseRenewMax). Shards stop
// concurrently; each lease goes as soon as its shard has stopped, each
// delete with its own deadline.
func (l *shardLeases) release(shards []int, reason string) {
	stopped := make(chan int, len(shards))
	for _, s := range shards {
		go func() {
			l.lose(s, reason)
			stopped <- s
		}()
	}
	tick := time.NewTicker(l.cfg.TTL / 3)
	defer tick.Stop()
	renewUntil := time.Now().Add(releaseRenewMax)
	for left := len(shards); left > 0; {
		select {
		case s := <-stopped:
			left--
			ls := l.owned[s]
			delete(l.owned, s)
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			_ = l.kv.Delete(ctx, bus.FetcherShardKey(s), jetstream.LastRevision(ls.rev))
			cancel()
		case <-tick.C:
			if time.Now().Before(renewUntil) {
				l.renewHeld()
			}
		}
	}
}

// renewHeld renews every lease held, each write with its own deadline; a
// lease that cannot be renewed is left to the next step.
func (l *shardLeases) renewHeld() {
	for s, ls := range l.owned {
		start := time.Now()
		ctx, cancel := context.WithTimeout(context.Background(), l.cfg.TTL/3)
		rev, err := l.kv.Update(ctx, bus.FetcherShardKey(s), []byte(l.id), ls.rev)
		cancel()
		if err != nil {
			l.log.Warn("shard lease not renewed while its connections close", "shard", s, "err", err)
			continue
		}
		l.owned[s] = lease{rev: rev, renewStart: start}
	}
}
