// Package syncbaseline serves the benchmarks (`make bench`;
// docs/performance.md, "Initial sync"): Sync is the simplest initial sync
// of relays' NIP-34 history one process can do, which the pipeline's
// events/s and CPU per event are measured against. The in-process benchmark
// (e2e TestBenchEndToEnd) and the baseline's own process
// (e2e/cmd/syncbaseline, for the run with the relays in their own process,
// issue 24 §3) both run exactly this code.
package syncbaseline
