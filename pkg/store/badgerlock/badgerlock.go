// Package badgerlock serialises deletes on eventstore's badger backend,
// whose delete path updates a package-level counter (serialDelete) without
// a lock: two badger stores deleting at once in one process — the event
// store and a test relay, or two test relays — are a data race. Every
// badger delete in this repository goes through Delete.
package badgerlock

import (
	"context"
	"sync"

	"github.com/fiatjaf/eventstore/badger"
	"github.com/nbd-wtf/go-nostr"
)

// Mu is held around every badger delete in the process.
var Mu sync.Mutex

// Delete deletes evt from b under Mu.
func Delete(ctx context.Context, b *badger.BadgerBackend, evt *nostr.Event) error {
	Mu.Lock()
	defer Mu.Unlock()
	return b.DeleteEvent(ctx, evt)
}
