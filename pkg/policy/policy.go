// Package policy decides which events this GRASP service accepts.
//
// It implements the write policy of docs/policy.md (GRASP-01 acceptance,
// GRASP-05 archives, integrity and limits) as pure logic over a read-only view of the event
// store, so that the relay (events from clients) and the ingester (events from
// sync) make the same decision for the same event. It never stores anything:
// callers save accepted events and apply accepted deletions themselves.
package policy

import (
	"context"
	"fmt"
	"time"

	"github.com/nbd-wtf/go-nostr"

	"github.com/grasp-sync/grasp-sync/pkg/nip34"
)

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
	// Archive names the repositories accepted although their
	// announcements do not list us (GRASP-05); the zero value archives
	// nothing.
	Archive Archive
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
	// ReasonArchiveReadOnly is not returned by Evaluate: the relay refuses
	// with it a client event about an archived repository (ArchiveOnly)
	// when archives are read-only.
	ReasonArchiveReadOnly Reason = "archive-read-only"
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

// Evaluate applies the rules of docs/policy.md, in order, to one event:
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
	case nip34.KindRelayList:
		if p.Archive.NamesAuthor(evt.PubKey) {
			// GRASP-05: where a whitelisted maintainer publishes.
			return accept()
		}
		return p.evaluateReferences(ctx, evt)
	default:
		return p.evaluateReferences(ctx, evt)
	}
}

func (p *Policy) now() time.Time {
	if p.Now != nil {
		return p.Now()
	}
	return time.Now()
}
