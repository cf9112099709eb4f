// Package policy decides which events this GRASP service accepts.
//
// It implements the write policy of spec/policy.md (GRASP-01 acceptance plus
// integrity and limits) as pure logic over a read-only view of the event
// store, so that the relay (events from clients) and the ingester (events from
// sync) make the same decision for the same event. It never stores anything:
// callers save accepted events and apply accepted deletions themselves.
package policy

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nbd-wtf/go-nostr"

	"github.com/grasp-sync/grasp-sync/pkg/nip34"
	"github.com/grasp-sync/grasp-sync/pkg/relayurl"
)

// Bounds on the work one hostile event can cause.
const (
	// maxReferences caps how many distinct ids and coordinates of one event
	// are looked up (rule 5) and reported in Decision.Missing.
	maxReferences = 100
	// maxAnnouncements caps how many stored announcements sharing one
	// identifier are read to build a maintainer set.
	maxAnnouncements = 500
	// maxListedURLs caps how many clone and relays values are parsed when
	// deciding whether an announcement lists this service.
	maxListedURLs = 256
	// maxMaintainers caps the maintainers read from one announcement.
	maxMaintainers = 256
	// maxVersions caps the stored versions read for one replaceable key
	// (normally one; more only when a multi-writer store raced).
	maxVersions = 10
	// maxForwardScan caps the events read per forward-reference query; the
	// first one that may anchor the event suffices.
	maxForwardScan = 20
	// deletionBatch is how many ids one deletion-target query asks for.
	deletionBatch = 100
)

// Lookup is the policy's read-only view of the event store (implemented by
// pkg/store). Query returns the stored events matching the filter. The policy
// always sets Limit and keeps its filters small, so a store must return the
// complete result for them.
type Lookup interface {
	Query(ctx context.Context, f nostr.Filter) ([]*nostr.Event, error)
}

// Limits bounds the size of accepted events. A zero field means "use the
// default" (see DefaultLimits). They are the one configuration of the policy
// (GRASP_POLICY_*): the relay judges client events and the ingester synced
// events with the same values, so an event is accepted or refused the same
// way whichever path it arrives by (docs/decisions.md, "One policy,
// configured once"). The former GRASP_RELAY_* names are still read.
type Limits struct {
	// MaxEventBytes bounds an accepted event's serialised size, for client
	// and synced events alike (formerly GRASP_RELAY_MAX_EVENT_BYTES, still
	// read).
	MaxEventBytes int `envconfig:"POLICY_MAX_EVENT_BYTES" default:"262144" formerly:"RELAY_MAX_EVENT_BYTES"`
	// MaxTags bounds an accepted event's number of tags, for client and
	// synced events alike (formerly GRASP_RELAY_MAX_TAGS, still read).
	MaxTags int `envconfig:"POLICY_MAX_TAGS" default:"2000" formerly:"RELAY_MAX_TAGS"`
	// MaxTagValueBytes bounds each element of each tag of an accepted
	// event, for client and synced events alike (formerly
	// GRASP_RELAY_MAX_TAG_VALUE_BYTES, still read). Patches carry big
	// content; tags stay small.
	MaxTagValueBytes int `envconfig:"POLICY_MAX_TAG_VALUE_BYTES" default:"65536" formerly:"RELAY_MAX_TAG_VALUE_BYTES"`
	// MaxFutureSkew is how far an accepted event's created_at may lie ahead
	// of the clock, for client and synced events alike.
	MaxFutureSkew time.Duration `envconfig:"POLICY_MAX_FUTURE_SKEW" default:"15m"`
}

// DefaultLimits returns the limits used for unset fields: 256 KiB events,
// 2000 tags, 64 KiB tag values, 15 minutes of clock skew.
func DefaultLimits() Limits {
	return Limits{
		MaxEventBytes:    256 << 10,
		MaxTags:          2000,
		MaxTagValueBytes: 64 << 10,
		MaxFutureSkew:    15 * time.Minute,
	}
}

// Policy evaluates events against the write policy. Its fields are read-only
// once in use; one Policy may serve concurrent Evaluate calls.
type Policy struct {
	// ServiceURL is this service's public relay URL, e.g.
	// wss://git.example.com or ws://127.0.0.1:7777. Announcements must list
	// its host and port.
	ServiceURL string
	// Store is read to find what is already accepted.
	Store Lookup
	// Limits bounds event sizes; zero fields take DefaultLimits values.
	Limits Limits
	// Now is the clock (injected for tests); nil means time.Now.
	Now func() time.Time
}

