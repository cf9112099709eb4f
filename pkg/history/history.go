// Package history reads a relay's stored events for a filter completely,
// page by page with "until", the way NIP-01 allows: relays cap every REQ
// (strfry at 500, khatru's stores at their query limit), so one REQ never
// proves that everything was returned.
package history

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"
	"sync/atomic"

	"github.com/nbd-wtf/go-nostr"

	"github.com/grasp-sync/grasp-sync/pkg/negsync"
	"github.com/grasp-sync/grasp-sync/pkg/relayconn"
)

// Cursor decides the next page of an until-paginated read. It is pure:
// feed it each page, it says what was new and where to continue.
//
// The next page ends at the oldest timestamp of the previous one,
// inclusive, because events sharing that timestamp may have been cut off;
// ids already seen at the boundary are remembered and skipped. When a page
// adds nothing new (more events than a page share one created_at), the
// cursor steps below that timestamp so pagination always terminates; the
// events of that second it could not reach are Reader's job (Below).
type Cursor struct {
	until    *nostr.Timestamp
	boundary map[string]struct{}
	done     bool
}

// Below continues the read below second t, once everything at t has been
// read (see Reader).
func (c *Cursor) Below(t nostr.Timestamp) {
	c.boundary = nil
	if t == 0 {
		c.done = true
		return
	}
	next := t - 1
	c.until = &next
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
	if c.boundary == nil || c.until == nil || oldest != *c.until {
		// (after a step below t the next page can end at t-1 itself)
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

// ErrIgnoresUntil means the relay answered a page with events newer than
// its until, so paging cannot make progress.
var ErrIgnoresUntil = errors.New("relay ignores until")

// ErrIncomplete is wrapped by the error of a read that could not fetch
// every event of some one-second slice (see IncompleteError).
var ErrIncomplete = errors.New("history incomplete")

// IncompleteError lists the one-second slices a read could not complete:
// each still filled a capped page after every list in it had been split
// down to a single value, and no NIP-77 was available for it. Everything
// else was read; the caller must not treat the read as complete.
type IncompleteError struct {
	Slices []nostr.Filter
}

func (e *IncompleteError) Error() string {
	parts := make([]string, 0, min(len(e.Slices), 3))
	for _, f := range e.Slices[:min(len(e.Slices), 3)] {
		parts = append(parts, f.String())
	}
	more := ""
	if len(e.Slices) > 3 {
		more = fmt.Sprintf(" and %d more", len(e.Slices)-3)
	}
	return fmt.Sprintf("%s: %d one-second slice(s) hit the relay's cap and cannot be split further: %s%s",
		ErrIncomplete, len(e.Slices), strings.Join(parts, ", "), more)
}

// Is makes errors.Is(err, ErrIncomplete) true.
func (e *IncompleteError) Is(target error) bool { return target == ErrIncomplete }

// Stats describes one paginated read.
type Stats struct {
	Pages  int
	Events int
	// Seconds counts the one-second slices read apart because a capped
	// page fell entirely inside one second.
	Seconds int
	// Incomplete lists the slices that could not be read completely.
	Incomplete []nostr.Filter
}

// Reader reads a relay's stored events for a filter completely, including
// seconds that hold more events than the relay returns for one REQ (see
// docs/decisions/0021-history-crowded-second.md). A
// Reader runs one read at a time.
type Reader struct {
	// Page sends one REQ and returns what the relay sent before EOSE; a
	// short result must never be returned without an error (see Page).
	Page func(ctx context.Context, f nostr.Filter) ([]*nostr.Event, error)
	// Full is the smallest page that may have been capped when looking
	// for a crowded second: at most the smallest cap assumed of relays,
	// and at most the page size; a full page within one second is read
	// apart. It is an assumption, so it never ends a read (ShortPageEnds
	// and Cap do). Zero means the filter's limit.
	Full int
	// MaxPages bounds the REQs of one read (0: unbounded).
	MaxPages int
	// ShortPageEnds ends the read at the first page proven not capped:
	// shorter than the filter's limit and than the largest page the relay
	// has returned (Cap), saving the last, empty page. A shorter page that
	// proves nothing (the relay may cap exactly there) asks one more page.
	// Without it the read goes on until a page brings nothing new.
	ShortPageEnds bool
	// Cap remembers the largest page the relay has returned, across reads
	// (shared by the reads of one connection); nil learns within each
	// read only.
	Cap *Cap
	// Second, when set, reads one second of a filter (since = until)
	// completely by other means than REQ, i.e. NIP-77; have are the ids of
	// that second already read. An error wrapping negsync.ErrUnsupported
	// means it cannot, and the slice is split instead.
	Second func(ctx context.Context, f nostr.Filter, have []string) ([]*nostr.Event, error)

	// noSecond is set during a read once Second said it cannot, so the
	// other crowded seconds go straight to splitting.
	noSecond bool
}

// Cap is what a relay has shown of its per-REQ result cap: the largest
// page it has returned, so its cap is at least that. A page shorter than
// that (and than the filter's limit) is everything the filter matches
// below its until; nothing else proves it, since relays cap anywhere
// (docs/decisions/0021-history-crowded-second.md).
// It is one number, safe for concurrent reads.
type Cap struct{ largest atomic.Int64 }

// Observe records a page of n events.
func (c *Cap) Observe(n int) {
	for {
		old := c.largest.Load()
		if int64(n) <= old || c.largest.CompareAndSwap(old, int64(n)) {
			return
		}
	}
}

// Known is the largest page observed: the relay's cap is at least that.
func (c *Cap) Known() int { return int(c.largest.Load()) }

// Uncapped reports whether a page of n events asked with limit (0: none)
// is proven not cut short by the relay's cap or the limit.
func (c *Cap) Uncapped(n, limit int) bool {
	return n < c.Known() && (limit <= 0 || n < limit)
}

// Read pages through every stored event matching f (f.Until is the
// starting point if set; f.Limit is the page size) and hands each page's
// new events to fn. Slices it cannot complete are read as far as the relay
// allows and reported at the end with an *IncompleteError.
func (r *Reader) Read(ctx context.Context, f nostr.Filter, fn func([]*nostr.Event) error) (Stats, error) {
	var st Stats
	r.noSecond = false
	full := r.Full
	if full <= 0 || (f.Limit > 0 && f.Limit < full) {
		full = f.Limit
	}
	if full <= 0 {
		return st, errors.New("history read needs a page size (filter limit or Reader.Full)")
	}
	relayCap := r.Cap
	if relayCap == nil {
		relayCap = &Cap{}
	}
	page := func(pf nostr.Filter) ([]*nostr.Event, error) {
		if r.MaxPages > 0 && st.Pages >= r.MaxPages {
			return nil, fmt.Errorf("%w after %d pages", ErrTooDeep, st.Pages)
		}
		st.Pages++
		evts, err := r.Page(ctx, pf)
		if err == nil {
			evts = Answer(evts, pf.Limit)
			relayCap.Observe(len(evts))
		}
		return evts, err
	}
	deliver := func(evts []*nostr.Event) error {
		if len(evts) == 0 {
			return nil
		}
		st.Events += len(evts)
		return fn(evts)
	}
	c := &Cursor{until: f.Until}
	var read *nostr.Timestamp // the last crowded second read
	// lone is a page that fell within one second below full and proved
	// nothing: the next page, below that second, tells whether the relay
	// capped it (see below).
	var lone *onePage
	for !c.Done() {
		pf := f
		pf.Until = c.Until()
		evts, err := page(pf)
		if err != nil {
			return st, err
		}
		if lone != nil && len(evts) > 0 {
			t := lone.at
			for _, e := range evts {
				if e.CreatedAt >= t {
					return st, fmt.Errorf("%w: events at %d answered below until %d", ErrIgnoresUntil, e.CreatedAt, t-1)
				}
			}
			// Older events exist, yet the page before stopped at lone.n
			// events of second t: the relay caps at lone.n, so second t
			// may hold more and is read on its own under that cap.
			read = &t
			st.Seconds++
			if err := r.readSecond(ctx, f, t, lone.ids, lone.n, page, deliver, &st); err != nil {
				return st, err
			}
		}
		lone = nil
		fresh := c.Next(evts)
		if err := deliver(fresh); err != nil {
			return st, err
		}
		if t, crowded := CrowdedSecond(evts, full); crowded {
			if read != nil && t >= *read {
				// Only a relay that ignores until gets here; going on
				// would read the same second forever.
				return st, fmt.Errorf("%w: second %d returned again below until %d", ErrIgnoresUntil, t, *read-1)
			}
			read = &t
			st.Seconds++
			if err := r.readSecond(ctx, f, t, c.boundary, 0, page, deliver, &st); err != nil {
				return st, err
			}
			c.Below(t)
			continue
		}
		uncapped := relayCap.Uncapped(len(evts), f.Limit)
		if r.ShortPageEnds && len(evts) > 0 && uncapped {
			break // shorter than the relay's cap: the whole rest
		}
		if t, ok := oneSecond(evts); ok && len(fresh) > 0 && !c.Done() {
			// Asking until t again could only repeat this page: go below.
			// If the relay may have capped it, the next page decides.
			if !uncapped {
				lone = &onePage{at: t, n: len(evts), ids: c.boundary}
			}
			c.Below(t)
		}
	}
	if len(st.Incomplete) > 0 {
		return st, &IncompleteError{Slices: st.Incomplete}
	}
	return st, nil
}

// Answer returns the part of a page that can be the relay's answer to a REQ
// with limit: all of it when it holds at most limit events (or limit is 0),
// else its limit newest. A relay sends a subscription the events stored
// while it answers too, before its EOSE (khatru does; NIP-01 does not forbid it): events
// synced from elsewhere carry old created_at values, and one such event
// older than the answer would move the next page's until below events the
// read has not seen. The limit newest are at least as new as the answer's
// oldest, so paging from them skips nothing; the older events left out are
// stored, and later pages read them (docs/decisions/0069-history-pages-ignore-broadcasts.md).
// Page order is kept.
func Answer(page []*nostr.Event, limit int) []*nostr.Event {
	if limit <= 0 || len(page) <= limit {
		return page
	}
	newest := slices.Clone(page)
	slices.SortStableFunc(newest, func(a, b *nostr.Event) int { return cmp.Compare(b.CreatedAt, a.CreatedAt) })
	cut := newest[limit-1].CreatedAt
	// Every event newer than the limit-th newest, and as many at its
	// second as fill the limit, in page order.
	atCut := 0
	for _, e := range newest[:limit] {
		if e.CreatedAt == cut {
			atCut++
		}
	}
	out := make([]*nostr.Event, 0, limit)
	for _, e := range page {
		switch {
		case e.CreatedAt > cut:
			out = append(out, e)
		case e.CreatedAt == cut && atCut > 0:
			out = append(out, e)
			atCut--
		}
	}
	return out
}

// onePage is a page whose events all share second at.
type onePage struct {
	at  nostr.Timestamp
	n   int
	ids map[string]struct{}
}

// oneSecond reports the second all of page's events share, if they do.
func oneSecond(page []*nostr.Event) (nostr.Timestamp, bool) {
	if len(page) == 0 {
		return 0, false
	}
	for _, e := range page[1:] {
		if e.CreatedAt != page[0].CreatedAt {
			return 0, false
		}
	}
	return page[0].CreatedAt, true
}

// readSecond reads every event of f at second t: with Second (NIP-77) if
// it can, otherwise by REQ, splitting the slice (see Split) until each part
// comes back shorter than full, and than relayCap when it is set (a cap the
// relay was seen to apply). seen are the ids at t already delivered.
func (r *Reader) readSecond(ctx context.Context, f nostr.Filter, t nostr.Timestamp, seen map[string]struct{}, relayCap int,
	page func(nostr.Filter) ([]*nostr.Event, error), deliver func([]*nostr.Event) error, st *Stats) error {
	got := make(map[string]struct{}, len(seen))
	for id := range seen {
		got[id] = struct{}{}
	}
	unseen := func(evts []*nostr.Event) []*nostr.Event {
		var out []*nostr.Event
		for _, e := range evts {
			if e.CreatedAt != t {
				continue // a relay ignoring since/until: not this slice's
			}
			if _, dup := got[e.ID]; !dup {
				got[e.ID] = struct{}{}
				out = append(out, e)
			}
		}
		return out
	}
	slice := f
	slice.Since, slice.Until = &t, &t
	if r.Second != nil && !r.noSecond {
		have := make([]string, 0, len(got))
		for id := range got {
			have = append(have, id)
		}
		evts, err := r.Second(ctx, slice, have)
		if err == nil {
			return deliver(unseen(evts))
		}
		if !errors.Is(err, negsync.ErrUnsupported) {
			return fmt.Errorf("one-second slice at %d: %w", t, err)
		}
		r.noSecond = true // NIP-77 cannot do it here: split instead
	}
	queue := []nostr.Filter{slice}
	for len(queue) > 0 {
		part := queue[len(queue)-1]
		queue = queue[:len(queue)-1]
		evts, err := page(part)
		if err != nil {
			return err
		}
		if err := deliver(unseen(evts)); err != nil {
			return err
		}
		if len(evts) < r.full(part) && (relayCap <= 0 || len(evts) < relayCap) {
			continue
		}
		a, b, ok := Split(part)
		if !ok {
			st.Incomplete = append(st.Incomplete, part)
			continue
		}
		queue = append(queue, b, a)
	}
	return nil
}

func (r *Reader) full(f nostr.Filter) int {
	if r.Full <= 0 || (f.Limit > 0 && f.Limit < r.Full) {
		return f.Limit
	}
	return r.Full
}

// CrowdedSecond reports whether a page may hide events at one second: it
// is full (at least full events, so it may have been capped) and every
// event in it shares one created_at, t. Paging with until cannot get past
// such a second; it must be read on its own.
func CrowdedSecond(page []*nostr.Event, full int) (t nostr.Timestamp, crowded bool) {
	if len(page) == 0 || len(page) < full {
		return 0, false
	}
	t = page[0].CreatedAt
	for _, e := range page[1:] {
		if e.CreatedAt != t {
			return 0, false
		}
	}
	return t, true
}

// Split divides f into two filters that together match every event f
// matches, by halving its longest list: a tag's values, kinds, authors or
// ids (an event may match both halves of a tag list; readers drop the
// duplicate by id). It reports false when every list has at most one
// value: a filter such as {kinds: [1621], #a: [coordinate]} cannot be
// narrowed soundly, because a filter can only name values, never exclude
// them, and the values of an unconstrained field (a filter without kinds
// matches every kind) cannot be enumerated.
func Split(f nostr.Filter) (a, b nostr.Filter, ok bool) {
	best, bestLen := "", 1
	consider := func(name string, n int) {
		if n > bestLen {
			best, bestLen = name, n
		}
	}
	names := make([]string, 0, len(f.Tags))
	for name := range f.Tags {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		consider("#"+name, len(f.Tags[name]))
	}
	consider("kinds", len(f.Kinds))
	consider("authors", len(f.Authors))
	consider("ids", len(f.IDs))
	if best == "" {
		return f, nostr.Filter{}, false
	}
	a, b = f, f
	half := bestLen / 2
	switch best {
	case "kinds":
		a.Kinds, b.Kinds = slices.Clone(f.Kinds[:half]), slices.Clone(f.Kinds[half:])
	case "authors":
		a.Authors, b.Authors = slices.Clone(f.Authors[:half]), slices.Clone(f.Authors[half:])
	case "ids":
		a.IDs, b.IDs = slices.Clone(f.IDs[:half]), slices.Clone(f.IDs[half:])
	default:
		name := strings.TrimPrefix(best, "#")
		vals := f.Tags[name]
		a.Tags, b.Tags = maps.Clone(f.Tags), maps.Clone(f.Tags)
		a.Tags[name], b.Tags[name] = slices.Clone(vals[:half]), slices.Clone(vals[half:])
	}
	return a, b, true
}

// Read pages through every stored event matching f with one connection
// (f.Limit is the page size and, unless full is smaller, the threshold of a
// possibly capped page); a crowded second is read with NIP-77 when the
// relay offers it, split into REQs otherwise. See Reader.Read.
func Read(ctx context.Context, r *relayconn.Conn, f nostr.Filter, full, maxPages int, fn func([]*nostr.Event) error) (Stats, error) {
	rd := &Reader{
		Page:     func(ctx context.Context, pf nostr.Filter) ([]*nostr.Event, error) { return Page(ctx, r, pf) },
		Full:     full,
		MaxPages: maxPages,
	}
	rd.Second = NIP77Second(r, negsync.Options{}, rd.Page, func() int { return rd.full(f) })
	st, err := rd.Read(ctx, f, fn)
	if err != nil && !errors.Is(err, ErrIncomplete) {
		err = fmt.Errorf("%s: %w", r.URL(), err)
	}
	return st, err
}

// NIP77Second returns a Reader.Second that reconciles the slice with NIP-77
// on c (our side: the ids already read) and fetches the rest by id, at most
// chunk() ids per REQ so no answer can be capped. A relay that names ids it
// then does not return cannot be trusted for the slice: that is
// negsync.ErrUnsupported, and the slice is split instead.
func NIP77Second(c *relayconn.Conn, opts negsync.Options, page func(context.Context, nostr.Filter) ([]*nostr.Event, error), chunk func() int) func(context.Context, nostr.Filter, []string) ([]*nostr.Event, error) {
	return func(ctx context.Context, f nostr.Filter, have []string) ([]*nostr.Event, error) {
		local := make([]negsync.Item, 0, len(have))
		for _, id := range have {
			local = append(local, negsync.Item{ID: id, CreatedAt: *f.Since})
		}
		nf := f
		nf.Limit, nf.LimitZero = 0, false
		res, err := negsync.Reconcile(ctx, c, nf, local, opts)
		if err != nil {
			return nil, err
		}
		n := max(chunk(), 1)
		var out []*nostr.Event
		for start := 0; start < len(res.Need); start += n {
			ids := res.Need[start:min(start+n, len(res.Need))]
			evts, err := page(ctx, nostr.Filter{IDs: ids, Limit: len(ids)})
			if err != nil {
				return out, err
			}
			want := make(map[string]struct{}, len(ids))
			for _, id := range ids {
				want[id] = struct{}{}
			}
			for _, e := range evts {
				if _, ok := want[e.ID]; ok {
					delete(want, e.ID)
					out = append(out, e)
				}
			}
			if len(want) > 0 {
				return out, &negsync.UnsupportedError{Reason: fmt.Sprintf("%d of %d ids named by NIP-77 not returned", len(want), len(ids))}
			}
		}
		return out, nil
	}
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
			return append(out, sub.Buffered()...), nil
		case reason := <-sub.Closed():
			return out, fmt.Errorf("REQ to %s closed: %s", r.URL(), reason)
		case <-r.Context().Done():
			return out, fmt.Errorf("REQ to %s: %w", r.URL(), context.Cause(r.Context()))
		case <-ctx.Done():
			return out, fmt.Errorf("REQ to %s: %w", r.URL(), ctx.Err())
		}
	}
}
