package fetcher

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/grasp-sync/grasp-sync/pkg/bus"
	"github.com/grasp-sync/grasp-sync/pkg/clock"
	"github.com/grasp-sync/grasp-sync/pkg/testkit/natstest"
)

// claimsEnv is a fetcher whose events stream is the test: a real NATS
// server's subscriber that hands every publish over and acknowledges it only
// when told, as the stream does once it stored the message.
type claimsEnv struct {
	t    *testing.T
	ctx  context.Context
	f    *Fetcher
	clk  *clock.Fake
	nc   *nats.Conn
	msgs chan *nats.Msg
	seq  int
}

func newClaimsEnv(t *testing.T) *claimsEnv {
	n := natstest.Start(t)
	b, err := bus.Connect(context.Background(), n.URL, "fetcher-test", bus.DefaultNames(), bus.Security{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.Close)
	e := &claimsEnv{t: t, nc: n.Connect(t), msgs: make(chan *nats.Msg, 64), clk: clock.NewFake(time.Unix(1_700_000_000, 0))}
	if _, err := e.nc.Subscribe(b.Names.EventsSubjects(), func(m *nats.Msg) { e.msgs <- m }); err != nil {
		t.Fatal(err)
	}
	if err := e.nc.Flush(); err != nil {
		t.Fatal(err)
	}
	e.f = New(Config{ID: "a", Shards: 1}, b, e.clk, slog.New(slog.NewTextHandler(io.Discard, nil)), nil)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	e.ctx = ctx
	return e
}

// add gives p the event id as read from relay.
func (e *claimsEnv) add(p *windowPublisher, relay, id string) {
	e.t.Helper()
	msg := nats.NewMsg(e.f.bus.Names.EventsSubject(0))
	msg.Header.Set(bus.HeaderRelay, relay)
	msg.Header.Set(bus.HeaderBatch, "b-"+relay)
	msg.Header.Set(nats.MsgIdHdr, id)
	msg.Data = fmt.Appendf(nil, `{"id":%q}`, id)
	if err := p.add(e.ctx, msg, recentKeyOf(id), recentKeyOf(id)); err != nil {
		e.t.Fatal(err)
	}
}

// published is the next message the stream got; it fails after a second.
func (e *claimsEnv) published() *nats.Msg {
	e.t.Helper()
	select {
	case m := <-e.msgs:
		return m
	case <-time.After(time.Second):
		e.t.Fatal("nothing published")
		return nil
	}
}

// none checks that nothing is published for a while.
func (e *claimsEnv) none(why string) {
	e.t.Helper()
	select {
	case m := <-e.msgs:
		e.t.Fatalf("%s: published %s from %s", why, m.Data, m.Header.Get(bus.HeaderRelay))
	case <-time.After(300 * time.Millisecond):
	}
}

func (e *claimsEnv) ack(m *nats.Msg) {
	e.t.Helper()
	e.seq++
	if err := e.nc.Publish(m.Reply, fmt.Appendf(nil, `{"stream":"EVENTS","seq":%d}`, e.seq)); err != nil {
		e.t.Fatal(err)
	}
}

// inFlight has a first batch read id from one relay and publish it (the
// returned message, not acknowledged yet), then a second batch read its
// copy from another relay.
func (e *claimsEnv) inFlight(id string) (first, second *windowPublisher, m *nats.Msg) {
	e.t.Helper()
	first, second = e.f.newBatchPublisher(), e.f.newBatchPublisher()
	e.add(first, "ws://127.0.0.1:1", id)
	if err := first.send(e.ctx); err != nil {
		e.t.Fatal(err)
	}
	m = e.published()
	e.add(second, "ws://127.0.0.1:2", id)
	return first, second, m
}

// flushing flushes p in the background.
func (e *claimsEnv) flushing(p *windowPublisher) <-chan error {
	done := make(chan error, 1)
	go func() { done <- p.flush(e.ctx) }()
	return done
}

func (e *claimsEnv) flushed(done <-chan error) {
	e.t.Helper()
	select {
	case err := <-done:
		if err != nil {
			e.t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		e.t.Fatal("flush did not finish")
	}
}

func (e *claimsEnv) heldBack(outcome string) int {
	e.t.Helper()
	return int(counterValue(e.t, e.f.m.heldBack.WithLabelValues(outcome)))
}

// A copy read from a second relay while the first relay's copy is on its
// way to the events stream is held back, not published: that batch is
// flushed (confirmed) only once the first copy is acknowledged. Were the
// first copy given up (its batch failed) or never acknowledged, the held
// copy is published after all: no batch is confirmed with an event that
// reached no one. A live subscription never holds back.
func TestCopyInFlightHeldBack(t *testing.T) {
	e := newClaimsEnv(t)

	t.Run("acknowledged", func(t *testing.T) {
		first, second, m := e.inFlight("e1")
		done := e.flushing(second)
		e.none("the second relay's copy while the first is on its way")
		select {
		case err := <-done:
			t.Fatalf("the second batch flushed before the first copy was acknowledged (%v)", err)
		default:
		}
		e.ack(m)
		e.flushed(done)
		e.none("the second relay's copy once the first was acknowledged")
		e.flushed(e.flushing(first))
		if n := e.heldBack("dropped"); n != 1 {
			t.Fatalf("held back and dropped: %d, want 1", n)
		}
	})

	t.Run("claimant fails", func(t *testing.T) {
		first, second, _ := e.inFlight("e2") // never acknowledged
		done := e.flushing(second)
		e.none("the second relay's copy while the first is on its way")
		first.close() // its batch failed
		m := e.published()
		if got := m.Header.Get(bus.HeaderRelay); got != "ws://127.0.0.1:2" || !strings.Contains(string(m.Data), "e2") {
			t.Fatalf("published %s from %s, want e2 from the second relay", m.Data, got)
		}
		e.ack(m)
		e.flushed(done)
	})

	t.Run("claimant silent", func(t *testing.T) {
		first, second, _ := e.inFlight("e3") // never acknowledged
		done := e.flushing(second)
		e.none("the second relay's copy before claimWait")
		var m *nats.Msg
		for m == nil {
			select {
			case m = <-e.msgs:
			case <-time.After(50 * time.Millisecond):
				e.clk.Advance(claimWait)
			}
		}
		if got := m.Header.Get(bus.HeaderRelay); got != "ws://127.0.0.1:2" {
			t.Fatalf("published from %s, want the second relay", got)
		}
		e.ack(m)
		e.flushed(done)
		first.close()
		if n := e.heldBack("published"); n != 2 {
			t.Fatalf("held back and published: %d, want 2 (failed, silent)", n)
		}
	})

	t.Run("crossed", func(t *testing.T) {
		// Each batch holds back a copy the other claimed while its own
		// claimed events are still gathered: both flush, neither waits
		// claimWait on the other (the fake clock never moves).
		first, second := e.f.newBatchPublisher(), e.f.newBatchPublisher()
		e.add(first, "ws://127.0.0.1:1", "e5")
		e.add(second, "ws://127.0.0.1:2", "e6")
		e.add(first, "ws://127.0.0.1:1", "e6")
		e.add(second, "ws://127.0.0.1:2", "e5")
		d1, d2 := e.flushing(first), e.flushing(second)
		got := map[string]string{}
		for range 2 {
			m := e.published()
			got[string(m.Data)] = m.Header.Get(bus.HeaderRelay)
			e.ack(m)
		}
		e.flushed(d1)
		e.flushed(d2)
		e.none("a held-back copy once its claim was acknowledged")
		if got[`{"id":"e5"}`] != "ws://127.0.0.1:1" || got[`{"id":"e6"}`] != "ws://127.0.0.1:2" {
			t.Fatalf("published %v, want e5 from the first relay and e6 from the second", got)
		}
	})

	t.Run("live", func(t *testing.T) {
		batch, live := e.f.newBatchPublisher(), e.f.newWindowPublisher()
		e.add(batch, "ws://127.0.0.1:1", "e4")
		if err := batch.send(e.ctx); err != nil {
			t.Fatal(err)
		}
		m := e.published()
		e.add(live, "ws://127.0.0.1:2", "e4")
		if err := live.send(e.ctx); err != nil {
			t.Fatal(err)
		}
		l := e.published()
		e.ack(m)
		e.ack(l)
		e.flushed(e.flushing(batch))
		e.flushed(e.flushing(live))
		live.close()
	})

	if n := e.f.claims.len(); n != 0 {
		t.Fatalf("%d claims left after every publisher ended", n)
	}
}

func counterValue(t *testing.T, c prometheus.Counter) float64 {
	t.Helper()
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetCounter().GetValue()
}