// Reason is the machine-readable outcome of Evaluate, stable enough for
// metric labels and parking decisions.
//
// Refusals other than ReasonBadID, ReasonBadSignature and ReasonStoreError
// hold for every copy of the event with that id (the id is verified first and
// commits to everything else), so a caller may remember them by id until the
// store changes. A bad-id or bad-signature refusal says nothing about the
// genuine event with that id, and a store error is transient.
type Reason string

// Reasons returned by Evaluate.
const (
	ReasonAccepted      Reason = "accepted"
	ReasonBadID         Reason = "bad-id"         // id is not the hash of the event
	ReasonBadSignature  Reason = "bad-signature"  // signature does not verify
	ReasonMalformed     Reason = "malformed"      // pubkey, kind or created_at out of range
	ReasonTooLarge      Reason = "too-large"      // event or a tag value over the limit
	ReasonTooManyTags   Reason = "too-many-tags"  // more tags than the limit
	ReasonFuture        Reason = "future"         // created_at too far ahead
	ReasonExpired       Reason = "expired"        // NIP-40 expiration in the past
	ReasonDuplicate     Reason = "duplicate"      // already stored
	ReasonDeleted       Reason = "deleted"        // a stored deletion by its author covers it
	ReasonBadIdentifier Reason = "bad-identifier" // 30617/30618 d tag missing or unsafe
	ReasonNotListed     Reason = "not-listed"     // announcement does not list us and its author is not a maintainer of the served repo
	ReasonOlderVersion  Reason = "older-version"  // a newer version of the same replaceable key is stored
	ReasonNotMaintainer Reason = "not-maintainer" // state author outside the maintainer set, or no served repo with that d (state or unlisted announcement)
	ReasonNoReference   Reason = "no-reference"   // rule 5: references nothing accepted
	ReasonDeleteOthers  Reason = "delete-others"  // deletion targets another author's event
	ReasonStoreError    Reason = "store-error"    // the store could not be read: fail closed
)

// Decision is the outcome of evaluating one event.
type Decision struct {
	// Accept reports whether the event may be stored (or, for a deletion,
	// applied).
	Accept bool
	// Reason is the machine-readable outcome.
	Reason Reason
	// Message is the NIP-01 OK message: empty on acceptance, otherwise
	// prefixed "invalid: ", "blocked: ", "duplicate: " or "error: ", naming
	// what was wrong or missing.
	Message string
	// Missing lists, for refusals that only lack something, the event ids
	// and "kind:pubkey:d" coordinates whose arrival could change the
	// decision; a parking layer re-evaluates the event when one is stored.
	// For ReasonNoReference an event tagging this one could also arrive (a
	// forward reference), which is found by this event's own id and
	// coordinate rather than listed here.
	Missing []string
	// Err is the underlying error of a ReasonStoreError decision, for logs;
	// it is not part of Message because clients should not see internals.
	Err error
}

// Parkable reports whether the refusal may be reversed by events that have
// not arrived yet, so a synced event should be parked and re-evaluated rather
// than dropped: always for ReasonNoReference (a forward reference can always
// arrive), and for ReasonNotMaintainer and ReasonNotListed when Missing names
// announcements that could still make the author a maintainer.
func (d Decision) Parkable() bool {
	switch d.Reason {
	case ReasonNoReference:
		return true
	case ReasonNotMaintainer, ReasonNotListed:
		return len(d.Missing) > 0
	}
	return false
}

func accept() Decision { return Decision{Accept: true, Reason: ReasonAccepted} }

func refuse(r Reason, format string, args ...any) Decision {
	return Decision{Reason: r, Message: fmt.Sprintf(format, args...)}
}

// storeError fails closed: an event we cannot check is not accepted.
func storeError(what string, err error) Decision {
	return Decision{
		Reason:  ReasonStoreError,
		Message: "error: could not read the event store",
		Err:     fmt.Errorf("policy: %s: %w", what, err),
	}
}

// Evaluate applies the rules of spec/policy.md, in order, to one event:
// integrity and limits, duplicates and deletions (rule 0), then by kind
// announcements (1), states (2), deletions (3), grasp lists (4) and
// everything else (5). It stores nothing and never panics on hostile input;
// a store error refuses the event.
func (p *Policy) Evaluate(ctx context.Context, evt *nostr.Event) Decision {
	return p.evaluate(ctx, evt, true)
}

// EvaluateVerified is Evaluate for an event whose id and signature the
// caller has already verified (evt.CheckID and evt.CheckSignature returned
// true): every rule runs except those two checks. It lets a caller verify
// many events in parallel (the dominant cost) and then make the
// store-dependent decisions in order, without hashing or verifying twice.
// Passing an event that was not verified accepts forgeries.
func (p *Policy) EvaluateVerified(ctx context.Context, evt *nostr.Event) Decision {
	return p.evaluate(ctx, evt, false)
}

