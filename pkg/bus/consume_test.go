package bus

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	graspv1 "github.com/grasp-sync/grasp-sync/proto/grasp/v1"

	"github.com/grasp-sync/grasp-sync/pkg/testkit/natstest"
)

// A pull request that is lost on its way — in a cluster, one sent before a
// new consumer is reachable from the node we are connected to — is renewed
// after two missed heartbeats rather than at its 30 s expiry: a message
// published meanwhile is delivered well within the test's 20 s.
func TestConsumeRenewsALostPull(t *testing.T) {
	srv := natstest.Start(t)
	dialer := &pullDropper{}
	nc, err := nats.Connect(srv.URL, nats.SetCustomDialer(dialer), nats.Name("consume-test"))
	if err != nil {
		t.Fatal(err)
	}
	names := Names{Prefix: "lostpull"}
	b, err := wrap(nc, names)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	ctx := setupInMemory(t, b, names)
	got := make(chan string, 1)
	cctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- b.Consume(cctx, ConsumeConfig{Stream: names.FetchReportStream(),
			Consumer: jetstream.ConsumerConfig{Durable: "reports", FilterSubject: names.FetchReportSubjects()}},
			func(ctx context.Context, msg jetstream.Msg) error {
				var r graspv1.FetchReport
				if err := Decode(msg.Data(), msg.Headers(), &r); err != nil {
					return err
				}
				got <- r.GetRelayUrl()
				return nil
			})
	}()
	defer func() { stop(); <-done }()
	for dialer.dropped.Load() == 0 {
		select {
		case <-ctx.Done():
			t.Fatal("the consumer never pulled")
		case <-time.After(10 * time.Millisecond):
		}
	}
	if err := b.Publish(ctx, names.FetchReportSubject(0), &graspv1.FetchReport{RelayUrl: "wss://a.example"}); err != nil {
		t.Fatal(err)
	}
	select {
	case url := <-got:
		if url != "wss://a.example" {
			t.Fatalf("got %q", url)
		}
	case <-ctx.Done():
		t.Fatal("nothing delivered: the lost pull request was not renewed")
	}
}

// pullDropper dials NATS connections that drop the client's first
// JetStream pull request (a PUB to $JS.API.CONSUMER.MSG.NEXT.…) and pass
// everything else through.
type pullDropper struct {
	dropped atomic.Int32
}

func (d *pullDropper) Dial(network, address string) (net.Conn, error) {
	c, err := net.Dial(network, address)
	if err != nil {
		return nil, err
	}
	return &droppingConn{Conn: c, d: d}, nil
}

type droppingConn struct {
	net.Conn
	d   *pullDropper
	mu  sync.Mutex
	buf []byte
}

// Write forwards whole protocol commands, holding back a partial one until
// the rest arrives, and drops the first pull request.
func (c *droppingConn) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.buf = append(c.buf, p...)
	for {
		eol := bytes.Index(c.buf, []byte("\r\n"))
		if eol < 0 {
			return len(p), nil
		}
		line := c.buf[:eol]
		n := eol + 2
		fields := bytes.Fields(line)
		if len(fields) > 0 && (bytes.Equal(fields[0], []byte("PUB")) || bytes.Equal(fields[0], []byte("HPUB"))) {
			size, err := strconv.Atoi(string(fields[len(fields)-1]))
			if err != nil {
				return 0, err
			}
			n += size + 2
			if len(c.buf) < n {
				return len(p), nil
			}
			if len(fields) > 1 && bytes.HasPrefix(fields[1], []byte("$JS.API.CONSUMER.MSG.NEXT.")) && c.d.dropped.CompareAndSwap(0, 1) {
				c.buf = c.buf[n:]
				continue
			}
		}
		if _, err := c.Conn.Write(c.buf[:n]); err != nil {
			return 0, err
		}
		c.buf = c.buf[n:]
	}
}

