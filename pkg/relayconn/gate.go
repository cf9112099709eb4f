package relayconn

import (
	"context"
	"sync"
)

// slotGate counts the subscriptions (REQs and channels) open on a
// connection against the relay's limit: strfry refuses the one over it with
// a NOTICE and never answers it, so the only safe way is not to send it.
// Live subscriptions stay open for the session, so they may hold at most
// limit − reserved slots: reads that end (pages, NIP-77 sessions, id
// fetches) always find one soon.
type slotGate struct {
	mu              sync.Mutex
	limit, reserved int // limit 0: unbounded
	used, live      int
	// changed is closed (and replaced) whenever a slot frees or the limit
	// changes, waking every waiter to look again.
	changed chan struct{}
}

func (g *slotGate) init() { g.changed = make(chan struct{}) }

func (g *slotGate) wake() {
	close(g.changed)
	g.changed = make(chan struct{})
}

// fits says whether one more subscription of the class may open now.
func (g *slotGate) fits(live bool) bool {
	if g.limit <= 0 {
		return true
	}
	if g.used >= g.limit {
		return false
	}
	if live {
		return g.live < max(g.limit-g.reserved, 1)
	}
	return true
}

// acquire takes a slot, waiting while none is free; onWait is called once
// if it has to wait. It fails when ctx or the connection (conn) ends.
func (g *slotGate) acquire(ctx, conn context.Context, live bool, onWait func()) error {
	waited := false
	for {
		g.mu.Lock()
		if g.fits(live) {
			g.used++
			if live {
				g.live++
			}
			g.mu.Unlock()
			return nil
		}
		ch := g.changed
		g.mu.Unlock()
		if !waited {
			waited = true
			if onWait != nil {
				onWait()
			}
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return context.Cause(ctx)
		case <-conn.Done():
			return context.Cause(conn)
		}
	}
}

func (g *slotGate) release(live bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.used--
	if live {
		g.live--
	}
	g.wake()
}

func (g *slotGate) setLimit(limit, reserved int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.limit, g.reserved = limit, reserved
	g.wake()
}

// lower brings the limit down to n (never below 1) when it is higher.
func (g *slotGate) lower(n int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	n = max(n, 1)
	if g.limit <= 0 || n < g.limit {
		g.limit = n
		g.reserved = min(g.reserved, n/2)
		g.wake()
	}
}

func (g *slotGate) inUse() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.used
}