func (p *Policy) evaluate(ctx context.Context, evt *nostr.Event, verify bool) Decision {
	if evt == nil {
		return refuse(ReasonMalformed, "invalid: no event")
	}
	if d, ok := p.checkIntegrity(evt, verify); !ok {
		return d
	}
	if d, ok := p.checkStored(ctx, evt); !ok {
		return d
	}
	switch evt.Kind {
	case nip34.KindRepoAnnouncement:
		return p.evaluateAnnouncement(ctx, evt)
	case nip34.KindRepoState:
		return p.evaluateState(ctx, evt)
	case nip34.KindDeletion:
		return p.evaluateDeletion(ctx, evt)
	case nip34.KindUserGraspList:
		return accept()
	default:
		return p.evaluateReferences(ctx, evt)
	}
}

// limits returns the configured limits with defaults filled in.
func (p *Policy) limits() Limits { return p.Limits.WithDefaults() }

// WithDefaults returns l with its zero (or negative) fields set to
// DefaultLimits values.
func (l Limits) WithDefaults() Limits {
	def := DefaultLimits()
	if l.MaxEventBytes <= 0 {
		l.MaxEventBytes = def.MaxEventBytes
	}
	if l.MaxTags <= 0 {
		l.MaxTags = def.MaxTags
	}
	if l.MaxTagValueBytes <= 0 {
		l.MaxTagValueBytes = def.MaxTagValueBytes
	}
	if l.MaxFutureSkew <= 0 {
		l.MaxFutureSkew = def.MaxFutureSkew
	}
	return l
}

func (p *Policy) now() time.Time {
	if p.Now != nil {
		return p.Now()
	}
	return time.Now()
}

// checkIntegrity is rule 0's stateless part.
//
// The id is checked first: from then on every field is committed to by the
// id, so each later refusal holds for any copy of the event with that id and
// callers may remember it by id (see Reason). Hashing is linear in the event
// size, which the transport already bounds (websocket message limits). The
// cheap content checks come before the signature, the expensive one.
func (p *Policy) checkIntegrity(evt *nostr.Event, verify bool) (Decision, bool) {
	if verify && !evt.CheckID() {
		return refuse(ReasonBadID, "invalid: event id does not match its content"), false
	}
	if !nip34.IsPubKey(evt.PubKey) {
		return refuse(ReasonMalformed, "invalid: pubkey must be 64 lower-case hex characters"), false
	}
	if evt.Kind < 0 || evt.Kind > 65535 {
		return refuse(ReasonMalformed, "invalid: kind %d out of range", evt.Kind), false
	}
	if evt.CreatedAt < 0 {
		return refuse(ReasonMalformed, "invalid: negative created_at"), false
	}
	lim := p.limits()
	if len(evt.Tags) > lim.MaxTags {
		return refuse(ReasonTooManyTags, "invalid: too many tags (%d, limit %d)", len(evt.Tags), lim.MaxTags), false
	}
	// The sum of the field lengths is a lower bound of the serialised size
	// (escaping only adds), with room for the JSON framing, id and sig.
	size := len(`{"id":"","pubkey":"","created_at":,"kind":,"tags":[],"content":"","sig":""}`) + 20 + 64 + 128 +
		len(evt.PubKey) + len(evt.Content)
	for _, tag := range evt.Tags {
		size += 3
		for _, v := range tag {
			if len(v) > lim.MaxTagValueBytes {
				return refuse(ReasonTooLarge, "invalid: tag value too long (%d bytes, limit %d)", len(v), lim.MaxTagValueBytes), false
			}
			size += len(v) + 3
		}
	}
	if size > lim.MaxEventBytes {
		return refuse(ReasonTooLarge, "invalid: event too large (over %d bytes)", lim.MaxEventBytes), false
	}
	now := p.now()
	if evt.CreatedAt.Time().After(now.Add(lim.MaxFutureSkew)) {
		return refuse(ReasonFuture, "invalid: created_at is more than %s in the future", lim.MaxFutureSkew), false
	}
	if exp, ok := expiration(evt); ok && exp <= now.Unix() {
		return refuse(ReasonExpired, "invalid: event has expired"), false
	}
	if !nip34.IsSignature(evt.Sig) {
		return refuse(ReasonBadSignature, "invalid: signature must be 128 lower-case hex characters"), false
	}
	// CheckSignature recomputes the hash from the body and ignores evt.ID;
	// CheckID above is what ties the signature to the id.
	if !verify {
		return Decision{}, true
	}
	if ok, err := evt.CheckSignature(); !ok || err != nil {
		return refuse(ReasonBadSignature, "invalid: bad signature"), false
	}
	return Decision{}, true
}

