package testkit

import (
	"context"
	"fmt"

	"github.com/nbd-wtf/go-nostr"
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

// awaitOK reads until the OK for id and turns OK=false into an error.
func awaitOK(ctx context.Context, c *Conn, id string) error {
	for {
		env, _, err := c.Read(ctx)
		if err != nil {
			return fmt.Errorf("waiting for OK: %w", err)
		}
		if ok, isOK := env.(*nostr.OKEnvelope); isOK && ok.EventID == id {
			if !ok.OK {
				return fmt.Errorf("rejected: %s", ok.Reason)
			}
			return nil
		}
	}
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
