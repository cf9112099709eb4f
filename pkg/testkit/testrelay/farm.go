package testrelay

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fiatjaf/eventstore"
	"github.com/fiatjaf/khatru"
	"github.com/nbd-wtf/go-nostr"

	"github.com/grasp-sync/grasp-sync/pkg/khatrulock"
)

// A relay farm is many khatru relays in one process, answering like the
// relays graspd meets (khatru, strfry): NIP-77 on some, a REQ cap on all,
// optionally the tag-letter quirk of plain khatru. Each relay counts what
// its clients did (connections, REQs, NEG-OPENs, events sent, bytes), so a
// benchmark of graspd at the design's scale (issue 23: 1,000 repositories
// over 100 relays and up) can say what the sync cost the remotes. The farm
// runs in a process of its own (e2e/cmd/relayfarm) so graspd's CPU and
// memory are measured apart from it.

// FarmOptions shape a farm.
type FarmOptions struct {
	// Relays is how many relays to start.
	Relays int
	// NegentropyFraction of the relays answer NIP-77 (0.5: every other
	// one); the rest answer NEG-OPEN as khatru without it does (a NOTICE).
	NegentropyFraction float64
	// IgnoreTagLetterFraction of the relays match tag filters by value
	// whatever the letter, as plain khatru v0.19.1 over badger does.
	IgnoreTagLetterFraction float64
	// MaxLimit caps every REQ filter's results (0: DefaultMaxLimit, 500
	// like strfry); NIP-77 sessions are not capped.
	MaxLimit int
	// Host is the loopback address the relays listen on (default
	// 127.0.0.1), each on a port of its own.
	Host string
	// Limits are what every relay enforces on each connection, as strfry
	// or nostr-rs-relay do (issue 30; zero: unlimited). Limits.Advertise
	// makes every relay say so in NIP-11; AdvertiseFraction only some.
	Limits Limits
	// AdvertiseFraction of the relays publish their limits in NIP-11
	// (0.5: every other one, as the network has strfry relays that say and
	// relays that do not); the rest are silent.
	AdvertiseFraction float64
	// AuthReadsFraction of the relays refuse REQs and NEG-OPENs from
	// clients that have not authenticated (NIP-42), with CLOSED (NEG-ERR)
	// AuthReadsReason, and challenge every connection at once.
	AuthReadsFraction float64
}

// Farm is a running relay farm.
type Farm struct {
	// Relays are the farm's relays, by index.
	Relays []*FarmRelay
}

// FarmRelay is one relay of a farm.
type FarmRelay struct {
	// Index is the relay's position in the farm.
	Index int
	// URL is its websocket URL, ws://127.0.0.1:PORT.
	URL string
	// Negentropy and IgnoreTagLetter are how it answers.
	Negentropy, IgnoreTagLetter bool
	// Limits are what it enforces (Limits.Advertise: said in NIP-11);
	// AuthReads whether reading needs NIP-42 authentication.
	Limits    Limits
	AuthReads bool
	// Khatru is the relay; Store its events.
	Khatru *khatru.Relay
	Store  *MemStore

	srv *http.Server
	c   farmCounters
	lim *limiter
}

// farmCounters are one relay's counts, updated by its sockets and hooks.
type farmCounters struct {
	tcpAccepted, tcpOpen    atomic.Int64
	wsOpened, wsOpen        atomic.Int64
	maxWSOpen               atomic.Int64
	reqs, negOpens, negMsgs atomic.Int64
	closes, eventsIn, other atomic.Int64
	eventsOut, eoses        atomic.Int64
	notices, closed, negOut atomic.Int64
	negSessions, reqFilters atomic.Int64
	bytesIn, bytesOut       atomic.Int64

	conns sync.Map // open connections: *sniffConn -> struct{}, closed by Farm.Close
}

// countIn counts a message a client sent.
func (c *farmCounters) countIn(label string) {
	switch label {
	case "REQ":
		c.reqs.Add(1)
	case "NEG-OPEN":
		c.negOpens.Add(1)
	case "NEG-MSG":
		c.negMsgs.Add(1)
	case "CLOSE", "NEG-CLOSE":
		c.closes.Add(1)
	case "EVENT":
		c.eventsIn.Add(1)
	default:
		c.other.Add(1)
	}
}

