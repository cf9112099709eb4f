package testrelay

import (
	"context"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fiatjaf/khatru"
	"github.com/nbd-wtf/go-nostr"

	"github.com/grasp-sync/grasp-sync/pkg/clock"
	"github.com/grasp-sync/grasp-sync/pkg/nip34"
	"github.com/grasp-sync/grasp-sync/pkg/relayurl"
)

// Defaults of a GraspRelay's per-address event rate limit: those of stock
// ngit-relay (docs/dependencies.md), a burst of 15 events per client address,
// then 3 more every 3 minutes.
const (
	DefaultGraspBurst       = 15
	DefaultGraspRefill      = 3
	DefaultGraspRefillEvery = 3 * time.Minute
)

// RateLimitedReason is the OK message a GraspRelay answers an event over its
// address's budget with: khatru's own (policies.EventIPRateLimiter), which
// ngit-relay uses.
const RateLimitedReason = "rate-limited: slow down, please"

// Refusal reasons a GraspRelay counts in GraspStats.Refused (besides rate
// limiting, counted apart). They are this stand-in's own names, not
// pkg/policy's: the relay stands for software we did not write.
const (
	GraspRefusedAuth          = "auth-required"  // EVENT on an unauthenticated connection with RequireAuth
	GraspRefusedNotListed     = "not-listed"     // announcement whose relays tag does not name the relay
	GraspRefusedNotMaintainer = "not-maintainer" // state without an announcement by its author or naming it maintainer
	GraspRefusedNoReference   = "no-reference"   // event tags no repository or event the relay holds
	GraspRefusedOther         = "other"          // refused by a GraspOptions.RejectEvent hook
)

// GraspOptions configures a GraspRelay started by StartGraspRelay. The zero
// value is stock ngit-relay as far as sync cares: GRASP policy, 15 events per
// client address then 3 every 3 minutes, no NIP-77, no authentication.
type GraspOptions struct {
	// Relay is the underlying relay's configuration (NIP-77 on or off,
	// per-filter result cap).
	Relay Options
	// PublicURL is the address announcements must list in their relays tag
	// to be accepted (empty means the relay's own URL). Setting it emulates
	// a relay that clients reach under another name (GRASP_PUBLIC_URL
	// differing from GRASP_TARGET_RELAY). Hosts and effective ports are
	// compared (relayurl.SameService), not strings.
	PublicURL string

	// NoRateLimit switches the per-address event rate limit off.
	NoRateLimit bool
	// Burst is how many events one client address may send before the
	// limit applies (0 means DefaultGraspBurst).
	Burst int
	// Refill is how many events an address regains every RefillEvery (0
	// means DefaultGraspRefill), up to Burst.
	Refill int
	// RefillEvery is the refill period (0 means DefaultGraspRefillEvery).
	RefillEvery time.Duration
	// Clock drives the rate limit's refills (nil means the real clock); tests
	// pass a clock.Fake and advance it instead of waiting minutes.
	Clock clock.Clock

	// RequireAuth refuses EVENTs on connections that have not authenticated
	// (NIP-42) with "auth-required:", which also makes khatru send a
	// challenge.
	RequireAuth bool
	// AuthReads refuses REQ, COUNT and NEG-OPEN on connections that have
	// not authenticated, with "auth-required:".
	AuthReads bool
	// TrustedPubKeys are hex pubkeys exempt from the rate limit when the
	// connection has authenticated as one of them: the "authenticated
	// trusted writer" exemption an operator can grant a sync sidecar.
	TrustedPubKeys []string
	// TrustedAddrs are client addresses (as khatru.GetIP reports them)
	// exempt from the rate limit, the address form of the same exemption.
	TrustedAddrs []string

	// RejectEvent are extra khatru RejectEvent hooks, run after the
	// authentication and rate-limit checks and before the GRASP policy, to
	// inject answers such as "error: ..." for one test. Their refusals are
	// counted as GraspRefusedOther.
	RejectEvent []func(ctx context.Context, evt *nostr.Event) (reject bool, msg string)
}

// GraspStats are a GraspRelay's counters of what its clients sent over
// websocket (events stored with Relay.Add are not counted).
type GraspStats struct {
	// Accepted counts events stored for the first time.
	Accepted int
	// Duplicates counts events received again while already stored; khatru
	// answers them OK true with an empty message.
	Duplicates int
	// RateLimited counts EVENTs answered RateLimitedReason.
	RateLimited int
	// Refused counts policy and authentication refusals by reason
	// (GraspRefused*).
	Refused map[string]int
}

