package e2e

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/grasp-sync/grasp-sync/pkg/bus"
)

// postgresURL is the PostgreSQL server the multi-process tests create their
// databases on, or skips visibly.
func postgresURL(t *testing.T) string {
	t.Helper()
	u := os.Getenv("GRASP_TEST_POSTGRES_URL")
	if u == "" {
		t.Skip("SKIP: multi-process mode needs PostgreSQL; GRASP_TEST_POSTGRES_URL is not set (CI sets it to postgres://postgres@127.0.0.1:5432/test?sslmode=disable)")
	}
	return u
}

// startMulti is the multi-process starter: NATS, PostgreSQL (a fresh
// database) and one process per service.
func startMulti(t *testing.T, overrides Env) Target {
	t.Helper()
	return StartDeployment(t, DeploymentOptions{PostgresURL: postgresURL(t), Env: overrides})
}

// The scenario suite in multi-process mode: the same scenario bodies as the
// in-process tests, against separate relay, discovery, planner, fetcher and
// ingester processes joined by one NATS over a shared PostgreSQL store,
// syncing from testkit remote relays.
func TestMultiProcess(t *testing.T) {
	postgresURL(t)
	if _, err := BuildBinaries(); err != nil {
		t.Fatal(err)
	}
	t.Run("Layer2ThenLayer3", func(t *testing.T) { layer2ThenLayer3(t, startMulti) })
	t.Run("LiveIssueThenComment", func(t *testing.T) { liveIssueThenComment(t, startMulti) })
	t.Run("SSRFNeverDialled", func(t *testing.T) { ssrfNeverDialled(t, startMulti) })
	t.Run("History5000CappedAt500", func(t *testing.T) { history5000CappedAt500(t, startMulti) })
}

// The same scenario on a 3-node NATS JetStream cluster (R3 streams and
// buckets) with two fetchers and two ingesters, the production layout.
// Long: a cluster takes a while to form. Consumers created as the cluster
// forms may miss their first pull (see docs/decisions/0028-pull-consumer-idle-heartbeat.md).
// Every stream and bucket, the fetchers' own included, is then R3: an R1
// one would stop the services that need it while its one node is down.
func TestMultiProcessNATSCluster(t *testing.T) {
	long(t)
	pg := postgresURL(t)
	var d *Deployment
	layer2ThenLayer3(t, func(t *testing.T, overrides Env) Target {
		d = StartDeployment(t, DeploymentOptions{PostgresURL: pg, Env: overrides, NATSNodes: 3, Fetchers: 2, Ingesters: 2})
		return d
	})
	nc, err := nats.Connect(d.natsURL)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	streams := js.ListStreams(ctx)
	n := 0
	for info := range streams.Info() {
		n++
		if r := info.Config.Replicas; r != 3 {
			t.Errorf("stream %s has %d replicas, want 3 (GRASP_NATS_REPLICAS)", info.Config.Name, r)
		}
	}
	if err := streams.Err(); err != nil {
		t.Fatal(err)
	}
	if n < 8 {
		t.Fatalf("%d streams listed, want every stream and bucket of the deployment", n)
	}
	t.Logf("%d streams and buckets checked for R3", n)
	// The work queues' consumers keep their replicated state in memory on
	// a cluster (docs/decisions/0064-cluster-consumer-state-in-memory.md);
	// the planner's, on the reports kept for a day, in files.
	names := bus.DefaultNames()
	for stream, wantMem := range map[string]bool{names.EventsStream(): true, names.FetchCmdStream(): true, names.FetchReportStream(): false} {
		st, err := js.Stream(ctx, stream)
		if err != nil {
			t.Fatal(err)
		}
		cs := 0
		lister := st.ListConsumers(ctx)
		for info := range lister.Info() {
			cs++
			if info.Config.MemoryStorage != wantMem {
				t.Errorf("consumer %s on %s: state in memory %v, want %v", info.Name, stream, info.Config.MemoryStorage, wantMem)
			}
		}
		if err := lister.Err(); err != nil {
			t.Fatal(err)
		}
		if cs == 0 {
			t.Errorf("no consumer on %s", stream)
		}
	}
}
