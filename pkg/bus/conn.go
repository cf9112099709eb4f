package bus

import (
	"context"
	"fmt"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Bus is one service's connection to NATS JetStream plus the names of the
// deployment it belongs to.
type Bus struct {
	Conn  *nats.Conn
	JS    jetstream.JetStream
	Names Names
}

// Connect dials a NATS server by URL. name identifies the service in the
// server's connection list. It fails fast (no retry on the first connect) so
// a wrong URL is reported at start, and reconnects forever afterwards.
func Connect(ctx context.Context, url, name string, names Names) (*Bus, error) {
	nc, err := nats.Connect(url,
		nats.Name(name),
		nats.Timeout(5*time.Second),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(time.Second),
	)
	if err != nil {
		return nil, fmt.Errorf("connect to nats %s: %w", url, err)
	}
	return wrap(nc, names)
}

// ConnectInProcess connects to an embedded server without TCP.
func ConnectInProcess(s *server.Server, name string, names Names) (*Bus, error) {
	nc, err := nats.Connect("", nats.InProcessServer(s), nats.Name(name), nats.MaxReconnects(-1))
	if err != nil {
		return nil, fmt.Errorf("connect to embedded nats: %w", err)
	}
	return wrap(nc, names)
}

func wrap(nc *nats.Conn, names Names) (*Bus, error) {
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(4096))
	if err != nil {
		nc.Close()
		return nil, fmt.Errorf("jetstream: %w", err)
	}
	return &Bus{Conn: nc, JS: js, Names: names}, nil
}

// Close drains nothing and closes the connection.
func (b *Bus) Close() { b.Conn.Close() }
