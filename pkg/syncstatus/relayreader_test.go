package syncstatus_test

import (
	"context"
	"errors"
	"testing"

	"google.golang.org/protobuf/proto"

	graspv1 "github.com/grasp-sync/grasp-sync/proto/grasp/v1"

	"github.com/grasp-sync/grasp-sync/pkg/bus"
	"github.com/grasp-sync/grasp-sync/pkg/syncstatus"
)

// TestRelayReaderRereadsOnlyChanges: a RelayReader returns the snapshot it
// read last while the bucket is unchanged, and sees every put, delete and
// purge.
func TestRelayReaderRereadsOnlyChanges(t *testing.T) {
	ctx := context.Background()
	js := startJetStream(t)
	names := bus.DefaultNames()
	r := syncstatus.NewRelayReader(js, names)
	if _, err := r.Read(ctx); !errors.Is(err, syncstatus.ErrBucketMissing) {
		t.Fatalf("Read before setup: %v, want ErrBucketMissing", err)
	}
	if err := bus.Setup(ctx, js, names, bus.DefaultOptions()); err != nil {
		t.Fatal(err)
	}
	kv, err := js.KeyValue(ctx, names.RelayStateBucket())
	if err != nil {
		t.Fatal(err)
	}
	put := func(url string, status graspv1.RelayStatus, pendingRoots uint32) {
		t.Helper()
		data, _ := proto.Marshal(&graspv1.RelayState{RelayUrl: url, Status: status, PendingRoots: pendingRoots})
		if _, err := kv.Put(ctx, bus.RelayStateKey(url), data); err != nil {
			t.Fatal(err)
		}
	}
	read := func(want ...string) *syncstatus.Snapshot {
		t.Helper()
		s, err := r.Read(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, rel := range s.Relays {
			got = append(got, rel.URL+" "+rel.Status)
		}
		if len(got) != len(want) {
			t.Fatalf("relays %q, want %q", got, want)
		}
		for i := range want {
			if got[i] != want[i] {
				t.Fatalf("relays %q, want %q", got, want)
			}
		}
		return s
	}

	empty := read()
	if again := read(); again != empty {
		t.Error("an unchanged empty bucket was read again")
	}
	put(r1, graspv1.RelayStatus_RELAY_STATUS_SYNCING, 5)
	first := read(r1 + " Syncing")
	if again := read(r1 + " Syncing"); again != first {
		t.Error("an unchanged bucket was read again")
	}
	put(r1, graspv1.RelayStatus_RELAY_STATUS_CONNECTED, 0)
	put(r2, graspv1.RelayStatus_RELAY_STATUS_SYNCING, 3)
	if p := read(r1+" Connected", r2+" Syncing").Progress(); p != (syncstatus.Progress{Relays: 2, Connected: 1, Syncing: 1, PendingRoots: 3}) {
		t.Errorf("progress %+v", p)
	}
	if err := kv.Delete(ctx, bus.RelayStateKey(r2)); err != nil {
		t.Fatal(err)
	}
	read(r1 + " Connected")
	if err := kv.Purge(ctx, bus.RelayStateKey(r1)); err != nil {
		t.Fatal(err)
	}
	read()
}
