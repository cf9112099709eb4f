package relay

import (
	"context"
	"io"
	"log"
	"log/slog"
	"net"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/nbd-wtf/go-nostr"

	"github.com/grasp-sync/grasp-sync/pkg/bus"
	"github.com/grasp-sync/grasp-sync/pkg/store"
	"github.com/grasp-sync/grasp-sync/pkg/testkit"
	"github.com/grasp-sync/grasp-sync/pkg/testkit/testrelay"
)

// What the websocket tests (publish_test.go, query_test.go, limits_test.go,
// broadcast_test.go, order_test.go, nips_test.go) share: a relay over a real
// store, reached by raw-protocol clients.

const (
	service = "wss://git.example.com"
	ourHost = "git.example.com"
)

func TestMain(m *testing.M) {
	// eventstore's badger backend logs its migrations on every open.
	log.SetOutput(io.Discard)
	if kind := os.Getenv("GRASP_READBENCH_SERVE"); kind != "" {
		// A relay process of the read benchmark (readbench_test.go).
		if err := serveReadBench(kind, os.Getenv("GRASP_READBENCH_DIR")); err != nil {
			os.Stderr.WriteString("read benchmark relay: " + err.Error() + "\n")
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// server is a running relay over a real store, reached over real websockets.
type server struct {
	url   string
	http  string
	store *store.Store
	relay *Relay
	bus   *bus.Bus
	// stop ends Run and returns its error (at most once; the test's
	// cleanup stops a server not stopped yet).
	stop func() error
}

type serverOpts struct {
	cfg  Config
	bus  *bus.Bus
	now  func() time.Time
	keep bool // keep cfg.TrustedAddresses as given (default: trust loopback)
}

func startServer(t *testing.T, o serverOpts) *server {
	t.Helper()
	st, err := store.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.Close)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	cfg := o.cfg
	cfg.Addr = ln.Addr().String()
	cfg.PublicURL = service
	if !o.keep {
		cfg.TrustedAddresses = "127.0.0.1"
	}
	now := o.now
	if now == nil {
		now = time.Now
	}
	r := newRelay(cfg, st, o.bus, discard(), now)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx, ln) }()
	stop := sync.OnceValue(func() error {
		cancel()
		return <-done
	})
	t.Cleanup(func() {
		if err := stop(); err != nil {
			t.Errorf("relay: %v", err)
		}
	})
	return &server{url: "ws://" + cfg.Addr, http: "http://" + cfg.Addr, store: st, relay: r, bus: o.bus, stop: stop}
}

// client is one websocket connection speaking raw protocol.
type client struct {
	t *testing.T
	c *testrelay.Conn
}

func dial(t *testing.T, url string) *client {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := testrelay.Dial(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return &client{t: t, c: c}
}

func (c *client) write(v any) {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := c.c.Write(ctx, v); err != nil {
		c.t.Fatal(err)
	}
}

// next reads until pick accepts a message (raw text), failing after 5 s.
func (c *client) next(pick func(env nostr.Envelope, raw string) bool) (nostr.Envelope, string) {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for {
		env, raw, err := c.c.Read(ctx)
		if err != nil {
			c.t.Fatalf("read: %v", err)
		}
		if pick(env, raw) {
			return env, raw
		}
	}
}

// publish sends an EVENT and returns the relay's OK.
func (c *client) publish(evt *nostr.Event) (bool, string) {
	c.t.Helper()
	c.write(nostr.EventEnvelope{Event: *evt})
	env, _ := c.next(func(env nostr.Envelope, _ string) bool {
		ok, is := env.(*nostr.OKEnvelope)
		return is && ok.EventID == evt.ID
	})
	ok := env.(*nostr.OKEnvelope)
	return ok.OK, ok.Reason
}

// query runs one REQ and returns the events before EOSE.
func (c *client) query(f nostr.Filter) []*nostr.Event {
	c.t.Helper()
	id := "q" + nostr.GeneratePrivateKey()[:8]
	c.write(nostr.ReqEnvelope{SubscriptionID: id, Filters: nostr.Filters{f}})
	var out []*nostr.Event
	c.next(func(env nostr.Envelope, _ string) bool {
		switch env := env.(type) {
		case *nostr.EventEnvelope:
			if env.SubscriptionID != nil && *env.SubscriptionID == id {
				e := env.Event
				out = append(out, &e)
			}
		case *nostr.EOSEEnvelope:
			return string(*env) == id
		case *nostr.ClosedEnvelope:
			if env.SubscriptionID == id {
				c.t.Fatalf("REQ closed: %s", env.Reason)
			}
		}
		return false
	})
	c.write(nostr.CloseEnvelope(id))
	return out
}

func served(k testkit.Key, d string, maintainers ...string) *nostr.Event {
	return k.Announcement(d, []string{testkit.GraspCloneURL(service, k.PubKey, d)}, []string{service}, maintainers)
}

func announce(k testkit.Key, d, clone, relays string, maintainers ...string) *nostr.Event {
	return k.Announcement(d, []string{clone}, []string{relays}, maintainers)
}

func discard() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }
