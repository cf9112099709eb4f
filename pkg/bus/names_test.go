package bus_test

import (
	"testing"

	"github.com/grasp-sync/grasp-sync/pkg/bus"
)

func TestStoredKind(t *testing.T) {
	n := bus.Names{}
	other := bus.Names{Prefix: "tenant-b"}
	for _, tc := range []struct {
		subject string
		kind    int
		ok      bool
	}{
		{n.StoredSubject(1111), 1111, true},
		{n.StoredSubject(0), 0, true},
		{other.StoredSubject(30617), 30617, true},
		{n.EventsSubject(3), 0, false},
		{n.StoredSubjects(), 0, false},
		{"grasp.stored.-1", 0, false},
		{"grasp.stored.x", 0, false},
		{"stored", 0, false},
	} {
		kind, ok := bus.StoredKind(tc.subject)
		if kind != tc.kind || ok != tc.ok {
			t.Errorf("StoredKind(%q) = %d, %v; want %d, %v", tc.subject, kind, ok, tc.kind, tc.ok)
		}
	}
}
