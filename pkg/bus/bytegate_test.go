package bus_test

import (
	"context"
	"errors"
	"testing"

	"github.com/grasp-sync/grasp-sync/pkg/bus"
)

// TestByteGate: bytes are taken while they fit, a message larger than the
// whole gate passes alone (clamped, so it cannot wait forever), a taker
// that does not fit waits until bytes are given back or its context ends.
func TestByteGate(t *testing.T) {
	g := bus.NewByteGate(100)
	ctx := context.Background()
	if n, err := g.Acquire(ctx, 60); n != 60 || err != nil {
		t.Fatalf("Acquire(60) = %d, %v", n, err)
	}
	done, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := g.Acquire(done, 50); !errors.Is(err, context.Canceled) {
		t.Fatalf("Acquire(50) with 60 of 100 held = %v, want it to wait (context canceled)", err)
	}
	got := make(chan int64)
	go func() {
		n, _ := g.Acquire(ctx, 500) // larger than the gate: waits for all of it
		got <- n
	}()
	g.Release(60)
	if n := <-got; n != 100 {
		t.Fatalf("Acquire(500) on a gate of 100 took %d, want 100", n)
	}
	if g.Used() != 100 || g.Peak() != 100 {
		t.Fatalf("used %d, peak %d, want 100 and 100", g.Used(), g.Peak())
	}
	g.Release(500) // given back as taken: clamped
	if g.Used() != 0 {
		t.Fatalf("used %d after every release, want 0", g.Used())
	}
}