// expiration returns the NIP-40 expiration time of evt, if its first
// "expiration" tag holds a valid Unix time.
func expiration(evt *nostr.Event) (int64, bool) {
	for _, tag := range evt.Tags {
		if len(tag) >= 2 && tag[0] == "expiration" {
			ts, err := strconv.ParseInt(tag[1], 10, 64)
			return ts, err == nil
		}
	}
	return 0, false
}

// checkStored is rule 0's stateful part: duplicates, deletions and, for
// replaceable and addressable kinds, newer stored versions.
func (p *Policy) checkStored(ctx context.Context, evt *nostr.Event) (Decision, bool) {
	found, err := p.query(ctx, nostr.Filter{IDs: []string{evt.ID}, Limit: 1})
	if err != nil {
		return storeError("look up event id", err), false
	}
	if len(found) > 0 {
		return refuse(ReasonDuplicate, "duplicate: already have this event"), false
	}
	coord, keyed := nip34.CoordinateOf(evt)
	// A deletion of a deletion has no effect (NIP-09), so kind 5 is never
	// refused as deleted.
	if evt.Kind != nip34.KindDeletion {
		dels, err := p.query(ctx, nostr.Filter{
			Kinds: []int{nip34.KindDeletion}, Authors: []string{evt.PubKey},
			Tags: nostr.TagMap{"e": {evt.ID}}, Limit: 1,
		})
		if err != nil {
			return storeError("look up deletions by id", err), false
		}
		if len(dels) > 0 {
			return refuse(ReasonDeleted, "blocked: deleted by its author"), false
		}
		if keyed {
			// A coordinate deletion removes versions up to its own
			// created_at: only deletions at or after this version count.
			since := evt.CreatedAt
			dels, err := p.query(ctx, nostr.Filter{
				Kinds: []int{nip34.KindDeletion}, Authors: []string{evt.PubKey},
				Tags: nostr.TagMap{"a": {coord.String()}}, Since: &since, Limit: 1,
			})
			if err != nil {
				return storeError("look up deletions by coordinate", err), false
			}
			if len(dels) > 0 {
				return refuse(ReasonDeleted, "blocked: %s deleted by its author", coord), false
			}
		}
	}
	if keyed {
		versions, err := p.versions(ctx, coord)
		if err != nil {
			return storeError("look up stored versions", err), false
		}
		for _, v := range versions {
			if v.CreatedAt > evt.CreatedAt || v.CreatedAt == evt.CreatedAt && v.ID < evt.ID {
				return refuse(ReasonOlderVersion, "duplicate: have a newer version of %s", coord), false
			}
		}
	}
	return Decision{}, true
}

// query reads the store, dropping nil results so callers need not check.
func (p *Policy) query(ctx context.Context, f nostr.Filter) ([]*nostr.Event, error) {
	if p.Store == nil {
		return nil, errors.New("no store configured")
	}
	evts, err := p.Store.Query(ctx, f)
	if err != nil {
		return nil, err
	}
	out := evts[:0:0]
	for _, e := range evts {
		if e != nil {
			out = append(out, e)
		}
	}
	return out, nil
}

// versions returns the stored events with coordinate c.
func (p *Policy) versions(ctx context.Context, c nip34.Coordinate) ([]*nostr.Event, error) {
	f := nostr.Filter{Kinds: []int{c.Kind}, Authors: []string{c.PubKey}, Limit: maxVersions}
	if nostr.IsAddressableKind(c.Kind) && c.D != "" {
		// Stores do not index empty tag values, so "d":"" cannot be
		// queried; those are matched below instead.
		f.Tags = nostr.TagMap{"d": {c.D}}
	}
	evts, err := p.query(ctx, f)
	if err != nil {
		return nil, err
	}
	out := evts[:0]
	for _, e := range evts {
		if c.Matches(e) {
			out = append(out, e)
		}
	}
	return out, nil
}

