package clock_test

import (
	"testing"
	"time"

	"github.com/grasp-sync/grasp-sync/pkg/clock"
)

func TestFakeFiresOnlyWhenDue(t *testing.T) {
	f := clock.NewFake(time.Unix(1000, 0))
	ch := f.After(5 * time.Second)
	f.Advance(4 * time.Second)
	select {
	case <-ch:
		t.Fatal("fired early")
	default:
	}
	f.Advance(time.Second)
	select {
	case got := <-ch:
		if !got.Equal(time.Unix(1005, 0)) {
			t.Fatalf("fired at %v", got)
		}
	default:
		t.Fatal("did not fire when due")
	}
	if f.Waiters() != 0 {
		t.Fatal("fired timer still pending")
	}
}
