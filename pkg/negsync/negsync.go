// Package negsync is the client side of NIP-77 (negentropy set
// reconciliation) over our own relay connection (pkg/relayconn). It tells
// which ids a relay holds for a filter that the local set lacks, so only
// those are fetched: when both sides mostly agree, that costs a few hundred
// bytes instead of every event.
//
// It drives go-nostr's protocol engine (nip77/negentropy) itself rather than
// calling nip77.NegentropySync, which waits without honouring its context,
// leaks a connection per call and reports success when transfers failed (see
// docs/dependencies.md, "go-nostr v0.52.3").
package negsync

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"sync"
	"time"

	"github.com/nbd-wtf/go-nostr"
	"github.com/nbd-wtf/go-nostr/nip77"
	"github.com/nbd-wtf/go-nostr/nip77/negentropy"
	"github.com/tidwall/gjson"

	"github.com/grasp-sync/grasp-sync/pkg/relayconn"
)

// Defaults of Options.
const (
	// DefaultFrameSize is the largest message we send, like strfry's own
	// sync client: strfry accepts 131,072-byte frames, khatru 512,000.
	DefaultFrameSize = 60_000
	// DefaultRoundTimeout bounds the wait for each relay answer.
	DefaultRoundTimeout = 30 * time.Second
	// DefaultMaxRounds bounds one reconciliation (real sets need a handful
	// of rounds; this only stops a broken peer from looping forever).
	DefaultMaxRounds = 1000
)

// Item is one element of the local set.
type Item struct {
	ID        string
	CreatedAt nostr.Timestamp
}

// Options tunes a reconciliation.
type Options struct {
	FrameSize    int
	RoundTimeout time.Duration
	MaxRounds    int
	// Have collects Result.Have, the ids the local set has and the relay
	// lacks (off by default: a fetcher only downloads, and the list can be
	// as large as the local set).
	Have bool
}

// Result is what a reconciliation found.
type Result struct {
	// Need are the ids the relay has and the local set lacks, each once
	// (with a frame limit the engine can report an id more than once).
	Need []string
	// Have are the ids the local set has and the relay lacks, each once,
	// when Options.Have asked for them.
	Have []string
	// Rounds counts NEG-MSG answers from the relay.
	Rounds int
	// BytesIn and BytesOut count the NIP-77 messages received and sent.
	BytesIn, BytesOut uint64
}

// ErrUnsupported is wrapped by every error meaning "NIP-77 does not work
// with this relay for this filter; fetch with REQ instead": NEG-ERR (or
// khatru's NEG-ERROR), a NOTICE before the first NEG-MSG that names
// negentropy, an unknown message or a parse failure, a timeout, or a
// protocol error in the relay's answers.
var ErrUnsupported = errors.New("negentropy unsupported")

// UnsupportedError says why NIP-77 was given up.
type UnsupportedError struct{ Reason string }

func (e *UnsupportedError) Error() string { return "negentropy unsupported: " + e.Reason }

// Is makes errors.Is(err, ErrUnsupported) true.
func (e *UnsupportedError) Is(target error) bool { return target == ErrUnsupported }

// noticeMeansNoNIP77 matches NOTICEs relays send instead of answering a
// NEG-OPEN they do not understand (strfry: "ERROR: bad msg: negentropy
// disabled", khatru without NIP-77: "failed to parse envelope: unknown
// envelope label").
var noticeMeansNoNIP77 = regexp.MustCompile(`(?i)neg-|negentropy|unsupported|unknown|bad msg|envelope|disabled|unrecognized|could not parse|invalid`)

// NoticeMeansNoNIP77 reports whether a NOTICE received before the first
// NEG-MSG says the relay cannot do NIP-77.
func NoticeMeansNoNIP77(notice string) bool { return noticeMeansNoNIP77.MatchString(notice) }

// Reconcile runs NIP-77 for filter against the relay on c, with local as
// our side, and returns the ids we need. The connection stays usable for
// other subscriptions meanwhile.
func Reconcile(ctx context.Context, c *relayconn.Conn, filter nostr.Filter, local []Item, opts Options) (Result, error) {
	return ReconcileSet(ctx, c, filter, NewSet(local), opts)
}

