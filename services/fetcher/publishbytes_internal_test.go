package fetcher

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"golang.org/x/sync/errgroup"

	"github.com/grasp-sync/grasp-sync/pkg/bus"
	"github.com/grasp-sync/grasp-sync/pkg/clock"
	"github.com/grasp-sync/grasp-sync/pkg/testkit/natstest"
)

// heldAcks answers publishes on the events subjects as the events stream
// would (a PubAck on the reply subject), but only once let go: what it
// holds is exactly what the publishers have awaiting acknowledgement.
type heldAcks struct {
	nc *nats.Conn
	mu sync.Mutex
	// held are the replies not yet sent, bytes their messages' data.
	held    []string
	bytes   int
	seq     int
	letGo   bool
	maxHeld int
}

func (h *heldAcks) ack(reply string) {
	h.seq++
	_ = h.nc.Publish(reply, fmt.Appendf(nil, `{"stream":"EVENTS","seq":%d}`, h.seq))
}

func (h *heldAcks) receive(m *nats.Msg) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.letGo {
		h.ack(m.Reply)
		return
	}
	h.held = append(h.held, m.Reply)
	h.bytes += len(m.Data)
	h.maxHeld = max(h.maxHeld, h.bytes)
}

// release acknowledges everything held and from now on answers at once.
func (h *heldAcks) release() {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, r := range h.held {
		h.ack(r)
	}
	h.held, h.bytes, h.letGo = nil, 0, true
}

// TestPublishedBytesBounded: 16 batches publish 512 events of ~1 KB each
// (8 MiB in all) against a real NATS server whose events stream holds its
// acknowledgements back: the bytes awaiting acknowledgement, all publishers
// together, stay within GRASP_FETCHER_PUBLISH_MAX_BYTES (1 MiB here), and
// once the acknowledgements flow every publisher finishes. Bounded only by
// each batch's window of 256 events, the 16 had ~4 MiB awaiting
// acknowledgement (docs/decisions/0065-work-in-flight-bounded-by-bytes.md).
func TestPublishedBytesBounded(t *testing.T) {
	const (
		publishers = 16
		events     = 512
		maxBytes   = 1 << 20
	)
	n := natstest.Start(t)
	b, err := bus.Connect(context.Background(), n.URL, "fetcher-test", bus.DefaultNames(), bus.Security{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.Close)
	stream := &heldAcks{nc: n.Connect(t)}
	sub, err := stream.nc.Subscribe(b.Names.EventsSubjects(), stream.receive)
	if err != nil {
		t.Fatal(err)
	}
	_ = sub.SetPendingLimits(-1, -1)
	if err := stream.nc.Flush(); err != nil {
		t.Fatal(err)
	}
	cfg := Config{ID: "a", Shards: 1}
	cfg.PublishMaxBytes = maxBytes
	f := New(cfg, b, clock.Real{}, slog.New(slog.NewTextHandler(io.Discard, nil)), nil)

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pad := strings.Repeat("x", 1000)
	var g errgroup.Group
	for w := range publishers {
		g.Go(func() error {
			p := f.newWindowPublisher()
			for e := range events {
				id := fmt.Sprintf("%02d-%04d", w, e)
				msg := nats.NewMsg(b.Names.EventsSubject(w % 4))
				msg.Header.Set(bus.HeaderRelay, "wss://relay.example.com")
				msg.Header.Set(bus.HeaderBatch, fmt.Sprint("b", w))
				msg.Header.Set(nats.MsgIdHdr, id)
				msg.Data = fmt.Appendf(nil, `{"id":%q,"content":%q}`, id, pad)
				if err := p.add(ctx, msg, recentKeyOf(id), recentKeyOf(id)); err != nil {
					return err
				}
				if e%64 == 63 {
					if err := p.send(ctx); err != nil { // a page's end
						return err
					}
				}
			}
			return p.flush(ctx)
		})
	}
	// Until nothing more arrives for a second: the publishers wait for room.
	last, same := -1, 0
	for same < 10 {
		select {
		case <-ctx.Done():
			t.Fatal("publishes still arriving after a minute with no acknowledgement")
		case <-time.After(100 * time.Millisecond):
		}
		stream.mu.Lock()
		got := stream.bytes
		stream.mu.Unlock()
		if got == last {
			same++
		} else {
			last, same = got, 0
		}
	}
	stream.mu.Lock()
	peak := stream.maxHeld
	stream.mu.Unlock()
	t.Logf("%.2f MiB awaiting acknowledgement at most (bound %.0f MiB, %.1f MiB published in all)",
		float64(peak)/(1<<20), float64(maxBytes)/(1<<20), float64(publishers*events*(len(pad)+30))/(1<<20))
	if peak > maxBytes {
		t.Errorf("%d bytes awaiting acknowledgement, over GRASP_FETCHER_PUBLISH_MAX_BYTES (%d)", peak, maxBytes)
	}
	stream.release()
	if err := g.Wait(); err != nil {
		t.Fatalf("a publisher failed once acknowledgements flowed: %v", err)
	}
	// nats.go completes a publish's future before it calls the
	// acknowledgement handler that gives its bytes back, so the last few
	// releases may follow the publishers' return by a moment.
	for deadline := time.Now().Add(5 * time.Second); f.pubBytes.Used() != 0 && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
	}
	if used := f.pubBytes.Used(); used != 0 {
		t.Errorf("%d bytes still counted as awaiting acknowledgement 5 s after every one came", used)
	}
}

// TestPublishMaxBytesBelowOneBatch: a bound smaller than one batch message
// is a configuration error naming the variable.
func TestPublishMaxBytesBelowOneBatch(t *testing.T) {
	cfg := Config{ID: "a", Shards: 1}
	cfg.PublishMaxBytes = 64 << 10
	err := cfg.Validate()
	if err == nil || !strings.Contains(err.Error(), "GRASP_FETCHER_PUBLISH_MAX_BYTES=64KiB") {
		t.Fatalf("Validate = %v, want an error naming GRASP_FETCHER_PUBLISH_MAX_BYTES=64KiB", err)
	}
}
