// Package khatrulock works around a data race in khatru v0.19.1: it reads
// and iterates its listener slice (notifyListeners, BroadcastEvent) without
// the clientsMutex under which REQ, CLOSE and disconnects change that slice.
// Anyone who broadcasts must hold that lock: the own relay relaying other
// writers' events, and — through SaveThenBroadcast — khatru's own handling of
// a client's EVENT. Reaching the unexported field is the workaround, kept in
// this one place (see docs/decisions/0003-khatru-listener-race.md).
package khatrulock

import (
	"context"
	"reflect"
	"sync"
	"unsafe"

	"github.com/fiatjaf/eventstore"
	"github.com/fiatjaf/khatru"
	"github.com/nbd-wtf/go-nostr"
)

// ClientsMutex returns khatru's internal lock over its clients and
// listeners, or nil if a khatru upgrade renamed it.
func ClientsMutex(k *khatru.Relay) *sync.Mutex {
	f := reflect.ValueOf(k).Elem().FieldByName("clientsMutex")
	if !f.IsValid() || f.Type() != reflect.TypeOf(sync.Mutex{}) {
		return nil
	}
	return (*sync.Mutex)(unsafe.Pointer(f.UnsafeAddr()))
}

// ListeningFor reports whether a live subscription open on k could want an
// event of kind: one whose filter names no kinds, or names this one. A
// writer relaying other writers' events skips decoding those nobody could
// want (during a sync, thousands per second, most of them of kinds only the
// own discovery's subscription — which names its kinds — is open for). It
// reads khatru's unexported listener slice under khatru's lock, and says
// true if a khatru upgrade changed its shape, so nothing is skipped then.
func ListeningFor(k *khatru.Relay, kind int) bool {
	ls := reflect.ValueOf(k).Elem().FieldByName("listeners")
	if !ls.IsValid() || ls.Kind() != reflect.Slice {
		return true
	}
	elem := ls.Type().Elem()
	filter, ok := elem.FieldByName("filter")
	if !ok || filter.Type != reflect.TypeOf(nostr.Filter{}) {
		return true
	}
	kinds, _ := filter.Type.FieldByName("Kinds")
	if mu := ClientsMutex(k); mu != nil {
		mu.Lock()
		defer mu.Unlock()
	}
	for i := range ls.Len() {
		ks := ls.Index(i).FieldByIndex(filter.Index).FieldByIndex(kinds.Index)
		if ks.Len() == 0 {
			return true
		}
		for j := range ks.Len() {
			if ks.Index(j).Int() == int64(kind) {
				return true
			}
		}
	}
	return false
}

// Broadcast sends evt to k's matching live subscribers under the lock.
func Broadcast(k *khatru.Relay, evt *nostr.Event) int {
	if mu := ClientsMutex(k); mu != nil {
		mu.Lock()
		defer mu.Unlock()
	}
	return k.BroadcastEvent(evt)
}

// SaveThenBroadcast wraps a khatru StoreEvent or ReplaceEvent function so
// that khatru never notifies listeners without its lock. After save succeeds
// it runs saved (what would otherwise be OnEventSaved hooks, which khatru
// skips on this path), broadcasts the event under the lock, and returns
// eventstore.ErrDupEvent: the one error khatru treats as "accepted, do not
// broadcast", so the client still gets OK true and khatru's own unlocked
// notifyListeners is never reached. It must be the last StoreEvent and
// ReplaceEvent hook. Ephemeral events do not pass through it (neither relay
// of ours accepts them). A side effect: khatru's NIP-40 expiration tracking,
// which runs after the store hooks, does not see these events.
func SaveThenBroadcast(k *khatru.Relay, save func(context.Context, *nostr.Event) error, saved ...func(context.Context, *nostr.Event)) func(context.Context, *nostr.Event) error {
	return func(ctx context.Context, evt *nostr.Event) error {
		if err := save(ctx, evt); err != nil {
			return err
		}
		for _, fn := range saved {
			fn(ctx, evt)
		}
		Broadcast(k, evt)
		return eventstore.ErrDupEvent
	}
}
