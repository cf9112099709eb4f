package ingester

import (
	"context"
	"errors"

	"github.com/nbd-wtf/go-nostr"

	"github.com/grasp-sync/grasp-sync/pkg/policy"
	"github.com/grasp-sync/grasp-sync/pkg/rejected"
	"github.com/grasp-sync/grasp-sync/services/ingester/target"
)

// verdict is what one evaluated event calls for.
type verdict int

const (
	verdictStore     verdict = iota // accepted: store and publish it
	verdictDuplicate                // already stored: ack
	verdictPark                     // refused for something missing: park it
	verdictRefuse                   // refused for good: count and ack
	verdictRetry                    // the store could not be read: infrastructure failure
)

// judge maps a policy decision to what the ingester does with the message.
func judge(d policy.Decision) verdict {
	switch {
	case d.Accept:
		return verdictStore
	case d.Reason == policy.ReasonStoreError:
		return verdictRetry
	case d.Reason == policy.ReasonDuplicate:
		return verdictDuplicate
	case d.Parkable():
		return verdictPark
	default:
		return verdictRefuse
	}
}

// verified reports whether a decision with this reason was reached after the
// id and the signature checked out (policy.Evaluate checks integrity first;
// size and shape refusals come before the signature check).
func verified(r policy.Reason) bool {
	switch r {
	case policy.ReasonBadID, policy.ReasonBadSignature, policy.ReasonMalformed, policy.ReasonTooLarge,
		policy.ReasonTooManyTags, policy.ReasonFuture, policy.ReasonExpired:
		return false
	}
	return true
}

// targetRefused settles an event the target relay refused for good: the
// refusal is logged and remembered with the target's reason in the rejected
// bucket (fetchers then count it as held and do not fetch it again, and
// graspctl explain shows the reason). It reports false for any other error.
func (i *Ingester) targetRefused(ctx context.Context, evt *nostr.Event, relay string, err error) bool {
	var re *target.RefusedError
	if !errors.As(err, &re) {
		return false
	}
	i.log.Info("target relay refused an event", "id", evt.ID, "kind", evt.Kind, "relay", relay, "target", re.Target, "reason", re.Reason)
	if i.rejected != nil {
		if err := rejected.Add(ctx, i.rejected, evt, TargetRefusalPrefix+re.Reason); err != nil && ctx.Err() == nil {
			i.log.Warn("recording the target's refusal failed", "id", evt.ID, "err", err)
		}
	}
	return true
}

// TargetRefusalPrefix starts the reason recorded in the rejected bucket for
// an event the target relay refused (the target's own reason follows).
const TargetRefusalPrefix = "target: "

// outcomeTargetRefused is the refused_total reason of events the target
// relay refused.
const outcomeTargetRefused = "target-refused"

// rememberable reports whether a refusal may be recorded so that fetchers
// count the event as held (pkg/rejected) and do not fetch it again at every
// resync. It holds for every copy of the event: not forgeries (a forged copy
// must not hide the real event), not "future" (time alone makes it
// acceptable). Announcements and states refused because their author
// maintains no repository we serve (not-listed, not-maintainer) are
// remembered too, although that can change: the one change that revives them
// — a served repository's maintainer set gaining the author — makes the
// planner fetch the author's announcement and state of that repository again
// with REQ, past this record (docs/decisions/0022-remembered-refusals-revived.md).
// Without it every resync downloads every foreign announcement of every
// relay again.
func rememberable(r policy.Reason) bool {
	switch r {
	case policy.ReasonTooLarge, policy.ReasonTooManyTags, policy.ReasonMalformed, policy.ReasonExpired,
		policy.ReasonDeleted, policy.ReasonDeleteOthers, policy.ReasonBadIdentifier, policy.ReasonOlderVersion,
		policy.ReasonNotListed, policy.ReasonNotMaintainer:
		return true
	}
	return false
}

// remember records a refusal in the rejected-events bucket. Best
// effort: a lost record only means the event may be fetched (and refused)
// again at the next resync.
func (i *Ingester) remember(ctx context.Context, evt *nostr.Event, r policy.Reason, relay string) {
	if i.rejected == nil || !rememberable(r) {
		return
	}
	if err := rejected.Add(ctx, i.rejected, evt, string(r)); err != nil && ctx.Err() == nil {
		i.log.Warn("recording a refused event failed", "id", evt.ID, "reason", string(r), "relay", relay, "err", err)
	}
}
