package bus

import (
	"context"
	"sync"
)

// ByteGate bounds the bytes of messages a process holds between two points
// (pulled but not yet acknowledged, published but not yet acknowledged):
// Acquire waits while the bytes held would exceed the gate's size, Release
// gives them back. Work in flight is bounded by bytes, not by message
// counts, because one events-stream message carries from one event to a
// whole batch of them (docs/decisions/0065-work-in-flight-bounded-by-bytes.md).
// A message larger than the whole gate is let through alone, so no message
// can wait forever. The zero value is not usable: see NewByteGate.
type ByteGate struct {
	size int64

	mu   sync.Mutex
	used int64
	peak int64
	// wake is closed (and replaced) when bytes are released.
	wake chan struct{}
}

// NewByteGate is a gate of size bytes (at least 1).
func NewByteGate(size int64) *ByteGate {
	return &ByteGate{size: max(size, 1), wake: make(chan struct{})}
}

// Size is the gate's bound in bytes.
func (g *ByteGate) Size() int64 { return g.size }

// Acquire takes n bytes, waiting until they fit or ctx is done. It returns
// what it took (n, or the gate's size for a message larger than the gate),
// which is what Release must be given back.
func (g *ByteGate) Acquire(ctx context.Context, n int64) (int64, error) {
	n = min(max(n, 0), g.size)
	for {
		g.mu.Lock()
		if g.used+n <= g.size {
			g.used += n
			g.peak = max(g.peak, g.used)
			g.mu.Unlock()
			return n, nil
		}
		wake := g.wake
		g.mu.Unlock()
		select {
		case <-wake:
		case <-ctx.Done():
			return 0, ctx.Err()
		}
	}
}

// Release gives back n bytes taken by Acquire (clamped as Acquire clamps,
// so the caller may pass the message's size again).
func (g *ByteGate) Release(n int64) {
	n = min(n, g.size)
	if n <= 0 {
		return
	}
	g.mu.Lock()
	g.used = max(g.used-n, 0)
	close(g.wake)
	g.wake = make(chan struct{})
	g.mu.Unlock()
}

// Used is the bytes held now.
func (g *ByteGate) Used() int64 {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.used
}

// Peak is the most bytes held at once since the gate was made.
func (g *ByteGate) Peak() int64 {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.peak
}
