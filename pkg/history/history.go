// Package history reads a relay's stored events for a filter completely,
// page by page with "until", the way NIP-01 allows: relays cap every REQ
// (strfry at 500, khatru's stores at their query limit), so one REQ never
// proves that everything was returned.
package history

import (
	"context"
	"errors"
	"fmt"

	"github.com/nbd-wtf/go-nostr"

	"github.com/grasp-sync/grasp-sync/pkg/relayconn"
)

// Cursor decides the next page of an until-paginated read. It is pure:
// feed it each page, it says what was new and where to continue.
//
// The next page ends at the oldest timestamp of the previous one,
// inclusive, because events sharing that timestamp may have been cut off;
// ids already seen at the boundary are remembered and skipped. When a page
// adds nothing new (more events than a page share one created_at), the
// cursor steps below that timestamp so pagination always terminates.
type Cursor struct {
	until    *nostr.Timestamp
	boundary map[string]struct{}
	done     bool
}

// Until is the until bound of the next page (nil for the first).
func (c *Cursor) Until() *nostr.Timestamp { return c.until }

// Done reports whether the read is complete.
func (c *Cursor) Done() bool { return c.done }

// Next records one page and returns the events not seen before.
func (c *Cursor) Next(page []*nostr.Event) (fresh []*nostr.Event) {
	if len(page) == 0 {
		c.done = true
		return nil
	}
	oldest := page[0].CreatedAt
	for _, e := range page {
		if e.CreatedAt < oldest {
			oldest = e.CreatedAt
		}
		if _, seen := c.boundary[e.ID]; !seen {
			fresh = append(fresh, e)
		}
	}
	if len(fresh) == 0 {
		// Everything at this timestamp that the relay will give us has been
		// seen: step below it.
		if oldest == 0 {
			c.done = true
			return nil
		}
		next := oldest - 1
		c.until = &next
		c.boundary = nil
		return nil
	}
	if c.until == nil || oldest != *c.until {
		c.boundary = map[string]struct{}{}
	}
	for _, e := range page {
		if e.CreatedAt == oldest {
			c.boundary[e.ID] = struct{}{}
		}
	}
	o := oldest
	c.until = &o
	return fresh
}

// ErrTooDeep is returned when a read needs more pages than allowed.
var ErrTooDeep = errors.New("pagination depth exceeded")

// Stats describes one paginated read.
type Stats struct {
	Pages  int
	Events int
}

// Read pages through every stored event matching f (f.Until is the
// starting point if set; f.Limit is the page size) and hands each page's
// new events to fn.
func Read(ctx context.Context, r *relayconn.Conn, f nostr.Filter, maxPages int, fn func([]*nostr.Event) error) (Stats, error) {
	var st Stats
	c := &Cursor{until: f.Until}
	for !c.Done() {
		if maxPages > 0 && st.Pages >= maxPages {
			return st, fmt.Errorf("%s: %w after %d pages", r.URL(), ErrTooDeep, st.Pages)
		}
		pf := f
		pf.Until = c.Until()
		page, err := Page(ctx, r, pf)
		if err != nil {
			return st, err
		}
		st.Pages++
		fresh := c.Next(page)
		st.Events += len(fresh)
		if len(fresh) > 0 {
			if err := fn(fresh); err != nil {
				return st, err
			}
		}
	}
	return st, nil
}

// Page sends one REQ and returns what the relay sends before EOSE. A
// timeout, a CLOSED or a lost connection is an error, never a silently short
// result (go-nostr's QuerySync returns what it has on timeout).
func Page(ctx context.Context, r *relayconn.Conn, f nostr.Filter) ([]*nostr.Event, error) {
	sub, err := r.Subscribe(ctx, nostr.Filters{f})
	if err != nil {
		return nil, fmt.Errorf("REQ: %w", err)
	}
	defer sub.Close()
	var out []*nostr.Event
	for {
		select {
		case evt := <-sub.Events():
			out = append(out, evt)
		case <-sub.EOSE():
			// Events before EOSE are delivered in order; drain what is
			// buffered.
			for {
				select {
				case evt := <-sub.Events():
					out = append(out, evt)
				default:
					return out, nil
				}
			}
		case reason := <-sub.Closed():
			return out, fmt.Errorf("REQ to %s closed: %s", r.URL(), reason)
		case <-r.Context().Done():
			return out, fmt.Errorf("REQ to %s: %w", r.URL(), context.Cause(r.Context()))
		case <-ctx.Done():
			return out, fmt.Errorf("REQ to %s: %w", r.URL(), ctx.Err())
		}
	}
}
