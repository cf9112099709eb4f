package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/grasp-sync/grasp-sync/pkg/filters"
	"github.com/grasp-sync/grasp-sync/pkg/negsync"
	"github.com/grasp-sync/grasp-sync/pkg/relayconn"
	"github.com/grasp-sync/grasp-sync/pkg/store"
	"github.com/grasp-sync/grasp-sync/pkg/testkit/testrelay"
	"github.com/grasp-sync/grasp-sync/services/fetcher"
)

// The fetcher's local set over the real store is complete for the layer-2
// and layer-3 filters of a generated world: what a NIP-77 resync compares
// against. An incomplete set makes every resync download everything again.
func TestLocalSetComplete(t *testing.T) {
	st, err := store.Open(filepath.Join(t.TempDir(), "events"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	ds := GenerateDataset("ws://grasp.test", []string{"ws://r1.test", "ws://r2.test"}, 8, 20, 1, 1)
	for _, e := range ds.Distinct {
		if _, err := st.Save(context.Background(), e); err != nil {
			t.Fatal(err)
		}
	}
	var roots []string
	for _, rs := range ds.Roots {
		for _, r := range rs {
			roots = append(roots, r.ID)
		}
	}
	got := map[string]bool{}
	for _, f := range filters.Items(ds.Repos, nil, roots) {
		items, err := fetcher.QueryLocalSet{Store: st}.Items(context.Background(), f)
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, it := range items {
			got[it.ID] = true
			n++
		}
		remote := 0
		for _, e := range ds.Distinct {
			if f.Matches(e) {
				remote++
			}
		}
		if n != remote {
			t.Errorf("filter %v: local set %d items, %d events match", f, n, remote)
		}
	}
	if len(got) != len(ds.Distinct) {
		t.Errorf("local sets cover %d of %d events", len(got), len(ds.Distinct))
	}
}

// The whole NIP-77 path minus the fetcher: the store's local set against a
// khatru relay holding the same events, per filter of an items batch, needs
// nothing. Against a plain testkit relay it fails today: khatru v0.19.1
// over eventstore badger answers {"#A": [repo]} or {"#q": [repo]} with the
// events tagged ["a", repo] as well (the tag letter is ignored), so every
// resync fetches those ids again. That case is a known remote-relay quirk
// (reported) and runs with GRASP_E2E_KNOWN_BUGS=1; with StrictTags it must
// pass.
func TestReconcileStoreAgainstRelay(t *testing.T) {
	for _, strict := range []bool{true, false} {
		t.Run(fmt.Sprintf("strict tags %v", strict), func(t *testing.T) {
			if !strict && os.Getenv("GRASP_E2E_KNOWN_BUGS") == "" {
				t.Skip("SKIP: known remote-relay quirk (khatru+badger ignores the tag letter); GRASP_E2E_KNOWN_BUGS=1 runs it")
			}
			reconcileStoreAgainstRelay(t, strict)
		})
	}
}

func reconcileStoreAgainstRelay(t *testing.T, strict bool) {
	st, err := store.Open(filepath.Join(t.TempDir(), "events"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	remote := testrelay.Start(t, testrelay.Options{Negentropy: true, MaxLimit: 500})
	if strict {
		StrictTags(remote)
	}
	ds := GenerateDataset("ws://grasp.test", []string{remote.URL}, 8, 20, 1, 1)
	var roots []string
	for _, e := range ds.Distinct {
		if _, err := st.Save(context.Background(), e); err != nil {
			t.Fatal(err)
		}
		if err := remote.Store.SaveEvent(context.Background(), e); err != nil {
			t.Fatal(err)
		}
		if e.Kind == 1617 || e.Kind == 1621 {
			roots = append(roots, e.ID)
		}
	}
	c, err := relayconn.Dial(context.Background(), remote.URL, relayconn.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for _, f := range filters.Items(ds.Repos, nil, roots) {
		items, err := fetcher.QueryLocalSet{Store: st}.Items(context.Background(), f)
		if err != nil {
			t.Fatal(err)
		}
		res, err := negsync.Reconcile(context.Background(), c, f, items, negsync.Options{FrameSize: 60000})
		if err != nil {
			t.Fatal(err)
		}
		if len(res.Need) != 0 {
			t.Errorf("filter %.80s…: %d local items, need %d", f.String(), len(items), len(res.Need))
		}
	}
}