// A durable created with its state in files (a single node, or a cluster
// before docs/decisions/0064-cluster-consumer-state-in-memory.md) is kept as
// it is when a service now asks for its state in memory, and the other way
// round: the server refuses to change a consumer's storage, and a service
// must attach to the consumer it has rather than fail at start. Both ways
// the consumer is the one that exists, with its storage and its deliveries.
func TestEnsureConsumerKeepsExistingStorage(t *testing.T) {
	srv := natstest.Start(t)
	nc, err := nats.Connect(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "WQ", Subjects: []string{"wq.>"},
		Retention: jetstream.WorkQueuePolicy, Storage: jetstream.MemoryStorage}); err != nil {
		t.Fatal(err)
	}
	for _, existing := range []bool{false, true} {
		name := "c-" + strconv.FormatBool(existing)
		cfg := jetstream.ConsumerConfig{Durable: name, FilterSubject: "wq." + name, AckPolicy: jetstream.AckExplicitPolicy, MemoryStorage: existing}
		if _, err := js.CreateConsumer(ctx, "WQ", cfg); err != nil {
			t.Fatal(err)
		}
		cfg.MemoryStorage = !existing
		// The refusal is a 500, which retries would repeat until the
		// deadline: a short one shows the consumer is attached at once.
		ectx, ecancel := context.WithTimeout(ctx, 5*time.Second)
		c, err := EnsureConsumer(ectx, js, "WQ", cfg)
		ecancel()
		if err != nil {
			t.Fatalf("existing consumer with MemoryStorage %v, asked for %v: %v", existing, !existing, err)
		}
		if got := c.CachedInfo().Config.MemoryStorage; got != existing {
			t.Errorf("consumer %s: MemoryStorage %v after EnsureConsumer, want the existing %v", name, got, existing)
		}
	}
}

