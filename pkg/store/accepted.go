package store

import (
	"context"
	"errors"
	"fmt"

	"github.com/nbd-wtf/go-nostr"

	"github.com/grasp-sync/grasp-sync/pkg/policy"
)

// Deleter is what applying a deletion request needs from a store; *Store
// implements it, and so does any wrapper a service puts around one.
type Deleter interface {
	Query(ctx context.Context, f nostr.Filter) ([]*nostr.Event, error)
	Delete(ctx context.Context, evt *nostr.Event) error
}

// Writer is what storing an accepted event needs from a store.
type Writer interface {
	Deleter
	Save(ctx context.Context, evt *nostr.Event) (stored bool, err error)
}

// SaveAccepted is what every writer (the relay for clients' events, the
// ingester for synced ones) does with an event the write policy accepted:
// save it and, if it is new, settle it (see Settle). stored is false for a
// duplicate or an outdated version, which is neither applied nor announced.
// A save error is returned unchanged (so errors.Is finds ErrUnstorable) with
// stored false; an error with stored true comes from Settle.
func SaveAccepted(ctx context.Context, w Writer, evt *nostr.Event, announce func(*nostr.Event)) (stored bool, err error) {
	stored, err = w.Save(ctx, evt)
	if err != nil || !stored {
		return false, err
	}
	return true, Settle(ctx, w, evt, announce)
}

// Settle finishes an event that has just been stored: a NIP-09 deletion
// request is applied (ApplyDeletion), then announce (if not nil) tells the
// other replicas. A deletion that could not be fully applied is not
// announced and the error says so; the event is stored, and settling it
// again applies and announces it (both steps are idempotent), which is what
// a redelivered message does.
func Settle(ctx context.Context, d Deleter, evt *nostr.Event, announce func(*nostr.Event)) error {
	if err := ApplyDeletion(ctx, d, evt); err != nil {
		return err
	}
	if announce != nil {
		announce(evt)
	}
	return nil
}

// ApplyDeletion removes what a stored NIP-09 deletion request del names:
// only its author's events, by id, and by coordinate up to its created_at
// (policy.DeletionFilters and policy.Deletes decide which). Any other event
// is left alone. Every target is tried; the error joins the failures.
// Idempotent.
func ApplyDeletion(ctx context.Context, d Deleter, del *nostr.Event) error {
	var errs []error
	for _, f := range policy.DeletionFilters(del) {
		targets, err := d.Query(ctx, f)
		if err != nil {
			errs = append(errs, fmt.Errorf("deletion %s: find targets: %w", del.ID, err))
			continue
		}
		for _, t := range targets {
			if !policy.Deletes(del, t) {
				continue
			}
			if err := d.Delete(ctx, t); err != nil {
				errs = append(errs, fmt.Errorf("deletion %s: delete %s: %w", del.ID, t.ID, err))
			}
		}
	}
	return errors.Join(errs...)
}