// evaluateAnnouncement is rule 1.
func (p *Policy) evaluateAnnouncement(ctx context.Context, evt *nostr.Event) Decision {
	d, ok := identifier(evt)
	if !ok {
		return refuse(ReasonBadIdentifier, `invalid: announcement needs a "d" identifier that is not empty, "." or ".." and has no '/', '\' or NUL`)
	}
	clone, relays := p.listing(evt)
	if clone && relays {
		return accept()
	}
	anns, err := p.announcements(ctx, d)
	if err != nil {
		return storeError("look up announcements", err)
	}
	set := p.maintainerSet(anns, d)
	if set[evt.PubKey] {
		// Maintainer exception: a maintainer of a repository we serve may
		// announce it elsewhere.
		return accept()
	}
	var lacking []string
	if !clone {
		lacking = append(lacking, "clone")
	}
	if !relays {
		lacking = append(lacking, "relays")
	}
	msg := fmt.Sprintf("blocked: announcement must list %s in both clone and relays tags (missing in %s)",
		p.ServiceURL, strings.Join(lacking, " and "))
	stored := authors(anns)
	if len(set) == 0 {
		// No repository with this identifier is served (yet), so the
		// maintainer exception cannot be decided: the owner's announcement
		// may still arrive. NIP-34 maintainers name each other, so the
		// maintainers this announcement names are the best guess at whose
		// announcement to wait for.
		dec := refuse(ReasonNotMaintainer, "%s, and no accepted announcement with identifier %q names its author as a maintainer", msg, d)
		for _, m := range maintainers(evt) {
			if m != evt.PubKey && !stored[m] && len(dec.Missing) < maxReferences {
				dec.Missing = append(dec.Missing, nip34.Coordinate{Kind: nip34.KindRepoAnnouncement, PubKey: m, D: d}.String())
			}
		}
		return dec
	}
	// A served repository exists but the author is outside its maintainer
	// set: only an announcement by a member we have none from yet could
	// still name the author.
	dec := refuse(ReasonNotListed, "%s, and its author is not a maintainer of repository %q", msg, d)
	dec.Missing = unannounced(set, stored, d)
	return dec
}

// unannounced returns the coordinates of the announcements that members of a
// maintainer set have not published (or we have not stored) yet, sorted and
// bounded: their arrival could extend the set.
func unannounced(set, stored map[string]bool, d string) []string {
	var out []string
	for m := range set {
		if !stored[m] {
			out = append(out, nip34.Coordinate{Kind: nip34.KindRepoAnnouncement, PubKey: m, D: d}.String())
		}
	}
	slices.Sort(out)
	if len(out) > maxReferences {
		out = out[:maxReferences]
	}
	return out
}

// evaluateState is rule 2.
func (p *Policy) evaluateState(ctx context.Context, evt *nostr.Event) Decision {
	d, ok := identifier(evt)
	if !ok {
		return refuse(ReasonBadIdentifier, `invalid: state needs a "d" identifier that is not empty, "." or ".." and has no '/', '\' or NUL`)
	}
	anns, err := p.announcements(ctx, d)
	if err != nil {
		return storeError("look up announcements", err)
	}
	set := p.maintainerSet(anns, d)
	if set[evt.PubKey] {
		return accept()
	}
	own := nip34.Coordinate{Kind: nip34.KindRepoAnnouncement, PubKey: evt.PubKey, D: d}.String()
	if len(set) == 0 {
		return Decision{
			Reason:  ReasonNotMaintainer,
			Message: fmt.Sprintf("blocked: no accepted repository announcement with identifier %q (e.g. %s)", d, own),
			Missing: []string{own},
		}
	}
	dec := refuse(ReasonNotMaintainer, "blocked: author is not a maintainer of repository %q", d)
	// What could still make the author a maintainer: their own announcement
	// listing us, or an announcement by a maintainer we have none from yet.
	stored := authors(anns)
	if !stored[evt.PubKey] {
		dec.Missing = append(dec.Missing, own)
	}
	dec.Missing = append(dec.Missing, unannounced(set, stored, d)...)
	if len(dec.Missing) > maxReferences {
		dec.Missing = dec.Missing[:maxReferences]
	}
	return dec
}

// evaluateDeletion is rule 3: a deletion is accepted only if every target it
// names that we can attribute belongs to its author.
func (p *Policy) evaluateDeletion(ctx context.Context, evt *nostr.Event) Decision {
	var ids []string
	seen := map[string]bool{}
	for _, tag := range evt.Tags {
		if len(tag) < 2 {
			continue
		}
		switch tag[0] {
		case "a":
			if c, ok := nip34.ParseCoordinate(tag[1]); ok && c.PubKey != evt.PubKey {
				return refuse(ReasonDeleteOthers, "blocked: cannot delete another author's event %s", c)
			}
		case "e":
			if nip34.IsEventID(tag[1]) && !seen[tag[1]] {
				seen[tag[1]] = true
				ids = append(ids, tag[1])
			}
		}
	}
	// Every id is checked (the tag count limit bounds them); targets not
	// stored cannot be attributed and are harmless: a deletion only ever
	// removes or blocks events by its own author.
	for start := 0; start < len(ids); start += deletionBatch {
		batch := ids[start:min(start+deletionBatch, len(ids))]
		found, err := p.query(ctx, nostr.Filter{IDs: batch, Limit: len(batch)})
		if err != nil {
			return storeError("look up deletion targets", err)
		}
		for _, t := range found {
			if t.PubKey != evt.PubKey {
				return refuse(ReasonDeleteOthers, "blocked: cannot delete another author's event %s", t.ID)
			}
		}
	}
	return accept()
}

