package testrelay

import (
	"context"
	"fmt"

	"github.com/nbd-wtf/go-nostr"
	"github.com/nbd-wtf/go-nostr/nip42"
	"golang.org/x/sync/errgroup"

	"github.com/grasp-sync/grasp-sync/pkg/testkit"
)

// Publish sends events to the relay at url over one real websocket
// connection, one after the other, waiting for each OK, and returns the
// first error, e.g. the relay's OK=false reason. It exercises the relay's
// full EVENT path: id and signature checks, deletions, policies.
func Publish(ctx context.Context, url string, evts ...*nostr.Event) error {
	c, err := Dial(ctx, url)
	if err != nil {
		return err
	}
	defer func() { _ = c.Close() }()
	for _, evt := range evts {
		if err := c.Write(ctx, nostr.EventEnvelope{Event: *evt}); err != nil {
			return fmt.Errorf("publish %s (kind %d): %w", evt.ID, evt.Kind, err)
		}
		if err := awaitOK(ctx, c, evt.ID); err != nil {
			return fmt.Errorf("publish %s (kind %d) to %s: %w", evt.ID, evt.Kind, url, err)
		}
	}
	return nil
}

// PublishFrom sends events to the relay at url as clients publishers do at
// once, each on its own connection, waiting for each OK as Publish does:
// events are dealt to the clients in turn, so each client keeps their
// order. It returns the first error; the other clients stop with it.
func PublishFrom(ctx context.Context, url string, clients int, evts ...*nostr.Event) error {
	clients = max(1, min(clients, len(evts)))
	if clients <= 1 {
		return Publish(ctx, url, evts...)
	}
	g, gctx := errgroup.WithContext(ctx)
	for c := range clients {
		mine := make([]*nostr.Event, 0, len(evts)/clients+1)
		for i := c; i < len(evts); i += clients {
			mine = append(mine, evts[i])
		}
		g.Go(func() error { return Publish(gctx, url, mine...) })
	}
	return g.Wait()
}

// Send publishes evt on c and returns the relay's OK answer, whatever it
// is: err is only for a failed write or read (messages other than the OK for
// evt, such as an AUTH challenge, are read and passed over; Read remembers a
// challenge for Auth).
func (c *Conn) Send(ctx context.Context, evt *nostr.Event) (ok bool, reason string, err error) {
	if err := c.Write(ctx, nostr.EventEnvelope{Event: *evt}); err != nil {
		return false, "", fmt.Errorf("send %s (kind %d): %w", evt.ID, evt.Kind, err)
	}
	return c.readOK(ctx, evt.ID)
}

// readOK reads until the OK for id.
func (c *Conn) readOK(ctx context.Context, id string) (ok bool, reason string, err error) {
	for {
		env, _, err := c.Read(ctx)
		if err != nil {
			return false, "", fmt.Errorf("waiting for OK of %s: %w", id, err)
		}
		if o, isOK := env.(*nostr.OKEnvelope); isOK && o.EventID == id {
			return o.OK, o.Reason, nil
		}
	}
}

// Auth authenticates the connection (NIP-42) as key: it answers the last
// challenge the relay sent, reading until one arrives if none has, and
// fails unless the relay accepts the answer.
func (c *Conn) Auth(ctx context.Context, key testkit.Key) error {
	for c.challenge == "" {
		if _, _, err := c.Read(ctx); err != nil {
			return fmt.Errorf("waiting for AUTH challenge: %w", err)
		}
	}
	evt := nip42.CreateUnsignedAuthEvent(c.challenge, key.PubKey, c.URL)
	key.Sign(&evt)
	if err := c.Write(ctx, nostr.AuthEnvelope{Event: evt}); err != nil {
		return fmt.Errorf("auth: %w", err)
	}
	ok, reason, err := c.readOK(ctx, evt.ID)
	if err != nil {
		return fmt.Errorf("auth: %w", err)
	}
	if !ok {
		return fmt.Errorf("auth to %s refused: %s", c.URL, reason)
	}
	return nil
}

// awaitOK reads until the OK for id and turns OK=false into an error.
func awaitOK(ctx context.Context, c *Conn, id string) error {
	ok, reason, err := c.readOK(ctx, id)
	if err != nil {
		return err
	}
	if !ok {
		return fmt.Errorf("rejected: %s", reason)
	}
	return nil
}

// QueryAll sends one REQ with filter f to the relay at url and returns every
// event received before EOSE, in the relay's order and unfiltered (no
// signature or filter checks: tests see exactly what the relay sent). It
// fails if the relay answers CLOSED, the connection drops, or ctx ends first;
// give ctx a timeout.
func QueryAll(ctx context.Context, url string, f nostr.Filter) ([]*nostr.Event, error) {
	c, err := Dial(ctx, url)
	if err != nil {
		return nil, err
	}
	defer func() { _ = c.Close() }()

	const subID = "testkit-query"
	if err := c.Write(ctx, nostr.ReqEnvelope{SubscriptionID: subID, Filters: nostr.Filters{f}}); err != nil {
		return nil, fmt.Errorf("query: %w", err)
	}
	var out []*nostr.Event
	for {
		env, _, err := c.Read(ctx)
		if err != nil {
			return out, fmt.Errorf("query %s before EOSE (%d events): %w", url, len(out), err)
		}
		switch env := env.(type) {
		case *nostr.EventEnvelope:
			if env.SubscriptionID != nil && *env.SubscriptionID == subID {
				evt := env.Event
				out = append(out, &evt)
			}
		case *nostr.EOSEEnvelope:
			if string(*env) == subID {
				_ = c.Write(ctx, nostr.CloseEnvelope(subID))
				return out, nil
			}
		case *nostr.ClosedEnvelope:
			if env.SubscriptionID == subID {
				return out, fmt.Errorf("query %s: relay closed subscription: %s", url, env.Reason)
			}
		}
	}
}