// countOut counts a message the relay sent.
func (c *farmCounters) countOut(label string) {
	switch label {
	case "EVENT":
		c.eventsOut.Add(1)
	case "EOSE":
		c.eoses.Add(1)
	case "NOTICE":
		c.notices.Add(1)
	case "CLOSED":
		c.closed.Add(1)
	case "NEG-MSG", "NEG-ERR":
		c.negOut.Add(1)
	}
}

// RelayStats is what one relay of a farm saw, as JSON for the benchmark.
type RelayStats struct {
	Index           int    `json:"index"`
	URL             string `json:"url"`
	Negentropy      bool   `json:"negentropy"`
	IgnoreTagLetter bool   `json:"ignore_tag_letter"`
	// Stored is how many events the relay holds.
	Stored int `json:"stored"`
	// TCPAccepted counts TCP connections (websocket and plain HTTP such as
	// NIP-11); WSOpened the websocket sessions among them; WSOpen and
	// MaxWSOpen the sessions open now and at most at once.
	TCPAccepted int64 `json:"tcp_accepted"`
	WSOpened    int64 `json:"ws_opened"`
	WSOpen      int64 `json:"ws_open"`
	MaxWSOpen   int64 `json:"max_ws_open"`
	// REQs, NegOpens (also those sent to relays without NIP-77), NegMsgs,
	// Closes, EventsIn and Other count client messages by label;
	// REQFilters the filters of the REQs; NegSessions the NIP-77 sessions
	// the relay served.
	REQs        int64 `json:"reqs"`
	REQFilters  int64 `json:"req_filters"`
	NegOpens    int64 `json:"neg_opens"`
	NegSessions int64 `json:"neg_sessions"`
	NegMsgs     int64 `json:"neg_msgs"`
	Closes      int64 `json:"closes"`
	EventsIn    int64 `json:"events_in"`
	Other       int64 `json:"other_in"`
	// EventsSent, EOSEs, Notices, ClosedSent and NegSent count the
	// relay's messages by label (EventsSent: every EVENT, stored or live).
	EventsSent int64 `json:"events_sent"`
	EOSEs      int64 `json:"eoses"`
	Notices    int64 `json:"notices"`
	ClosedSent int64 `json:"closed_sent"`
	NegSent    int64 `json:"neg_sent"`
	// BytesIn and BytesOut are the bytes read and written on its sockets.
	BytesIn  int64 `json:"bytes_in"`
	BytesOut int64 `json:"bytes_out"`
	// Limits are the relay's limits (zero: none); Advertised whether NIP-11
	// says them; AuthReads whether reads need NIP-42.
	Limits     Limits `json:"limits"`
	Advertised bool   `json:"advertised"`
	AuthReads  bool   `json:"auth_reads"`
	// LimitCounts are what the limits refused, and the most subscriptions
	// one connection held open.
	LimitCounts
}

// pickEvery reports whether index i of n is among a fraction f of them,
// spread evenly (f = 0.5: every other one).
func pickEvery(i int, f float64) bool {
	if f <= 0 {
		return false
	}
	return math.Floor(float64(i+1)*f) > math.Floor(float64(i)*f)
}

// StartFarm starts o.Relays relays; Close stops them.
func StartFarm(o FarmOptions) (*Farm, error) {
	if o.Relays <= 0 {
		return nil, errors.New("farm: Relays must be positive")
	}
	if o.MaxLimit <= 0 {
		o.MaxLimit = DefaultMaxLimit
	}
	if o.Host == "" {
		o.Host = "127.0.0.1"
	}
	if err := o.Limits.Validate(); err != nil {
		return nil, fmt.Errorf("farm: %w", err)
	}
	f := &Farm{}
	for i := range o.Relays {
		// The quirk is spread from the other end, so it is not tied to
		// NIP-77 when both fractions are set; advertising starts from the
		// second relay, so with halves it falls on the relays without
		// NIP-77 (and the other way round) rather than with them.
		lim := o.Limits
		if pickEvery(i+1, o.AdvertiseFraction) {
			lim.Advertise = true
		}
		r, err := startFarmRelay(i, o, lim, pickEvery(i, o.NegentropyFraction), pickEvery(o.Relays-1-i, o.IgnoreTagLetterFraction), pickEvery(i, o.AuthReadsFraction))
		if err != nil {
			f.Close()
			return nil, err
		}
		f.Relays = append(f.Relays, r)
	}
	return f, nil
}

