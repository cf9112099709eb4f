// Command cpuattr divides CPU profiles' samples among the pipeline's parts
// and prints µs per event: the tables of docs/measurements/2026-12-04-issue24-hot-path.md. Each sample goes to the first part (in the order
// below) that any frame of its stack matches, so parts do not overlap and
// the rows add up to the profile's total.
//
//	go run ./cmd/cpuattr -events 13968 -parts graspd graspd.cpu.pprof
//	go run ./cmd/cpuattr -events 60240 -parts ingest p.2 p.3 p.4
//
// -events is how many events were ingested while the profiles ran
// (TestBenchRemote's GRASP_BENCH_PROFILE log line; BenchmarkIngest's events
// per run × the runs profiled).
package main

import (
	"flag"
	"fmt"
	"os"
	"regexp"
	"time"

	"github.com/google/pprof/profile"
)

// part is one row: a name and the function names that place a sample in it.
type part struct {
	name string
	re   *regexp.Regexp
}

func p(name, re string) part { return part{name, regexp.MustCompile(re)} }

var verification = p("verification (libsecp256k1 CheckSignature, CheckID)", `verify\.Signature|CheckID|CheckSignature`)

var partSets = map[string][]part{
	// BenchmarkIngest: the ingester alone, on the embedded NATS and store.
	"ingest": {
		verification,
		p("store write of a decide batch (SaveBatch: index keys, memtable inserts)", `store\.\(\*Store\)\.SaveBatch`),
		p("pebble flushes and compactions (background)", `pebble/v2\.\(\*DB\)\.(flush|compact|runCompaction)`),
		p("policy (rules and their store reads)", `policy\.\(\*Policy\)`),
		p("batch prefetch (ids stored, deletions)", `prefetch`),
		p("NATS server: JetStream (stream store, delivery, acks)", `nats-server/v2/server\.\(\*(stream|consumer|fileStore|msgBlock|jetStream)`),
		p("NATS server: client connections, parsing, routing", `nats-server`),
		p("NATS client (read loop, acks, publishes)", `nats-io/nats\.go|nats%2ego`),
		p("decode and split batch messages", `ingester\.decode|ingester\.split`),
		p("decide bookkeeping (pending set, ordered acks, stored notices, metrics)", `services/ingester`),
		p("GC background marking", `gcBgMarkWorker`),
		p("other (scheduler, runtime, syscalls)", `.`),
	},
	// graspd during TestBenchRemote: every service in one process.
	"graspd": {
		verification,
		p("ingester: store write (SaveBatch)", `store\.\(\*Store\)\.SaveBatch`),
		p("pebble flushes and compactions (background)", `pebble/v2\.\(\*DB\)\.(flush|compact|runCompaction)`),
		p("ingester: policy and its store reads", `policy\.\(\*Policy\)`),
		p("fetcher: NIP-77 local set (store reads)", `fetcher\.\(\*batchRun\)\.localSet|LocalSet\.Items`),
		p("fetcher: needed ids already held (store reads)", `fetcher\.\(\*batchRun\)\.dropHeld`),
		p("fetcher: websocket reads and writes, relay message parsing", `relayconn`),
		p("fetcher: publishing to the events stream", `fetcher\.\(\*windowPublisher\)|fetcher\.\(\*relayWorker\)\.publish`),
		p("fetcher: NIP-77 reconciliation and its id fetches (the rest)", `negsync|negentropy`),
		p("fetcher: other", `services/fetcher`),
		p("ingester: other (decode, prefetch, bookkeeping, stored notices)", `services/ingester`),
		p("relay: stored notices, live broadcast, client EVENTs", `services/relay|fiatjaf/khatru`),
		p("discovery (self-subscription and stored feed)", `services/discovery`),
		p("planner", `services/planner`),
		p("NATS server (embedded)", `nats-server`),
		p("NATS client (other)", `nats-io/nats\.go|nats%2ego`),
		p("store reads (other)", `pkg/store`),
		p("GC background marking", `gcBgMarkWorker`),
		p("other (scheduler, runtime, syscalls)", `.`),
	},
}

func main() {
	events := flag.Float64("events", 0, "events ingested while the profiles ran")
	set := flag.String("parts", "graspd", "part set: graspd or ingest")
	flag.Parse()
	parts, ok := partSets[*set]
	if !ok || *events <= 0 || flag.NArg() == 0 {
		fmt.Fprintln(os.Stderr, "usage: cpuattr -events N -parts graspd|ingest PROFILE...")
		os.Exit(2)
	}
	sums := make([]time.Duration, len(parts))
	for _, path := range flag.Args() {
		if err := add(path, parts, sums); err != nil {
			fmt.Fprintf(os.Stderr, "cpuattr: %s: %v\n", path, err)
			os.Exit(1)
		}
	}
	var total time.Duration
	fmt.Println("| part | CPU-µs per event |\n| --- | --- |")
	for i, pt := range parts {
		total += sums[i]
		fmt.Printf("| %s | %.1f |\n", pt.name, perEvent(sums[i], *events))
	}
	fmt.Printf("| **total** | **%.1f** |\n", perEvent(total, *events))
}

func perEvent(d time.Duration, events float64) float64 {
	return float64(d.Microseconds()) / events
}

// add reads one CPU profile and adds each sample's CPU time to its part.
func add(path string, parts []part, sums []time.Duration) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	prof, err := profile.Parse(f)
	if err != nil {
		return err
	}
	cpu := -1
	for i, st := range prof.SampleType {
		if st.Type == "cpu" {
			cpu = i
		}
	}
	if cpu < 0 {
		return fmt.Errorf("not a CPU profile")
	}
	for _, s := range prof.Sample {
		for i, pt := range parts {
			if matches(s, pt.re) {
				sums[i] += time.Duration(s.Value[cpu])
				break
			}
		}
	}
	return nil
}

func matches(s *profile.Sample, re *regexp.Regexp) bool {
	for _, loc := range s.Location {
		for _, ln := range loc.Line {
			if ln.Function != nil && re.MatchString(ln.Function.Name) {
				return true
			}
		}
	}
	return false
}
