package khatrulock_test

import (
	"testing"

	"github.com/fiatjaf/khatru"

	"github.com/grasp-sync/grasp-sync/pkg/khatrulock"
)

// The workaround depends on a private field: fail loudly when an upgrade
// removes it, so the race is revisited rather than silently back.
func TestClientsMutexFound(t *testing.T) {
	if khatrulock.ClientsMutex(khatru.NewRelay()) == nil {
		t.Fatal("khatru has no clientsMutex any more: revisit the listener-race workaround")
	}
}