// ReconcileSet is Reconcile with our side built already: a set shared by
// several reconciliations is built once (Set).
func ReconcileSet(ctx context.Context, c *relayconn.Conn, filter nostr.Filter, local *Set, opts Options) (Result, error) {
	if opts.FrameSize == 0 {
		opts.FrameSize = DefaultFrameSize
	}
	if opts.RoundTimeout <= 0 {
		opts.RoundTimeout = DefaultRoundTimeout
	}
	if opts.MaxRounds <= 0 {
		opts.MaxRounds = DefaultMaxRounds
	}
	if local == nil {
		local = NewSet(nil)
	}
	var res Result
	neg := negentropy.New(local, opts.FrameSize)

	id := c.NewID()
	ch, err := c.OpenChannel(ctx, id)
	if err != nil {
		return res, err
	}
	defer ch.Close()
	notices, stopNotices := c.WatchNotices(8)
	defer stopNotices()

	// The engine reports ids on channels while Reconcile runs on our
	// goroutine, so they are drained concurrently; the drain ends when the
	// engine closes them (done) or, after our last Reconcile call, on stop.
	need, have := newIDSet(), newIDSet()
	addHave := func(string) {} // we only download, unless asked
	if opts.Have {
		addHave = have.add
	}
	stop := make(chan struct{})
	var drains sync.WaitGroup
	drains.Add(2)
	go drain(neg.HaveNots, stop, need.add, &drains)
	go drain(neg.Haves, stop, addHave, &drains)
	finish := func() []string {
		close(stop)
		drains.Wait()
		if opts.Have {
			res.Have = have.list()
		}
		return need.list()
	}

	send := func(raw []byte) error {
		res.BytesOut += uint64(len(raw))
		return c.WriteRaw(ctx, raw)
	}
	open, _ := nip77.OpenEnvelope{SubscriptionID: id, Filter: filter, Message: neg.Start()}.MarshalJSON()
	if err := send(open); err != nil {
		res.Need = finish()
		return res, err
	}
	closeSession := func() {
		cl, _ := nip77.CloseEnvelope{SubscriptionID: id}.MarshalJSON()
		wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_ = c.WriteRaw(wctx, cl)
	}
	fail := func(err error) (Result, error) {
		res.BytesIn = ch.Bytes()
		res.Need = finish()
		if c.Context().Err() == nil {
			closeSession()
		}
		return res, err
	}

	timer := time.NewTimer(opts.RoundTimeout)
	defer timer.Stop()
	var last []byte // our last NEG-MSG, for the khatru retry below
	khatruRetries := 0
	for {
		select {
		case <-ctx.Done():
			return fail(ctx.Err())
		case <-c.Context().Done():
			return fail(fmt.Errorf("negentropy with %s: %w", c.URL(), context.Cause(c.Context())))
		case <-timer.C:
			return fail(&UnsupportedError{Reason: fmt.Sprintf("no answer within %s", opts.RoundTimeout)})
		case notice := <-notices:
			if res.Rounds == 0 && NoticeMeansNoNIP77(notice) {
				return fail(&UnsupportedError{Reason: "NOTICE: " + notice})
			}
		case m := <-ch.Messages():
			switch m.Label {
			case "NEG-ERR", "NEG-ERROR":
				reason := gjson.GetBytes(m.Raw, "2").String()
				if m.Label == "NEG-ERROR" && reason == "CLOSED" && last != nil && khatruRetries < 3 {
					// khatru v0.19.1 answers NEG-OPEN before it stores the
					// session, so a fast client's next NEG-MSG can find no
					// session; the lookup changes nothing, so sending the
					// same message again is safe.
					khatruRetries++
					select {
					case <-time.After(time.Duration(khatruRetries) * 20 * time.Millisecond):
					case <-ctx.Done():
						return fail(ctx.Err())
					}
					if err := send(last); err != nil {
						return fail(err)
					}
					continue
				}
				return fail(&UnsupportedError{Reason: m.Label + ": " + reason})
			case "NEG-MSG":
			default:
				continue
			}
			res.Rounds++
			if res.Rounds > opts.MaxRounds {
				return fail(&UnsupportedError{Reason: fmt.Sprintf("more than %d rounds", opts.MaxRounds)})
			}
			out, err := neg.Reconcile(gjson.GetBytes(m.Raw, "2").String())
			if err != nil {
				return fail(&UnsupportedError{Reason: "bad NEG-MSG: " + err.Error()})
			}
			if out == "" {
				// Reconciled: the engine closed its channels.
				drains.Wait()
				res.Need = need.list()
				if opts.Have {
					res.Have = have.list()
				}
				res.BytesIn = ch.Bytes()
				closeSession()
				return res, nil
			}
			next, _ := nip77.MessageEnvelope{SubscriptionID: id, Message: out}.MarshalJSON()
			last = next
			if err := send(next); err != nil {
				return fail(err)
			}
			if !timer.Stop() {
				select {
				case <-timer.C:
				default:
				}
			}
			timer.Reset(opts.RoundTimeout)
		}
	}
}

func drain(ids <-chan string, stop <-chan struct{}, add func(string), wg *sync.WaitGroup) {
	defer wg.Done()
	for {
		select {
		case id, ok := <-ids:
			if !ok {
				return
			}
			add(id)
		case <-stop:
			for {
				select {
				case id, ok := <-ids:
					if !ok {
						return
					}
					add(id)
				default:
					return
				}
			}
		}
	}
}

// idSet keeps ids once, in first-seen order.
type idSet struct {
	mu    sync.Mutex
	seen  map[string]struct{}
	order []string
}

func newIDSet() *idSet { return &idSet{seen: map[string]struct{}{}} }

func (s *idSet) add(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.seen[id]; ok {
		return
	}
	s.seen[id] = struct{}{}
	s.order = append(s.order, id)
}

func (s *idSet) list() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.order...)
}