// evaluateReferences is rule 5: accept what references, or is referenced by,
// an accepted repository or event.
func (p *Policy) evaluateReferences(ctx context.Context, evt *nostr.Event) Decision {
	ids, coords := references(evt)
	if ok, err := p.anyCoordinateStored(ctx, coords); err != nil {
		return storeError("look up referenced coordinates", err)
	} else if ok {
		return accept()
	}
	if ok, err := p.anyIDStored(ctx, ids); err != nil {
		return storeError("look up referenced events", err)
	} else if ok {
		return accept()
	}
	if ok, err := p.referencedByStored(ctx, evt); err != nil {
		return storeError("look up forward references", err)
	} else if ok {
		return accept()
	}
	dec := refuse(ReasonNoReference, "blocked: event must reference an accepted repository or accepted event")
	for _, c := range coords {
		dec.Missing = append(dec.Missing, c.String())
	}
	dec.Missing = append(dec.Missing, ids...)
	switch n := len(dec.Missing); {
	case n == 1:
		dec.Message += " (not found: " + dec.Missing[0] + ")"
	case n > 1:
		dec.Message += fmt.Sprintf(" (not found: %s and %d more)", dec.Missing[0], n-1)
	}
	return dec
}

// anchors reports whether a stored event can make others acceptable under
// rule 5. Deletions and grasp lists are accepted without any link to a
// repository, so letting them anchor other events would let anyone bring in
// anything by first publishing one of them.
func anchors(kind int) bool {
	return kind != nip34.KindDeletion && kind != nip34.KindUserGraspList
}

// anyCoordinateStored reports whether a stored event has one of coords. All
// coordinates are looked up in one query over their kinds, authors and
// identifiers, then matched exactly.
func (p *Policy) anyCoordinateStored(ctx context.Context, coords []nip34.Coordinate) (bool, error) {
	if len(coords) == 0 {
		return false, nil
	}
	var kinds []int
	var pubkeys, ds []string
	seenK, seenP, seenD := map[int]bool{}, map[string]bool{}, map[string]bool{}
	emptyD := false
	for _, c := range coords {
		if !seenK[c.Kind] {
			seenK[c.Kind] = true
			kinds = append(kinds, c.Kind)
		}
		if !seenP[c.PubKey] {
			seenP[c.PubKey] = true
			pubkeys = append(pubkeys, c.PubKey)
		}
		if c.D == "" {
			emptyD = true
		} else if !seenD[c.D] {
			seenD[c.D] = true
			ds = append(ds, c.D)
		}
	}
	// At most one stored event per (kind, pubkey, d): the product bounds
	// the result, capped so a hostile mix of values cannot ask for much.
	limit := min(len(kinds)*len(pubkeys)*max(len(ds), 1), maxAnnouncements)
	var filters []nostr.Filter
	if len(ds) > 0 {
		filters = append(filters, nostr.Filter{Kinds: kinds, Authors: pubkeys, Tags: nostr.TagMap{"d": ds}, Limit: limit})
	}
	if emptyD {
		// Empty identifiers are not indexed; read the keys without a d
		// filter and match locally.
		filters = append(filters, nostr.Filter{Kinds: kinds, Authors: pubkeys, Limit: maxAnnouncements})
	}
	for _, f := range filters {
		found, err := p.query(ctx, f)
		if err != nil {
			return false, err
		}
		for _, e := range found {
			for _, c := range coords {
				if c.Matches(e) {
					return true, nil
				}
			}
		}
	}
	return false, nil
}

// anyIDStored reports whether one of ids is a stored event that anchors.
func (p *Policy) anyIDStored(ctx context.Context, ids []string) (bool, error) {
	if len(ids) == 0 {
		return false, nil
	}
	found, err := p.query(ctx, nostr.Filter{IDs: ids, Limit: len(ids)})
	if err != nil {
		return false, err
	}
	want := map[string]bool{}
	for _, id := range ids {
		want[id] = true
	}
	for _, e := range found {
		if want[e.ID] && anchors(e.Kind) {
			return true, nil
		}
	}
	return false, nil
}

