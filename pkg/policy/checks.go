package policy

import (
	"context"
	"strconv"

	"github.com/nbd-wtf/go-nostr"

	"github.com/grasp-sync/grasp-sync/pkg/nip34"
)

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
