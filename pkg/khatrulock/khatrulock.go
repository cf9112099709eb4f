// Package khatrulock works around a data race in khatru v0.19.1: it reads
// and iterates its listener slice (notifyListeners, BroadcastEvent) without
// the clientsMutex under which REQ, CLOSE and disconnects change that slice.
// Anyone who broadcasts from outside khatru's own connection goroutines —
// the own relay relaying other writers' events, testkit relays adding events
// — must hold the same lock while doing so. Reaching the unexported field is
// the workaround, kept in this one place (see docs/decisions.md).
package khatrulock

import (
	"reflect"
	"sync"
	"unsafe"

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

// Broadcast sends evt to k's matching live subscribers under the lock.
func Broadcast(k *khatru.Relay, evt *nostr.Event) int {
	if mu := ClientsMutex(k); mu != nil {
		mu.Lock()
		defer mu.Unlock()
	}
	return k.BroadcastEvent(evt)
}
