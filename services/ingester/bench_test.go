package ingester_test

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"runtime"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/btcsuite/btcd/btcec/v2/schnorr"
	"github.com/nbd-wtf/go-nostr"

	"github.com/grasp-sync/grasp-sync/pkg/verify"
	"github.com/grasp-sync/grasp-sync/services/ingester"
)

// benchSpec is the benchmark's workload: valid events only (announcements,
// issues, comments), so every event pays for verification, policy lookups
// and a store write.
var benchSpec = workloadSpec{repos: 40, issuesPerRepo: 40, commentsPerIssue: 11}

// fetcherPublishBatch is the fetcher's PublishBatch (fetcher.Config):
// how many events one events-stream message carries at most in a
// deployment (the fetcher is another module; keep the two equal).
const fetcherPublishBatch = 64

// BenchmarkVerify is the raw signature verification rate (CheckID +
// CheckSignature, what policy.Evaluate does first) on GOMAXPROCS cores, the
// ceiling the ingester is measured against, with the verifier compiled in
// (pkg/verify names it). Run with -cpu 1,2.
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

// BenchmarkVerifyPureGo is BenchmarkVerify with go-nostr's pure-Go
// verifier called directly, whichever verifier the build compiled in.
func BenchmarkVerifyPureGo(b *testing.B) {
	evts := decodeAll(b, workloadFor(b, benchSpec))
	b.ResetTimer()
	var wall, cpu time.Duration
	for range b.N {
		w, c := verifyAllWith(b, evts, checkPureGo)
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
	return verifyAllWith(b, evts, (*nostr.Event).CheckSignature)
}

// checkPureGo is go-nostr's pure-Go CheckSignature (btcec's BIP-340
// verification, what a CGO_ENABLED=0 build runs), called directly so that
// a libsecp256k1 build measures both verifiers in the same run.
func checkPureGo(evt *nostr.Event) (bool, error) {
	pk, err := hex.DecodeString(evt.PubKey)
	if err != nil {
		return false, err
	}
	pubkey, err := schnorr.ParsePubKey(pk)
	if err != nil {
		return false, err
	}
	s, err := hex.DecodeString(evt.Sig)
	if err != nil {
		return false, err
	}
	sig, err := schnorr.ParseSignature(s)
	if err != nil {
		return false, err
	}
	hash := sha256.Sum256(evt.Serialize())
	return sig.Verify(hash[:], pubkey), nil
}

// verifyAllWith is verifyAll with the given signature check.
func verifyAllWith(b *testing.B, evts []*nostr.Event, check func(*nostr.Event) (bool, error)) (wall, cpu time.Duration) {
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
				if ok, err := check(e); !ok || err != nil {
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
//
// The verification it measures against is the one compiled in (reported
// as libsecp256k1-verify-… or purego-verify-… too, see pkg/verify); the
// pure-Go verifier is also run directly beside it (purego-verify-…), so a
// libsecp256k1 build shows both side by side.
func BenchmarkIngest(b *testing.B) {
	w := workloadFor(b, benchSpec)
	evts := decodeAll(b, w)
	if len(evts) != len(w.accepted) {
		b.Fatalf("%d deliveries, %d to store: the ratio needs a workload of valid events only", len(evts), len(w.accepted))
	}
	var total, cpu, vWall, vCPU, pWall, pCPU time.Duration
	backend := ""
	for range b.N {
		b.StopTimer()
		e := newEnv(b)
		backend = e.raw.Backend()
		e.inProcess = true // graspd's embedded deployment
		// As the fetcher publishes them on its defaults (a page's events
		// in one message, its PublishBatch): the format the ingester
		// reads in a deployment (docs/decisions/0053-events-travel-in-batches.md). BenchmarkIngestMessages compares it with one event per
		// message.
		e.publishBatched(b, w.deliveries, fetcherPublishBatch)
		// The deployed defaults (fetch batch 256, 30 s ack wait), not the
		// fault tests' small batches.
		cfg := ingester.Config{Consumer: "ingester"}
		vw, vc := verifyAll(b, evts)
		stopProfile := startProfile(b)
		b.StartTimer()
		r, wall, used := e.ingestAll(b, cfg, len(w.accepted))
		total += wall
		cpu += used
		b.StopTimer()
		stopProfile()
		r.kill(b)
		vw2, vc2 := verifyAll(b, evts)
		vWall, vCPU = vWall+(vw+vw2)/2, vCPU+(vc+vc2)/2
		pw, pc := verifyAllWith(b, evts, checkPureGo)
		pWall, pCPU = pWall+pw, pCPU+pc
	}
	n := float64(b.N * len(w.accepted))
	nv := float64(b.N * len(evts))
	b.Logf("verifier compiled in: %s", verify.Backend())
	b.ReportMetric(nv/pWall.Seconds(), "purego-verify-events/s")
	b.ReportMetric(float64(pCPU.Microseconds())/nv, "purego-verify-cpu-µs/event")
	if verify.Backend() == verify.Libsecp256k1 {
		b.ReportMetric(nv/vWall.Seconds(), "libsecp256k1-verify-events/s")
		b.ReportMetric(float64(vCPU.Microseconds())/nv, "libsecp256k1-verify-cpu-µs/event")
		b.ReportMetric(100*(n/total.Seconds())/(nv/pWall.Seconds()), "ratio-to-purego-%")
	}
	b.ReportMetric(n/total.Seconds(), "events/s")
	b.ReportMetric(float64(cpu.Microseconds())/n, "cpu-µs/event")
	b.ReportMetric(float64(b.N*len(evts))/vWall.Seconds(), "verify-events/s")
	b.ReportMetric(float64(vCPU.Microseconds())/float64(b.N*len(evts)), "verify-cpu-µs/event")
	b.ReportMetric(100*(n/total.Seconds())/(float64(b.N*len(evts))/vWall.Seconds()), "ratio-%")
	b.ReportMetric(100*(float64(vCPU)/float64(b.N*len(evts)))/(float64(cpu)/n), "cpu-ratio-%")
	// Issue 17 §1's row (issue 24's first target), collected by make bench:
	// one per -cpu value.
	if !finalRun(b) {
		return
	}
	ratio := 100 * (n / total.Seconds()) / (float64(b.N*len(evts)) / vWall.Seconds())
	verdict := "met"
	if ratio < 50 {
		verdict = "NOT MET"
	}
	fmt.Printf("bench row: ingest on %d core(s), %s store, batches of ≤ %d events, %d run(s): %.0f events/s = %.0f %% of raw %s verification (target ≥ 50 %%) — %s\n",
		runtime.GOMAXPROCS(0), backend, fetcherPublishBatch, b.N, n/total.Seconds(), ratio, verify.Backend(), verdict)
}

// finalRun reports whether this invocation of a benchmark function is the
// one its results are reported for. With -benchtime Nx the testing package
// calls the function first with b.N = 1, then with b.N = N: a "bench row:"
// printed from both would give two rows per -cpu value, the first from a
// single run. With a duration -benchtime (the rounds grow until it is
// reached) every invocation counts.
func finalRun(b *testing.B) bool {
	f := flag.Lookup("test.benchtime")
	if f == nil {
		return true
	}
	v, ok := strings.CutSuffix(f.Value.String(), "x")
	if !ok {
		return true
	}
	n, err := strconv.Atoi(v)
	return err != nil || b.N >= n
}

// BenchmarkIngestMessages compares the two events-stream formats in one
// run (docs/decisions/0053-events-travel-in-batches.md): the benchmark's
// events published one message per event (the format before batches) and
// in batch messages of 64 events (the fetcher's default), then ingested by
// a fresh ingester on the embedded NATS and store. It reports the CPU of
// the publish (client and embedded server: what the fetcher and JetStream
// spend) and of the ingest per event, and the messages each used. Run with
// -cpu 1,2.
func BenchmarkIngestMessages(b *testing.B) {
	w := workloadFor(b, benchSpec)
	for _, per := range []int{1, fetcherPublishBatch} {
		name := "one-event-per-message"
		if per > 1 {
			name = fmt.Sprintf("batches-of-%d", per)
		}
		b.Run(name, func(b *testing.B) {
			var total, cpu, pubCPU time.Duration
			msgs := 0
			for range b.N {
				b.StopTimer()
				e := newEnv(b)
				e.inProcess = true
				cpu0 := cpuTime()
				if per == 1 {
					e.publish(b, w.deliveries)
					msgs += len(w.deliveries)
				} else {
					msgs += e.publishBatched(b, w.deliveries, per)
				}
				pubCPU += cpuTime() - cpu0
				cfg := ingester.Config{Consumer: "ingester"}
				b.StartTimer()
				r, wall, used := e.ingestAll(b, cfg, len(w.accepted))
				total += wall
				cpu += used
				b.StopTimer()
				r.kill(b)
			}
			n := float64(b.N * len(w.accepted))
			b.ReportMetric(n/total.Seconds(), "events/s")
			b.ReportMetric(float64(cpu.Microseconds())/n, "ingest-cpu-µs/event")
			b.ReportMetric(float64(pubCPU.Microseconds())/n, "publish-cpu-µs/event")
			b.ReportMetric(1000*float64(cpu+pubCPU)/float64(time.Second)/n, "cpu-s/1000-events")
			b.ReportMetric(float64(msgs)/float64(b.N), "messages")
		})
	}
}

// ingestAll starts an ingester on the published stream and waits until it
// has stored want events; it returns the replica (to kill once the timer
// is stopped) and the wall-clock and process CPU time that took.
func (e *env) ingestAll(b *testing.B, cfg ingester.Config, want int) (*replica, time.Duration, time.Duration) {
	start, cpu0 := time.Now(), cpuTime()
	r := e.start(b, cfg, nil)
	deadline := time.Now().Add(5 * time.Minute)
	for r.ing.Stats().Stored < int64(want) {
		if time.Now().After(deadline) {
			b.Fatalf("stored %d of %d", r.ing.Stats().Stored, want)
		}
		time.Sleep(time.Millisecond)
	}
	return r, time.Since(start), cpuTime() - cpu0
}
