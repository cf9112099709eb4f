package relay

import (
	"reflect"
	"sync"
	"unsafe"

	"github.com/fiatjaf/khatru"
)

// clientsMutex returns khatru's internal lock over its client and listener
// lists. khatru v0.19.1 iterates its listener slice in notifyListeners
// without that lock while a disconnecting client swap-deletes from it under
// the lock: a data race (and, rarely, a write to the wrong subscriber) every
// time we broadcast another writer's event while a client leaves. Holding
// the same lock around BroadcastEvent serialises the two. Reaching an
// unexported field is a workaround for that bug, kept in this one place;
// if a khatru upgrade renames the field, nil is returned and broadcasting
// goes on unlocked (see docs/decisions.md).
func clientsMutex(k *khatru.Relay) *sync.Mutex {
	f := reflect.ValueOf(k).Elem().FieldByName("clientsMutex")
	if !f.IsValid() || f.Type() != reflect.TypeOf(sync.Mutex{}) {
		return nil
	}
	return (*sync.Mutex)(unsafe.Pointer(f.UnsafeAddr()))
}
