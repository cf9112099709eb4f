package natstest

import (
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
)

// NATS is an embedded, single-node NATS server with JetStream enabled.
// Tests get a real broker (streams, consumers, KV) without any external
// process.
type NATS struct {
	// Server is the embedded server, for tests that need to inspect or
	// restart it.
	Server *server.Server
	// URL is the client URL (nats://127.0.0.1:PORT) to hand to code under test.
	URL string
}

// Start starts an embedded JetStream server on 127.0.0.1 with a random
// port and a file store in t.TempDir(), without logging or signal handlers,
// and waits until it accepts connections. The server is shut down (and
// waited for) when the test ends.
func Start(t testing.TB) *NATS {
	t.Helper()
	opts := &server.Options{
		Host:      "127.0.0.1",
		Port:      -1,
		JetStream: true,
		StoreDir:  t.TempDir(),
		NoLog:     true,
		NoSigs:    true,
	}
	s, err := server.NewServer(opts)
	if err != nil {
		t.Fatalf("natstest: create nats server: %v", err)
	}
	go s.Start()
	t.Cleanup(func() {
		s.Shutdown()
		s.WaitForShutdown()
	})
	if !s.ReadyForConnections(10 * time.Second) {
		t.Fatalf("natstest: nats server not ready for connections after 10s")
	}
	return &NATS{Server: s, URL: s.ClientURL()}
}

// Connect returns a client connection to the server; it is closed when the
// test ends (before the server shuts down, since cleanups run in reverse).
func (n *NATS) Connect(t testing.TB) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect(n.URL, nats.Name(t.Name()))
	if err != nil {
		t.Fatalf("natstest: connect to nats at %s: %v", n.URL, err)
	}
	t.Cleanup(nc.Close)
	return nc
}