// GraspRelay is a stand-in for a third-party GRASP relay such as ngit-relay:
// a real khatru relay (a Relay) with its own GRASP write policy, a per-client
// address event rate limit, optional NIP-42 authentication and NIP-77, and
// counters tests can read. It is what bolt-on mode (GRASP_TARGET_RELAY)
// syncs into in tests.
//
// Its policy is deliberately simpler and stricter than pkg/policy, as a
// relay we did not write may be: an announcement (30617) is accepted when a
// relays tag names PublicURL; a state (30618) when a stored announcement
// with its d is by its author or names the author in maintainers; kinds 5
// and 10317 always; any other event only when an a/A/q tag names the
// coordinate of a stored event or an e/E/q tag the id of a stored event.
// There are no forward references: a comment sent before its root, or an
// issue before its repository's announcement, is refused "blocked:", so the
// order a client publishes in matters. khatru handles each EVENT of a
// connection in its own goroutine, so a client must wait for the OK of an
// event before sending events that depend on it.
//
// Checks run in this order for every EVENT received over websocket, after
// khatru's id and signature checks: authentication (RequireAuth), the rate
// limit (every EVENT costs a token, duplicates and refused events included,
// as with khatru's limiter in front of a policy), RejectEvent hooks, then
// the policy. Events stored with Relay.Add skip all of them.
type GraspRelay struct {
	*Relay
	// PublicURL is the address announcements must list.
	PublicURL string

	opts    GraspOptions
	limiter *rateLimiter

	mu       sync.Mutex
	stats    GraspStats
	accepted map[string]struct{} // ids counted in stats.Accepted
	answers  map[string]string   // id → the last refusal's OK message
}

// StartGraspRelay starts a GraspRelay as configured by opts. It stops when
// the test ends.
func StartGraspRelay(t testing.TB, opts GraspOptions) *GraspRelay {
	t.Helper()
	g := &GraspRelay{opts: opts, stats: GraspStats{Refused: map[string]int{}}, accepted: map[string]struct{}{}, answers: map[string]string{}}
	if !opts.NoRateLimit {
		g.limiter = newRateLimiter(opts.Burst, opts.Refill, opts.RefillEvery, opts.Clock)
	}
	g.Relay = startRelay(t, opts.Relay, func(r *Relay) {
		g.PublicURL = opts.PublicURL
		if g.PublicURL == "" {
			g.PublicURL = r.URL
		}
		rl := r.Khatru
		rl.Info.Name = "testkit grasp relay"
		if opts.RequireAuth || opts.AuthReads || len(opts.TrustedPubKeys) > 0 {
			// (khatru lists NIP-42 in NIP-11 whatever we do.) Challenge at once, so a client can authenticate before its
			// first EVENT instead of paying a refusal for it.
			rl.OnConnect = append(rl.OnConnect, khatru.RequestAuth)
		}
		rl.RejectEvent = append(rl.RejectEvent, g.checkAuth, g.checkRate)
		for _, hook := range opts.RejectEvent {
			rl.RejectEvent = append(rl.RejectEvent, g.counted(hook))
		}
		rl.RejectEvent = append(rl.RejectEvent, g.checkPolicy)
		if opts.AuthReads {
			rl.RejectFilter = append(rl.RejectFilter, func(ctx context.Context, _ nostr.Filter) (bool, string) {
				if khatru.GetConnection(ctx) != nil && khatru.GetAuthed(ctx) == "" {
					return true, "auth-required: reading here requires NIP-42 authentication"
				}
				return false, ""
			})
		}
		r.saved = append(r.saved, func(ctx context.Context, evt *nostr.Event) {
			if !fromClient(ctx) {
				return
			}
			// badger's ReplaceEvent also "succeeds" when it keeps a newer
			// or the same version: count each id once, and only if stored.
			if stored, err := g.Has(ctx, evt.ID); err != nil || !stored {
				return
			}
			g.mu.Lock()
			defer g.mu.Unlock()
			if _, seen := g.accepted[evt.ID]; !seen {
				g.accepted[evt.ID] = struct{}{}
				g.stats.Accepted++
			}
		})
	})
	return g
}

// Stats returns a copy of the relay's counters.
func (g *GraspRelay) Stats() GraspStats {
	g.mu.Lock()
	defer g.mu.Unlock()
	s := g.stats
	s.Refused = make(map[string]int, len(g.stats.Refused))
	for k, v := range g.stats.Refused {
		s.Refused[k] = v
	}
	return s
}

// Refusal returns the OK message of the last refusal of the event with
// that id (rate limit included) and whether it was ever refused, so a test
// can compare what the target answered with what the sidecar reports.
func (g *GraspRelay) Refusal(id string) (msg string, refused bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	msg, refused = g.answers[id]
	return msg, refused
}