func startFarmRelay(i int, o FarmOptions, lim Limits, neg, quirk, authReads bool) (*FarmRelay, error) {
	st := &MemStore{IgnoreTagLetter: quirk}
	if err := st.Init(); err != nil {
		return nil, err
	}
	r := &FarmRelay{Index: i, Negentropy: neg, IgnoreTagLetter: quirk, Limits: lim, AuthReads: authReads, Khatru: khatru.NewRelay(), Store: st}
	rl := r.Khatru
	// Every relay reads through the limiter, limited or not, so a
	// benchmark comparing a limited farm with an unlimited one measures
	// the limits and not the limiter's own cost.
	r.lim = &limiter{lim: lim, negentropy: neg}
	r.lim.install(rl)
	if authReads {
		rl.OnConnect = append(rl.OnConnect, khatru.RequestAuth)
		rl.RejectFilter = append(rl.RejectFilter, func(ctx context.Context, _ nostr.Filter) (bool, string) {
			if khatru.GetConnection(ctx) != nil && khatru.GetAuthed(ctx) == "" {
				r.lim.authRefused.Add(1)
				return true, AuthReadsReason
			}
			return false, ""
		})
	}
	rl.Negentropy = neg
	rl.Info.Name = fmt.Sprintf("farm relay %d", i)
	// Broadcast under khatru's lock (pkg/khatrulock), as Relay does.
	rl.StoreEvent = append(rl.StoreEvent, khatrulock.SaveThenBroadcast(rl, st.SaveEvent))
	rl.ReplaceEvent = append(rl.ReplaceEvent, khatrulock.SaveThenBroadcast(rl, st.ReplaceEvent))
	rl.DeleteEvent = append(rl.DeleteEvent, st.DeleteEvent)
	rl.QueryEvents = append(rl.QueryEvents, func(ctx context.Context, f nostr.Filter) (chan *nostr.Event, error) {
		switch {
		case khatru.GetConnection(ctx) == nil:
			// khatru's own look-ups (AddEvent's duplicate check)
		case eventstore.IsNegentropySession(ctx):
			r.c.negSessions.Add(1)
		default:
			r.c.reqFilters.Add(1)
		}
		return st.QueryEvents(ctx, f)
	})
	rl.CountEvents = append(rl.CountEvents, st.CountEvents)
	maxLimit := o.MaxLimit
	rl.OverwriteFilter = append(rl.OverwriteFilter, func(ctx context.Context, f *nostr.Filter) {
		if eventstore.IsNegentropySession(ctx) || f.LimitZero {
			return
		}
		if f.Limit <= 0 || f.Limit > maxLimit {
			f.Limit = maxLimit
		}
	})
	// khatru runs OnDisconnect from both of a connection's goroutines:
	// count each connection's end once.
	var live sync.Map // *khatru.WebSocket -> struct{}
	rl.OnConnect = append(rl.OnConnect, func(ctx context.Context) {
		live.Store(khatru.GetConnection(ctx), struct{}{})
		r.c.wsOpened.Add(1)
		n := r.c.wsOpen.Add(1)
		for {
			m := r.c.maxWSOpen.Load()
			if n <= m || r.c.maxWSOpen.CompareAndSwap(m, n) {
				break
			}
		}
	})
	rl.OnDisconnect = append(rl.OnDisconnect, func(ctx context.Context) {
		if _, ok := live.LoadAndDelete(khatru.GetConnection(ctx)); ok {
			r.c.wsOpen.Add(-1)
		}
	})

	ln, err := net.Listen("tcp", net.JoinHostPort(o.Host, "0"))
	if err != nil {
		return nil, fmt.Errorf("farm: listen for relay %d: %w", i, err)
	}
	r.URL = "ws://" + ln.Addr().String()
	rl.ServiceURL = "http://" + ln.Addr().String()
	r.srv = &http.Server{Handler: limitsNIP11(rl, lim, maxLimit), ReadHeaderTimeout: 5 * time.Second}
	// The sniffer sees the socket's bytes as the client sent them; the
	// limiter, above it, decides what khatru gets.
	go func() { _ = r.srv.Serve(limitListener{Listener: sniffListener{Listener: ln, c: &r.c}, l: r.lim}) }()
	return r, nil
}

