// Package e2e proves grasp-sync end to end: it runs graspd (every service in
// one process, embedded NATS, embedded store) against real khatru remote
// relays from pkg/testkit and checks what reaches the own store. The
// scenario tests live in this package's _test files; the harness is shared with
// the demo (cmd/demo) and the benchmark (bench_test.go), which is why it is
// not test-only code.
//
// Multi-process mode (multiproc.go): Deployment builds the service
// binaries and nats-server once per run, starts one NATS node or a 3-node
// JetStream cluster and relay, discovery, planner, fetcher and ingester
// processes over a fresh PostgreSQL database (created on
// GRASP_TEST_POSTGRES_URL's server, dropped at the end), and can kill -9
// and restart any one of them. Deployment and the in-process Graspd both
// implement Target, so scenario bodies taking a starter run in both modes
// (TestMultiProcess). The chaos tests (chaos_test.go, long) kill each
// process mid-initial-sync and check the exact stored set; PostgreSQL is
// restarted only as a private server (postgres.go), never the shared one.
// With DeploymentOptions.Auth (natsauth.go) NATS runs the manifests' own
// configuration (k8s/base/nats, the generated auth.conf) and every service
// connects as its own NATS user; TestShippedNATSPermissions syncs a
// repository that way and runs graspctl as its user, failing on any
// permission refusal in any log. GRASP_E2E_NATS_SERVER=<path> runs another
// nats-server binary than the pinned one the deployment builds.
// GRASP_E2E_KEEP_LOGS=<dir> keeps a failed deployment's process logs;
// GRASP_E2E_CHAOS_ONLY=planner,relay runs only those chaos cases;
// GRASP_E2E_CHAOS_REPOS sizes the chaos dataset (default 100 repositories).
//
// `make e2e` runs the scenarios that fit CI time; `make e2e-long` sets
// GRASP_E2E_LONG=1 to add the slow ones; `make bench` sets GRASP_BENCH=1 and
// writes the end-to-end sections of docs/performance.md.
package e2e