// refused counts a refusal of evt by reason and remembers its message.
func (g *GraspRelay) refused(evt *nostr.Event, reason, msg string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.stats.Refused[reason]++
	g.answers[evt.ID] = msg
}

// fromClient reports whether ctx is that of an EVENT received over
// websocket, as opposed to Relay.Add.
func fromClient(ctx context.Context) bool { return khatru.GetConnection(ctx) != nil }

func (g *GraspRelay) checkAuth(ctx context.Context, evt *nostr.Event) (bool, string) {
	if !g.opts.RequireAuth || !fromClient(ctx) || khatru.GetAuthed(ctx) != "" {
		return false, ""
	}
	const msg = "auth-required: publishing here requires NIP-42 authentication"
	g.refused(evt, GraspRefusedAuth, msg)
	return true, msg
}

func (g *GraspRelay) checkRate(ctx context.Context, evt *nostr.Event) (bool, string) {
	if g.limiter == nil || !fromClient(ctx) {
		return false, ""
	}
	if slices.Contains(g.opts.TrustedPubKeys, khatru.GetAuthed(ctx)) {
		return false, ""
	}
	addr := khatru.GetIP(ctx)
	if slices.Contains(g.opts.TrustedAddrs, addr) {
		return false, ""
	}
	if g.limiter.allow(addr) {
		return false, ""
	}
	g.mu.Lock()
	g.stats.RateLimited++
	g.answers[evt.ID] = RateLimitedReason
	g.mu.Unlock()
	return true, RateLimitedReason
}

// counted wraps an extra RejectEvent hook so its refusals are counted.
func (g *GraspRelay) counted(hook func(context.Context, *nostr.Event) (bool, string)) func(context.Context, *nostr.Event) (bool, string) {
	return func(ctx context.Context, evt *nostr.Event) (bool, string) {
		reject, msg := hook(ctx, evt)
		if reject && fromClient(ctx) {
			g.refused(evt, GraspRefusedOther, nostr.NormalizeOKMessage(msg, "blocked"))
		}
		return reject, msg
	}
}

// maxRefs bounds how many tag references one event makes the policy look up.
const maxRefs = 100

func (g *GraspRelay) checkPolicy(ctx context.Context, evt *nostr.Event) (bool, string) {
	if !fromClient(ctx) {
		return false, ""
	}
	if has, err := g.Has(ctx, evt.ID); err != nil {
		return true, "error: could not read the store"
	} else if has {
		g.mu.Lock()
		g.stats.Duplicates++
		g.mu.Unlock()
		return false, "" // khatru's store hook answers OK true
	}
	reason, msg := g.judge(ctx, evt)
	if reason == "" {
		return false, ""
	}
	g.refused(evt, reason, msg)
	return true, msg
}

// judge applies the policy described on GraspRelay: it returns the refusal
// reason and OK message, or "" to accept.
func (g *GraspRelay) judge(ctx context.Context, evt *nostr.Event) (reason, msg string) {
	switch evt.Kind {
	case nip34.KindDeletion, nip34.KindUserGraspList:
		return "", ""
	case nip34.KindRepoAnnouncement:
		if evt.Tags.GetD() == "" {
			return GraspRefusedNotListed, "blocked: repository announcement without a d tag"
		}
		for _, tag := range evt.Tags {
			if len(tag) < 2 || tag[0] != "relays" {
				continue
			}
			for _, v := range tag[1:] {
				if relayurl.SameService(v, g.PublicURL) {
					return "", ""
				}
			}
		}
		return GraspRefusedNotListed, "blocked: repository announcement must list " + g.PublicURL + " in its relays tag"
	case nip34.KindRepoState:
		if g.maintains(ctx, evt.PubKey, evt.Tags.GetD()) {
			return "", ""
		}
		return GraspRefusedNotMaintainer, "blocked: no repository here with that identifier lists the author as a maintainer"
	}
	var ids, coords []string
	for _, tag := range evt.Tags {
		if len(tag) < 2 || len(ids)+len(coords) >= maxRefs {
			continue
		}
		switch tag[0] {
		case "e", "E":
			ids = append(ids, tag[1])
		case "a", "A":
			coords = append(coords, tag[1])
		case "q":
			if strings.Contains(tag[1], ":") {
				coords = append(coords, tag[1])
			} else {
				ids = append(ids, tag[1])
			}
		}
	}
	if g.holdsAny(ctx, ids, coords) {
		return "", ""
	}
	return GraspRefusedNoReference, "blocked: event must tag a repository or an event this relay holds"
}

