// Package e2e proves grasp-sync end to end: it runs graspd (every service in
// one process, embedded NATS, embedded store) against real khatru remote
// relays from pkg/testkit and checks what reaches the own store. The
// scenario tests live in this package's _test files; Harness is shared with
// the demo (cmd/demo) and the benchmark (bench_test.go), which is why it is
// not test-only code.
//
// `make e2e` runs the scenarios that fit CI time; `make e2e-long` sets
// GRASP_E2E_LONG=1 to add the slow ones; `make bench` sets GRASP_BENCH=1 and
// writes the end-to-end sections of docs/performance.md.
package e2e