// Close stops every relay (listeners and open websockets).
func (f *Farm) Close() {
	for _, r := range f.Relays {
		_ = r.srv.Close()
		// khatru's websockets are hijacked: http.Server.Close leaves them.
		r.c.conns.Range(func(k, _ any) bool {
			_ = k.(*sniffConn).Close()
			return true
		})
	}
}

// URLs are the relays' websocket URLs, by index.
func (f *Farm) URLs() []string {
	out := make([]string, len(f.Relays))
	for i, r := range f.Relays {
		out[i] = r.URL
	}
	return out
}

// Add stores evt on the relays with the given indexes through khatru (so
// live subscribers get it), without signature checks: the farm's events
// are the benchmark's own, signed by its generator.
func (f *Farm) Add(ctx context.Context, evt *nostr.Event, relays []int) error {
	for _, i := range relays {
		if i < 0 || i >= len(f.Relays) {
			return fmt.Errorf("farm: no relay %d (farm of %d)", i, len(f.Relays))
		}
		r := f.Relays[i]
		if _, err := r.Khatru.AddEvent(ctx, evt); err != nil {
			return fmt.Errorf("farm: add %s to relay %d: %w", evt.ID, i, err)
		}
	}
	return nil
}

// Stats is every relay's counts now.
func (f *Farm) Stats() []RelayStats {
	out := make([]RelayStats, len(f.Relays))
	for i, r := range f.Relays {
		c := &r.c
		out[i] = RelayStats{
			Index: i, URL: r.URL, Negentropy: r.Negentropy, IgnoreTagLetter: r.IgnoreTagLetter, Stored: r.Store.Len(),
			TCPAccepted: c.tcpAccepted.Load(), WSOpened: c.wsOpened.Load(), WSOpen: c.wsOpen.Load(), MaxWSOpen: c.maxWSOpen.Load(),
			REQs: c.reqs.Load(), REQFilters: c.reqFilters.Load(), NegOpens: c.negOpens.Load(), NegSessions: c.negSessions.Load(),
			NegMsgs: c.negMsgs.Load(), Closes: c.closes.Load(), EventsIn: c.eventsIn.Load(), Other: c.other.Load(),
			EventsSent: c.eventsOut.Load(), EOSEs: c.eoses.Load(), Notices: c.notices.Load(), ClosedSent: c.closed.Load(),
			NegSent: c.negOut.Load(), BytesIn: c.bytesIn.Load(), BytesOut: c.bytesOut.Load(),
			Limits: r.Limits, Advertised: r.Limits.Advertise, AuthReads: r.AuthReads, LimitCounts: r.lim.counts(),
		}
	}
	return out
}

// FarmSeed is one line of a farm's /seed body: an event and the relays
// (indexes) that hold it.
type FarmSeed struct {
	Relays []int        `json:"relays"`
	Event  *nostr.Event `json:"event"`
}

// Handler serves the farm's control endpoints:
//
//	GET  /relays  the relays' URLs (JSON array, by index)
//	GET  /stats   every relay's RelayStats (JSON array)
//	POST /seed    a body of FarmSeed JSON lines, stored through khatru;
//	              answers {"seeded": n} once all are stored
func (f *Farm) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /relays", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, f.URLs())
	})
	mux.HandleFunc("GET /stats", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, f.Stats())
	})
	var seedMu sync.Mutex // one seeding at a time keeps the counts exact
	mux.HandleFunc("POST /seed", func(w http.ResponseWriter, r *http.Request) {
		seedMu.Lock()
		defer seedMu.Unlock()
		sc := bufio.NewScanner(r.Body)
		sc.Buffer(make([]byte, 1<<20), 8<<20)
		n := 0
		for sc.Scan() {
			var s FarmSeed
			if err := json.Unmarshal(sc.Bytes(), &s); err != nil || s.Event == nil {
				http.Error(w, fmt.Sprintf("line %d: not a seed (%v)", n+1, err), http.StatusBadRequest)
				return
			}
			if err := f.Add(r.Context(), s.Event, s.Relays); err != nil {
				http.Error(w, err.Error(), http.StatusBadRequest)
				return
			}
			n++
		}
		if err := sc.Err(); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		writeJSON(w, map[string]int{"seeded": n})
	})
	return mux
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(v)
}