// referencedByStored reports whether a stored event tags evt's id (e, E, q)
// or, for a replaceable or addressable event, its coordinate (a, A, q): the
// forward reference that accepts an event after something replying to it.
func (p *Policy) referencedByStored(ctx context.Context, evt *nostr.Event) (bool, error) {
	tags := []nostr.TagMap{
		{"e": {evt.ID}},
		{"E": {evt.ID}},
		{"q": {evt.ID}},
	}
	if c, ok := nip34.CoordinateOf(evt); ok {
		tags[2]["q"] = append(tags[2]["q"], c.String())
		tags = append(tags, nostr.TagMap{"a": {c.String()}}, nostr.TagMap{"A": {c.String()}})
	}
	for _, tm := range tags {
		found, err := p.query(ctx, nostr.Filter{Tags: tm, Limit: maxForwardScan})
		if err != nil {
			return false, err
		}
		for _, e := range found {
			if e.ID != evt.ID && anchors(e.Kind) {
				return true, nil
			}
		}
	}
	return false, nil
}

// announcements returns the stored announcements with identifier d.
func (p *Policy) announcements(ctx context.Context, d string) ([]*nostr.Event, error) {
	evts, err := p.query(ctx, nostr.Filter{
		Kinds: []int{nip34.KindRepoAnnouncement}, Tags: nostr.TagMap{"d": {d}}, Limit: maxAnnouncements,
	})
	if err != nil {
		return nil, err
	}
	out := evts[:0]
	for _, e := range evts {
		if e.Kind == nip34.KindRepoAnnouncement && e.Tags.GetD() == d {
			out = append(out, e)
		}
	}
	return out, nil
}

// maintainerSet returns the recursive maintainer set of the repositories with
// identifier d that we serve: the owners of stored announcements listing this
// service, their maintainers, those maintainers' own announcements'
// maintainers, and so on. Cycle-safe: each pubkey is expanded once.
func (p *Policy) maintainerSet(anns []*nostr.Event, d string) map[string]bool {
	latest := map[string]*nostr.Event{}
	for _, a := range anns {
		if cur := latest[a.PubKey]; cur == nil || a.CreatedAt > cur.CreatedAt {
			latest[a.PubKey] = a
		}
	}
	set := map[string]bool{}
	var queue []string
	for pk, a := range latest {
		if p.ListsService(a) {
			set[pk] = true
			queue = append(queue, pk)
		}
	}
	for len(queue) > 0 {
		pk := queue[0]
		queue = queue[1:]
		a := latest[pk]
		if a == nil {
			continue
		}
		for _, m := range maintainers(a) {
			if !set[m] {
				set[m] = true
				queue = append(queue, m)
			}
		}
	}
	return set
}

// authors returns the set of authors of evts.
func authors(evts []*nostr.Event) map[string]bool {
	out := make(map[string]bool, len(evts))
	for _, e := range evts {
		out[e.PubKey] = true
	}
	return out
}

// maintainers returns the valid pubkeys in an announcement's maintainers
// tags, bounded.
func maintainers(evt *nostr.Event) []string {
	var out []string
	for _, tag := range evt.Tags {
		if len(tag) < 2 || tag[0] != "maintainers" {
			continue
		}
		for _, v := range tag[1:] {
			if len(out) >= maxMaintainers {
				return out
			}
			if nip34.IsPubKey(v) {
				out = append(out, v)
			}
		}
	}
	return out
}

// ListsService reports whether an announcement lists this service in both a
// clone value and a relays value. Clone URLs may be http(s) or ws(s), relay
// URLs must be ws(s); both must name ServiceURL's host and effective port
// (relayurl.SameService: exact host comparison, never a substring test).
// Discovery uses it too, to find the repositories we serve.
func (p *Policy) ListsService(evt *nostr.Event) bool {
	clone, relays := p.listing(evt)
	return clone && relays
}

// listing reports which of the clone and relays tags name this service.
func (p *Policy) listing(evt *nostr.Event) (clone, relays bool) {
	if evt == nil {
		return false, false
	}
	host, port, err := relayurl.HostPort(p.ServiceURL)
	if err != nil {
		return false, false
	}
	ours := func(u string) bool {
		h, pt, err := relayurl.HostPort(u)
		return err == nil && h == host && pt == port
	}
	checked := 0
	for _, tag := range evt.Tags {
		if len(tag) < 2 || (tag[0] != "clone" && tag[0] != "relays") {
			continue
		}
		for _, v := range tag[1:] {
			if checked >= maxListedURLs {
				return clone, relays
			}
			checked++
			switch tag[0] {
			case "clone":
				clone = clone || ours(v)
			case "relays":
				if !relays {
					if n, err := relayurl.Normalize(v); err == nil {
						relays = ours(n)
					}
				}
			}
			if clone && relays {
				return true, true
			}
		}
	}
	return clone, relays
}

// identifier returns the first d tag's value if it is a safe repository
// identifier: not empty, ".", or "..", and without '/', '\' or NUL (it becomes
// a path component on git servers).
func identifier(evt *nostr.Event) (string, bool) {
	for _, tag := range evt.Tags {
		if len(tag) >= 2 && tag[0] == "d" {
			return tag[1], nip34.ValidIdentifier(tag[1])
		}
	}
	return "", false
}