// maintains reports whether a stored announcement with identifier d is by
// pubkey or names it in its maintainers tag.
func (g *GraspRelay) maintains(ctx context.Context, pubkey, d string) bool {
	if d == "" {
		return false
	}
	anns := g.read(ctx, nostr.Filter{Kinds: []int{nip34.KindRepoAnnouncement}, Tags: nostr.TagMap{"d": {d}}, Limit: 500})
	for _, a := range anns {
		if a.PubKey == pubkey {
			return true
		}
		for _, tag := range a.Tags {
			if len(tag) > 1 && tag[0] == "maintainers" && slices.Contains(tag[1:], pubkey) {
				return true
			}
		}
	}
	return false
}

// holdsAny reports whether the store holds an event with one of the ids or
// coordinates ("kind:pubkey:d").
func (g *GraspRelay) holdsAny(ctx context.Context, ids, coords []string) bool {
	if len(ids) > 0 && len(g.read(ctx, nostr.Filter{IDs: ids, Limit: 1})) > 0 {
		return true
	}
	for _, c := range coords {
		parts := strings.SplitN(c, ":", 3)
		if len(parts) != 3 {
			continue
		}
		kind, err := strconv.Atoi(parts[0])
		if err != nil || !nostr.IsAddressableKind(kind) && !nostr.IsReplaceableKind(kind) {
			continue
		}
		f := nostr.Filter{Kinds: []int{kind}, Authors: []string{parts[1]}, Limit: 10}
		if parts[2] != "" {
			// stores do not index empty tag values: "d":"" is matched below
			f.Tags = nostr.TagMap{"d": {parts[2]}}
		}
		for _, evt := range g.read(ctx, f) {
			if !nostr.IsAddressableKind(kind) || evt.Tags.GetD() == parts[2] {
				return true
			}
		}
	}
	return false
}

// read returns the stored events matching f; a store error reads as none,
// which refuses (fails closed).
func (g *GraspRelay) read(ctx context.Context, f nostr.Filter) []*nostr.Event {
	ch, err := g.query(ctx, f)
	if err != nil {
		return nil
	}
	var out []*nostr.Event
	for evt := range ch {
		out = append(out, evt)
	}
	return out
}

// rateLimiter gives each key (a client address) a budget of burst events
// that refills by refill every period, like khatru's
// policies.EventIPRateLimiter, but refilled lazily from an injected clock
// instead of by a sleeping goroutine, so tests can move time.
type rateLimiter struct {
	burst, refill int
	every         time.Duration
	clock         clock.Clock

	mu   sync.Mutex
	used map[string]*spent
}

// spent is what one key has used since its period began.
type spent struct {
	n     int
	since time.Time
}

func newRateLimiter(burst, refill int, every time.Duration, c clock.Clock) *rateLimiter {
	if burst <= 0 {
		burst = DefaultGraspBurst
	}
	if refill <= 0 {
		refill = DefaultGraspRefill
	}
	if every <= 0 {
		every = DefaultGraspRefillEvery
	}
	if c == nil {
		c = clock.Real{}
	}
	return &rateLimiter{burst: burst, refill: refill, every: every, clock: c, used: map[string]*spent{}}
}

// allow takes one event from key's budget, reporting false when it is spent.
func (l *rateLimiter) allow(key string) bool {
	now := l.clock.Now()
	l.mu.Lock()
	defer l.mu.Unlock()
	s := l.used[key]
	if s == nil {
		s = &spent{since: now}
		l.used[key] = s
	}
	if periods := int(now.Sub(s.since) / l.every); periods > 0 {
		s.n = max(0, s.n-periods*l.refill)
		s.since = s.since.Add(time.Duration(periods) * l.every)
	}
	if s.n >= l.burst {
		return false
	}
	if s.n == 0 {
		s.since = now // a fresh budget starts its first period now
	}
	s.n++
	return true
}

// forwardedFor returns a header that makes khatru see the client at addr (a
// public address: khatru ignores private and loopback ones in
// X-Forwarded-For), for DialHeader.
func forwardedFor(addr string) http.Header {
	return http.Header{"X-Forwarded-For": {addr}}
}

// DialAs dials the relay as a client at address addr (a public IP such as
// 203.0.113.7, carried in X-Forwarded-For, which khatru honours), so tests
// can exercise the per-address rate limit from one machine.
func (g *GraspRelay) DialAs(ctx context.Context, addr string) (*Conn, error) {
	return DialHeader(ctx, g.URL, forwardedFor(addr))
}
