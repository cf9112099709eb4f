package ingester_test

import (
	"encoding/json"
	"fmt"
	"os"
	"runtime"
	"runtime/pprof"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nbd-wtf/go-nostr"

	"github.com/grasp-sync/grasp-sync/services/ingester"
)

// benchSpec is the benchmark's workload: valid events only (announcements,
// issues, comments), so every event pays for verification, policy lookups
// and a store write.
var benchSpec = workloadSpec{repos: 40, issuesPerRepo: 40, commentsPerIssue: 11}

// BenchmarkVerify is the raw signature verification rate (CheckID +
// CheckSignature, what policy.Evaluate does first) on GOMAXPROCS cores, the
// ceiling the ingester is measured against. Run with -cpu 1,2.
func BenchmarkVerify(b *testing.B) {
	evts := decodeAll(b, workloadFor(b, benchSpec))
	b.ResetTimer()
	var wall, cpu time.Duration
	for range b.N {
		w, c := verifyAll(b, evts)
		wall, cpu = wall+w, cpu+c
	}
	b.ReportMetric(float64(b.N*len(evts))/wall.Seconds(), "events/s")
	b.ReportMetric(float64(cpu.Microseconds())/float64(b.N*len(evts)), "cpu-µs/event")
}

// decodeAll decodes the workload's events for verifyAll.
func decodeAll(b *testing.B, w *workload) []*nostr.Event {
	evts := make([]*nostr.Event, len(w.deliveries))
	for n, d := range w.deliveries {
		evts[n] = new(nostr.Event)
		if err := json.Unmarshal(d.data, evts[n]); err != nil {
			b.Fatal(err)
		}
	}
	return evts
}

// verifyAll checks every event's id and signature on GOMAXPROCS
// goroutines and returns the wall and CPU time it took.
func verifyAll(b *testing.B, evts []*nostr.Event) (wall, cpu time.Duration) {
	start, cpu0 := time.Now(), cpuTime()
	var wg sync.WaitGroup
	workers := runtime.GOMAXPROCS(0)
	for wkr := range workers {
		wg.Go(func() {
			for n := wkr; n < len(evts); n += workers {
				e := evts[n]
				if !e.CheckID() {
					b.Error("bad id")
				}
				if ok, err := e.CheckSignature(); !ok || err != nil {
					b.Error("bad signature")
				}
			}
		})
	}
	wg.Wait()
	return time.Since(start), cpuTime() - cpu0
}

// cpuTime is the CPU time (user + system) this process has used so far.
// Per event, it is what the machine's other load cannot inflate (unlike
// wall time on a shared box), so it tells the pipeline's own overhead.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// startProfile writes a CPU profile of the measured part of one iteration
// to $GRASP_BENCH_CPUPROFILE (the iteration's number appended), so that
// the set-up and the store's close, which -cpuprofile would include, do not
// blur where the ingester's time goes.
func startProfile(b *testing.B) (stop func()) {
	path := os.Getenv("GRASP_BENCH_CPUPROFILE")
	if path == "" {
		return func() {}
	}
	profiles++
	f, err := os.Create(fmt.Sprintf("%s.%d", path, profiles))
	if err != nil {
		b.Fatal(err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		b.Fatal(err)
	}
	return func() {
		pprof.StopCPUProfile()
		f.Close()
	}
}

var profiles int

// BenchmarkIngest is end-to-end ingestion on the embedded store: the
// events are already in GRASP_EVENTS (the fetcher's part is not measured);
// one iteration runs a fresh ingester with one worker per GOMAXPROCS until
// all are stored. Run with -cpu 1,2.
//
// Each iteration also verifies the same events the raw way (as
// BenchmarkVerify does) just before and just after ingesting them, and
// ratio-% is ingest throughput over that verification throughput: on a VM
// whose speed drifts by a quarter from one minute to the next, a ratio of
// two benchmarks run a minute apart measures the drift as much as the
// ingester.
func BenchmarkIngest(b *testing.B) {
	w := workloadFor(b, benchSpec)
	evts := decodeAll(b, w)
	if len(evts) != len(w.accepted) {
		b.Fatalf("%d deliveries, %d to store: the ratio needs a workload of valid events only", len(evts), len(w.accepted))
	}
	var total, cpu, vWall, vCPU time.Duration
	for range b.N {
		b.StopTimer()
		e := newEnv(b)
		e.inProcess = true // graspd's embedded deployment
		e.publish(b, w.deliveries)
		// The deployed defaults (fetch batch 256, 30 s ack wait), not the
		// fault tests' small batches.
		cfg := ingester.Config{Consumer: "ingester"}
		vw, vc := verifyAll(b, evts)
		stopProfile := startProfile(b)
		b.StartTimer()
		start, cpu0 := time.Now(), cpuTime()
		r := e.start(b, cfg, nil)
		deadline := time.Now().Add(5 * time.Minute)
		for r.ing.Stats().Stored < int64(len(w.accepted)) {
			if time.Now().After(deadline) {
				b.Fatalf("stored %d of %d", r.ing.Stats().Stored, len(w.accepted))
			}
			time.Sleep(time.Millisecond)
		}
		total += time.Since(start)
		cpu += cpuTime() - cpu0
		b.StopTimer()
		stopProfile()
		r.kill(b)
		vw2, vc2 := verifyAll(b, evts)
		vWall, vCPU = vWall+(vw+vw2)/2, vCPU+(vc+vc2)/2
	}
	n := float64(b.N * len(w.accepted))
	b.ReportMetric(n/total.Seconds(), "events/s")
	b.ReportMetric(float64(cpu.Microseconds())/n, "cpu-µs/event")
	b.ReportMetric(float64(b.N*len(evts))/vWall.Seconds(), "verify-events/s")
	b.ReportMetric(float64(vCPU.Microseconds())/float64(b.N*len(evts)), "verify-cpu-µs/event")
	b.ReportMetric(100*(n/total.Seconds())/(float64(b.N*len(evts))/vWall.Seconds()), "ratio-%")
	b.ReportMetric(100*(float64(vCPU)/float64(b.N*len(evts)))/(float64(cpu)/n), "cpu-ratio-%")
}