// references collects the ids (e, E, q) and coordinates (a, A, q) evt names,
// deduplicated and capped at maxReferences in total. Malformed values are
// skipped; coordinates of kinds that cannot anchor are skipped too.
func references(evt *nostr.Event) (ids []string, coords []nip34.Coordinate) {
	seen := map[string]bool{}
	for _, tag := range evt.Tags {
		if len(ids)+len(coords) >= maxReferences {
			break
		}
		if len(tag) < 2 || seen[tag[1]] || tag[1] == evt.ID {
			continue
		}
		v := tag[1]
		switch tag[0] {
		case "e", "E":
			if nip34.IsEventID(v) {
				seen[v] = true
				ids = append(ids, v)
			}
		case "a", "A":
			if c, ok := nip34.ParseCoordinate(v); ok && anchors(c.Kind) {
				seen[v] = true
				coords = append(coords, c)
			}
		case "q":
			if nip34.IsEventID(v) {
				seen[v] = true
				ids = append(ids, v)
			} else if c, ok := nip34.ParseCoordinate(v); ok && anchors(c.Kind) {
				seen[v] = true
				coords = append(coords, c)
			}
		}
	}
	return ids, coords
}

// References returns the event ids (e, E, q) and "kind:pubkey:d"
// coordinates (a, A, q) that evt names and that rule 5 could accept it by,
// deduplicated and bounded (at most 100 in total). Parking uses them to
// find the parked events a newly stored event may unblock.
func References(evt *nostr.Event) (ids, coords []string) {
	if evt == nil {
		return nil, nil
	}
	ids, cs := references(evt)
	for _, c := range cs {
		coords = append(coords, c.String())
	}
	return ids, coords
}

// Coordinate returns evt's own "kind:pubkey:d" address if its kind is
// replaceable or addressable.
func Coordinate(evt *nostr.Event) (string, bool) {
	if evt == nil {
		return "", false
	}
	c, ok := nip34.CoordinateOf(evt)
	if !ok {
		return "", false
	}
	return c.String(), true
}

// DeletionFilters returns the queries that find the targets of a NIP-09
// deletion request: one per valid e id (in batches) and one per valid a
// coordinate, restricted to the deletion's author and, for coordinates, to
// versions created up to the deletion. Callers delete what they return for
// which Deletes holds; together with rule 0 (deleted events are refused when
// re-sent) this is all of NIP-09.
func DeletionFilters(del *nostr.Event) []nostr.Filter {
	if del == nil || del.Kind != nip34.KindDeletion {
		return nil
	}
	var out []nostr.Filter
	var ids []string
	seen := map[string]bool{}
	for _, tag := range del.Tags {
		if len(tag) < 2 || seen[tag[0]+tag[1]] {
			continue
		}
		seen[tag[0]+tag[1]] = true
		switch tag[0] {
		case "e":
			if nip34.IsEventID(tag[1]) {
				ids = append(ids, tag[1])
			}
		case "a":
			c, ok := nip34.ParseCoordinate(tag[1])
			if !ok || c.PubKey != del.PubKey {
				continue
			}
			until := del.CreatedAt
			f := nostr.Filter{Kinds: []int{c.Kind}, Authors: []string{c.PubKey}, Until: &until, Limit: maxVersions}
			if nostr.IsAddressableKind(c.Kind) && c.D != "" {
				f.Tags = nostr.TagMap{"d": {c.D}}
			}
			out = append(out, f)
		}
	}
	for start := 0; start < len(ids); start += deletionBatch {
		batch := ids[start:min(start+deletionBatch, len(ids))]
		out = append(out, nostr.Filter{IDs: batch, Authors: []string{del.PubKey}, Limit: len(batch)})
	}
	return out
}

// Deletes reports whether the deletion request del removes target: same
// author, and target is named by id, or by coordinate with created_at not
// after the deletion's. Deletions themselves are never removed (NIP-09).
func Deletes(del, target *nostr.Event) bool {
	if del == nil || target == nil || del.Kind != nip34.KindDeletion || target.Kind == nip34.KindDeletion || target.PubKey != del.PubKey {
		return false
	}
	coord, keyed := nip34.CoordinateOf(target)
	for _, tag := range del.Tags {
		if len(tag) < 2 {
			continue
		}
		switch {
		case tag[0] == "e" && tag[1] == target.ID:
			return true
		case tag[0] == "a" && keyed && tag[1] == coord.String() && target.CreatedAt <= del.CreatedAt:
			return true
		}
	}
	return false
}
