package relay

import (
	"context"
	"errors"
	"testing"
	"time"
)

// TestShutdownClosesClients: when Run ends, the relay closes its clients'
// websocket connections, which http.Server.Shutdown leaves open (it does not
// track hijacked connections).
func TestShutdownClosesClients(t *testing.T) {
	s := startServer(t, serverOpts{})
	c := dial(t, s.url)
	stillServed(t, c)
	if err := s.stop(); err != nil {
		t.Fatalf("relay: %v", err)
	}
	rctx, rcancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer rcancel()
	if _, raw, err := c.c.Read(rctx); err == nil || errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("after the relay stopped the client read %q, %v; want its connection closed", raw, err)
	}
}
