package relay

import (
	"context"
	"net"
	"net/http"
	"sync"

	"github.com/fiatjaf/eventstore"
	"github.com/fiatjaf/khatru"
	"github.com/nbd-wtf/go-nostr"

	"github.com/grasp-sync/grasp-sync/services/relay/frameguard"
)

// A client's websocket connection: the per-address limits, the frame guard
// in front of khatru, and the relay's record of open connections.

// serveWebsocket applies the per-address connection limits, then hands the
// connection to khatru behind the guard.
func (r *Relay) serveWebsocket(w http.ResponseWriter, req *http.Request) {
	from := resolveClient(req, r.proxies)
	if from.forwarded && from.peer.IsValid() && !r.proxies.contains(from.peer) {
		r.untrusted.warn(r.log, from.peer)
	}
	addr, trusted := from.addr, from.exempt(r.trusted)
	if !trusted {
		if !r.connects.allow(addr) {
			r.refused.WithLabelValues("connect-rate").Inc()
			r.log.Info("connection refused: rate limited", "addr", addr.String())
			http.Error(w, "rate-limited: too many connections from your address", http.StatusTooManyRequests)
			return
		}
		if !r.conns.acquire(addr) {
			r.refused.WithLabelValues("connections").Inc()
			r.log.Info("connection refused: too many open", "addr", addr.String())
			http.Error(w, "rate-limited: too many open connections from your address", http.StatusTooManyRequests)
			return
		}
	}
	// The guard orders the connection's messages; it learns from the
	// filter hook (trackSubscription), through the request khatru keeps,
	// when a CLOSE has taken effect.
	subs := frameguard.NewSubscriptions()
	req = req.WithContext(context.WithValue(req.Context(), subscriptionsKey{}, subs))
	lim := frameguard.Limits{
		MaxMessage:   int(r.cfg.MaxMessageBytes),
		MaxFilters:   r.cfg.MaxFilters,
		MaxSubs:      r.cfg.MaxSubscriptions,
		MaxSubIDLen:  64,
		WriteTimeout: r.cfg.WriteTimeout,
	}
	var eventAllowed func() bool
	if !trusted {
		eventAllowed = func() bool { return r.events.allow(addr) }
	}
	onRefuse := func(what string) { r.refused.WithLabelValues("guard-" + what).Inc() }
	wrap := func(c net.Conn) net.Conn {
		g := frameguard.New(c, lim, subs, eventAllowed, onRefuse)
		r.clients.add(g)
		return &releasingConn{Conn: g, release: func() {
			r.clients.remove(g)
			if !trusted {
				r.conns.release(addr)
			}
		}}
	}
	hijacked := false
	r.khatru.HandleWebsocket(frameguard.HijackWriter{ResponseWriter: w, Wrap: func(c net.Conn) net.Conn {
		hijacked = true
		return wrap(c)
	}}, req)
	if !hijacked && !trusted {
		r.conns.release(addr) // the upgrade failed before taking the connection
	}
}

// subscriptionsKey carries a connection's frameguard.Subscriptions in the
// context of the HTTP request khatru keeps with the connection.
type subscriptionsKey struct{}

// trackSubscription is the OverwriteFilter hook that hands the guard of the
// filter's connection the filter's context. Negentropy sessions, which also
// pass through OverwriteFilter, are not subscriptions.
func trackSubscription(ctx context.Context, _ *nostr.Filter) {
	if eventstore.IsNegentropySession(ctx) {
		return
	}
	conn := khatru.GetConnection(ctx)
	if conn == nil || conn.Request == nil {
		return
	}
	subs, _ := conn.Request.Context().Value(subscriptionsKey{}).(*frameguard.Subscriptions)
	if subs == nil {
		return
	}
	subs.Add(khatru.GetSubscriptionID(ctx), ctx)
}

// releasingConn forgets a client connection, and gives back its address's
// connection slot, when khatru closes it (khatru may close it more than
// once).
type releasingConn struct {
	*frameguard.Conn
	once    sync.Once
	release func()
}

// Close closes the connection and releases its slot once.
func (c *releasingConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(c.release)
	return err
}

// clientConns are the relay's open client connections (behind the guard):
// what its shutdown closes and a gap in its stored feed drops (feedgap.go).
type clientConns struct {
	mu sync.Mutex
	m  map[*frameguard.Conn]struct{}
}

func (c *clientConns) add(g *frameguard.Conn) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.m == nil {
		c.m = map[*frameguard.Conn]struct{}{}
	}
	c.m[g] = struct{}{}
}

func (c *clientConns) remove(g *frameguard.Conn) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.m, g)
}

// closeAll closes every open connection (the relay's shutdown).
func (c *clientConns) closeAll() {
	for _, g := range c.snapshot() {
		_ = g.Close()
	}
}

// snapshot lists the open connections.
func (c *clientConns) snapshot() []*frameguard.Conn {
	c.mu.Lock()
	defer c.mu.Unlock()
	all := make([]*frameguard.Conn, 0, len(c.m))
	for g := range c.m {
		all = append(all, g)
	}
	return all
}

// dropAll drops every open connection with reason and says how many.
func (c *clientConns) dropAll(reason string) int {
	all := c.snapshot()
	// Each at once: one client that does not read holds its own write for
	// up to the write timeout, not everyone's drop.
	var wg sync.WaitGroup
	for _, g := range all {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_ = g.Drop(frameguard.CloseServiceRestart, reason)
		}()
	}
	wg.Wait()
	return len(all)
}