// ConsumeBatches hands the handler what had arrived together, up to its
// maximum, in the stream's order; a batch whose handler fails is redelivered
// whole, and every message ends acknowledged exactly once.
func TestConsumeBatchesGathersWhatWaits(t *testing.T) {
	srv := natstest.Start(t)
	names := Names{Prefix: "batches"}
	b, err := ConnectInProcess(srv.Server, "batches-test", names)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	ctx := setupInMemory(t, b, names)
	const total, maxBatch = 100, 16
	for i := range total {
		if err := b.Publish(ctx, names.FetchReportSubject(0), &graspv1.FetchReport{RelayUrl: strconv.Itoa(i)}); err != nil {
			t.Fatal(err)
		}
	}

	var calls, failed int
	var sizes []int
	handled := map[int]int{}
	cctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- b.ConsumeBatches(cctx, ConsumeConfig{Stream: names.FetchReportStream(), RetryDelay: 50 * time.Millisecond,
			Consumer: jetstream.ConsumerConfig{Durable: "reports", FilterSubject: names.FetchReportSubjects()}}, maxBatch,
			func(ctx context.Context, msgs []jetstream.Msg) error {
				calls++
				sizes = append(sizes, len(msgs))
				// What a batch gathers is what has reached this process, and
				// the reader hands messages over one by one: under load (the
				// race detector, CI running packages side by side) a handler
				// that returns at once can outpace it. So the first call waits
				// until the server has delivered every message, and each call
				// leaves the reader a moment to refill what the next takes.
				if calls == 1 {
					waitDelivered(ctx, t, b, names.FetchReportStream(), "reports")
				}
				time.Sleep(10 * time.Millisecond)
				var nums []int
				var delivered []uint64 // the consumer's delivery sequence
				for _, m := range msgs {
					var r graspv1.FetchReport
					if err := Decode(m.Data(), m.Headers(), &r); err != nil {
						return err
					}
					n, _ := strconv.Atoi(r.GetRelayUrl())
					nums = append(nums, n)
					meta, err := m.Metadata()
					if err != nil {
						return err
					}
					delivered = append(delivered, meta.Sequence.Consumer)
				}
				if calls == 2 {
					failed = len(nums) // redelivered later, whole
					return errors.New("not now")
				}
				// A batch keeps the order of delivery; a redelivered message
				// comes after those first delivered before it was given back.
				for j, n := range nums {
					if j > 0 && delivered[j] <= delivered[j-1] {
						t.Errorf("batch %v out of the order of delivery %v", nums, delivered)
					}
					handled[n]++
				}
				if len(handled) == total {
					stop()
				}
				return nil
			})
	}()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("ConsumeBatches returned %v, want the cancelled context", err)
	}
	for i := range total {
		if handled[i] != 1 {
			t.Errorf("message %d handled %d times, want once", i, handled[i])
		}
	}
	if failed == 0 {
		t.Error("the failing batch was empty")
	}
	for _, n := range sizes {
		if n > maxBatch {
			t.Errorf("a batch of %d, above the maximum %d", n, maxBatch)
		}
	}
	// 100 waiting messages, at most 16 a call: 7 calls at best, plus the
	// failed one; one call per message would be 100.
	if calls > total/4 {
		t.Errorf("%d calls for %d waiting messages (batches %v): not gathered", calls, total, sizes)
	}
	cons, err := b.JS.Consumer(ctx, names.FetchReportStream(), "reports")
	if err != nil {
		t.Fatal(err)
	}
	waitAcked := time.Now().Add(5 * time.Second)
	for {
		info, err := cons.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if info.NumAckPending == 0 && info.NumPending == 0 {
			break
		}
		if time.Now().After(waitAcked) {
			t.Fatalf("consumer left with %d unacknowledged and %d undelivered", info.NumAckPending, info.NumPending)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// waitDelivered waits until the consumer has no message left to deliver:
// every one is with a client, handled or not.
func waitDelivered(ctx context.Context, t *testing.T, b *Bus, stream, consumer string) {
	t.Helper()
	cons, err := b.JS.Consumer(ctx, stream, consumer)
	if err != nil {
		t.Error(err)
		return
	}
	for {
		info, err := cons.Info(ctx)
		if err != nil {
			t.Error(err)
			return
		}
		if info.NumPending == 0 {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// setupInMemory creates the contract's streams and buckets in memory for
// b and returns a context that ends with the test (at most 20 s).
func setupInMemory(t *testing.T, b *Bus, names Names) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	opts := DefaultOptions()
	opts.Storage = jetstream.MemoryStorage
	if err := Setup(ctx, b.JS, names, opts); err != nil {
		t.Fatal(err)
	}
	return ctx
}

// The idle heartbeat a pull consumer asks the server for, read off the
// wire by a second client: 2 s over TCP, where a cluster may lose a pull,
// and 15 s on a connection to a server in this process, which is a single
// server (graspd's embedded NATS).
func TestPullHeartbeatAskedFor(t *testing.T) {
	srv := natstest.Start(t)
	tap, err := nats.Connect(srv.URL, nats.Name("tap"))
	if err != nil {
		t.Fatal(err)
	}
	defer tap.Close()
	pulls, err := tap.SubscribeSync("$JS.API.CONSUMER.MSG.NEXT.>")
	if err != nil {
		t.Fatal(err)
	}
	if err := tap.Flush(); err != nil {
		t.Fatal(err)
	}
	tcp, err := Connect(context.Background(), srv.URL, "tcp", Names{Prefix: "hbtcp"}, Security{})
	if err != nil {
		t.Fatal(err)
	}
	defer tcp.Close()
	inproc, err := ConnectInProcess(srv.Server, "inproc", Names{Prefix: "hbin"})
	if err != nil {
		t.Fatal(err)
	}
	defer inproc.Close()
	want := map[string]time.Duration{"hbtcp": 2 * time.Second, "hbin": 15 * time.Second}
	for _, b := range []*Bus{tcp, inproc} {
		ctx := setupInMemory(t, b, b.Names)
		cctx, stop := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() {
			done <- b.Consume(cctx, ConsumeConfig{Stream: b.Names.FetchReportStream(),
				Consumer: jetstream.ConsumerConfig{Durable: "reports", FilterSubject: b.Names.FetchReportSubjects()}},
				func(context.Context, jetstream.Msg) error { return nil })
		}()
		defer func() { stop(); <-done }()
	}
	got := map[string]time.Duration{}
	for len(got) < len(want) {
		m, err := pulls.NextMsg(10 * time.Second)
		if err != nil {
			t.Fatalf("pull requests seen: %v; then %v", got, err)
		}
		var req struct {
			Heartbeat time.Duration `json:"idle_heartbeat"`
		}
		if err := json.Unmarshal(m.Data, &req); err != nil {
			t.Fatalf("pull request %s: %v", m.Data, err)
		}
		for prefix := range want {
			if strings.Contains(m.Subject, "."+strings.ToUpper(prefix)+"_") {
				got[prefix] = req.Heartbeat
			}
		}
	}
	for prefix, hb := range want {
		if got[prefix] != hb {
			t.Errorf("%s: idle heartbeat asked for %s, want %s", prefix, got[prefix], hb)
		}
	}
}
