package lease_test

import (
	"errors"
	"testing"
	"time"

	"github.com/grasp-sync/grasp-sync/pkg/lease"
)

var t0 = time.Unix(1_700_000_000, 0)

func at(d time.Duration) time.Time { return t0.Add(d) }

func TestDeadlineCountsFromTheSendOfTheLastStoredWrite(t *testing.T) {
	tm := lease.Timing{TTL: 15 * time.Second, Guard: 2500 * time.Millisecond}
	h := lease.Held{Rev: 7, Sent: t0}
	if got, want := h.Deadline(tm), at(12500*time.Millisecond); !got.Equal(want) {
		t.Fatalf("deadline %v, want %v", got, want)
	}
	// A renewal sent at 5 s whose answer came at 9 s: the lease runs from 5 s,
	// the server having stored it somewhere in between.
	h = h.Sending(at(5*time.Second)).Stored(8, at(5*time.Second))
	if got, want := h.Deadline(tm), at(17500*time.Millisecond); !got.Equal(want) {
		t.Fatalf("after a renewal sent at 5 s: deadline %v, want %v", got, want)
	}
	if !h.Unconfirmed.IsZero() {
		t.Fatalf("a stored renewal leaves nothing unconfirmed: %v", h.Unconfirmed)
	}
	for _, c := range []struct {
		now     time.Duration
		expired bool
		timeout time.Duration
	}{
		{6 * time.Second, false, 5 * time.Second},
		{15 * time.Second, false, 2500 * time.Millisecond}, // bounded by the deadline
		{17500 * time.Millisecond, true, 0},
		{18 * time.Second, true, -500 * time.Millisecond},
	} {
		if got := h.Expired(tm, at(c.now)); got != c.expired {
			t.Errorf("at %v: expired %v, want %v", c.now, got, c.expired)
		}
		if got := tm.AttemptTimeout(h, at(c.now)); got != c.timeout {
			t.Errorf("at %v: attempt timeout %v, want %v", c.now, got, c.timeout)
		}
	}
}

func TestUnconfirmedIsTheFirstAttempt(t *testing.T) {
	h := lease.Held{Rev: 7, Sent: t0}.Sending(at(5 * time.Second)).Sending(at(6 * time.Second))
	if !h.Unconfirmed.Equal(at(5 * time.Second)) {
		t.Fatalf("unconfirmed %v, want the first attempt's 5 s", h.Unconfirmed)
	}
}

func TestJudge(t *testing.T) {
	pending := lease.Held{Rev: 7, Sent: t0, Unconfirmed: at(5 * time.Second)}
	for _, c := range []struct {
		name string
		h    lease.Held
		rb   lease.ReadBack
		want lease.Verdict
		next lease.Held
	}{
		{"read failed", pending, lease.ReadBack{Err: errors.New("timeout")}, lease.Retry, pending},
		{"key gone", pending, lease.ReadBack{}, lease.Lost, pending},
		{"another holder", pending, lease.ReadBack{Found: true, Rev: 9}, lease.Lost, pending},
		{"another holder at our revision", pending, lease.ReadBack{Found: true, Rev: 7}, lease.Lost, pending},
		{"ours, not stored", pending, lease.ReadBack{Found: true, Ours: true, Rev: 7}, lease.Retry, pending},
		{"ours, stored with its answer lost", pending, lease.ReadBack{Found: true, Ours: true, Rev: 8}, lease.Adopted,
			lease.Held{Rev: 8, Sent: at(5 * time.Second)}},
		{"ours at a newer revision with nothing sent", lease.Held{Rev: 7, Sent: t0},
			lease.ReadBack{Found: true, Ours: true, Rev: 8}, lease.Retry, lease.Held{Rev: 7, Sent: t0}},
	} {
		t.Run(c.name, func(t *testing.T) {
			next, v := c.h.Judge(c.rb)
			if v != c.want || next != c.next {
				t.Fatalf("Judge = %+v, %v; want %+v, %v", next, v, c.next, c.want)
			}
		})
	}
}
