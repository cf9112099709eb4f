package bus_test

import (
	"testing"

	"github.com/nats-io/nats.go"

	"github.com/grasp-sync/grasp-sync/pkg/bus"
)

// TestSplitEvents: a batch message yields its lines, a message without
// bus.HeaderEvents (the one-event format) its whole data.
func TestSplitEvents(t *testing.T) {
	one := []byte(`{"id":"a"}`)
	if got := bus.SplitEvents(nats.Header{}, one); len(got) != 1 || string(got[0]) != string(one) || bus.EventCount(nats.Header{}) != 1 {
		t.Errorf("one-event message split into %q", got)
	}
	h := nats.Header{}
	h.Set(bus.HeaderEvents, "3")
	got := bus.SplitEvents(h, []byte("{\"id\":\"a\"}\n{\"id\":\"b\"}\n\n{\"id\":\"c\"}"))
	if len(got) != 3 || string(got[1]) != `{"id":"b"}` || string(got[2]) != `{"id":"c"}` || bus.EventCount(h) != 3 {
		t.Errorf("batch split into %q", got)
	}
	if bus.EventBatchMsgID([]string{"a", "b"}) == bus.EventBatchMsgID([]string{"ab"}) {
		t.Error("batch ids of different events collide")
	}
}
