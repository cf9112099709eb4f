package config_test

import (
	"context"
	"math"
	"runtime"
	"runtime/debug"
	"testing"
	"time"

	"github.com/grasp-sync/grasp-sync/pkg/config"
)

func TestParseByteSize(t *testing.T) {
	tests := []struct {
		in      string
		want    config.ByteSize
		wantErr bool
	}{
		{in: "", want: 0},
		{in: "0", want: 0},
		{in: "1048576", want: 1 << 20},
		{in: "256MiB", want: 256 << 20},
		{in: "256mib", want: 256 << 20},
		{in: "1GiB", want: 1 << 30},
		{in: " 1 GiB ", want: 1 << 30},
		{in: "512KiB", want: 512 << 10},
		{in: "500MB", want: 500_000_000},
		{in: "2kb", want: 2000},
		{in: "100B", want: 100},
		{in: "1.5GiB", wantErr: true},
		{in: "-1MiB", wantErr: true},
		{in: "lots", wantErr: true},
		{in: "MiB", wantErr: true},
		{in: "9999999TiB", wantErr: true},
	}
	for _, tt := range tests {
		got, err := config.ParseByteSize(tt.in)
		if (err != nil) != tt.wantErr || got != tt.want {
			t.Errorf("ParseByteSize(%q) = %d, %v; want %d, error %v", tt.in, got, err, tt.want, tt.wantErr)
		}
	}
}

func TestByteSizeString(t *testing.T) {
	for in, want := range map[config.ByteSize]string{0: "0B", 256 << 20: "256MiB", 1 << 30: "1GiB", 1536 << 20: "1536MiB", 1000: "1000B"} {
		if got := in.String(); got != want {
			t.Errorf("%d.String() = %q, want %q", int64(in), got, want)
		}
	}
}

type memSpec struct {
	MemoryLimit config.ByteSize `envconfig:"MEMORY_LIMIT"`
}

func TestLoadByteSizeNamesTheVariable(t *testing.T) {
	t.Setenv("GRASP_MEMORY_LIMIT", "a lot")
	var s memSpec
	err := config.Load(&s)
	want := `GRASP_MEMORY_LIMIT="a lot": want a whole number of bytes with an optional unit, such as 256MiB or 1GiB`
	if err == nil || err.Error() != want {
		t.Fatalf("err = %v, want %s", err, want)
	}
	t.Setenv("GRASP_MEMORY_LIMIT", "256MiB")
	if err := config.Load(&s); err != nil || s.MemoryLimit != 256<<20 {
		t.Fatalf("Load = %v, %d; want 256MiB", err, s.MemoryLimit)
	}
}

func TestApplyMemoryLimit(t *testing.T) {
	old := debug.SetMemoryLimit(-1)
	t.Cleanup(func() { debug.SetMemoryLimit(old) })
	debug.SetMemoryLimit(1<<63 - 1)
	if n, src := config.ApplyMemoryLimit(0); n != 0 || src != "none" {
		t.Errorf("unset: %d from %s, want none", n, src)
	}
	if n, src := config.ApplyMemoryLimit(300 << 20); n != 300<<20 || src != "GRASP_MEMORY_LIMIT" {
		t.Errorf("set: %d from %s", n, src)
	}
	if got := debug.SetMemoryLimit(-1); got != 300<<20 {
		t.Errorf("runtime limit %d, want %d", got, 300<<20)
	}
	// Unset afterwards keeps what the runtime has (as GOMEMLIMIT would).
	if n, src := config.ApplyMemoryLimit(0); n != 300<<20 || src != "GOMEMLIMIT" {
		t.Errorf("runtime's own: %d from %s", n, src)
	}
}

func TestApplyDefaultMemoryLimit(t *testing.T) {
	old := debug.SetMemoryLimit(-1)
	t.Cleanup(func() { debug.SetMemoryLimit(old) })
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	t.Setenv("GOMEMLIMIT", "")
	debug.SetMemoryLimit(1<<63 - 1)
	if n, src := config.ApplyDefaultMemoryLimit(ctx, 0, 160<<20); n != 160<<20 || src != "default" {
		t.Errorf("unset: %d from %s, want the default", n, src)
	}
	if got := debug.SetMemoryLimit(-1); got < 160<<20 || got == 1<<63-1 {
		t.Errorf("runtime limit %d, want at least the default %d", got, 160<<20)
	}
	if n, src := config.ApplyDefaultMemoryLimit(ctx, 300<<20, 160<<20); n != 300<<20 || src != "GRASP_MEMORY_LIMIT" {
		t.Errorf("set: %d from %s, want GRASP_MEMORY_LIMIT's", n, src)
	}
	// GOMEMLIMIT (off included) wins over the default: what the runtime read.
	t.Setenv("GOMEMLIMIT", "off")
	debug.SetMemoryLimit(1<<63 - 1)
	if n, src := config.ApplyDefaultMemoryLimit(ctx, 0, 160<<20); n != 0 || src != "none" {
		t.Errorf("GOMEMLIMIT=off: %d from %s, want none", n, src)
	}
}

func TestGuardMemoryLimitRaisesWithTheLiveHeap(t *testing.T) {
	old := debug.SetMemoryLimit(-1)
	t.Cleanup(func() { debug.SetMemoryLimit(old) })
	// Keep a live heap of 64 MiB; a base of 1 MiB must be raised to at
	// least the collector's own goal (twice that, GOGC=100) after a
	// collection.
	live := make([]byte, 64<<20)
	runtime.GC()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { config.GuardMemoryLimit(ctx, 1<<20, time.Millisecond); close(done) }()
	deadline := time.Now().Add(10 * time.Second)
	for debug.SetMemoryLimit(-1) < 128<<20 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	cancel()
	<-done
	if got := debug.SetMemoryLimit(-1); got < 128<<20 {
		t.Errorf("limit %d with a live heap of 64 MiB, want at least %d", got, 128<<20)
	}
	runtime.KeepAlive(live)
}

// TestGuardedLimitDoesNotMakeTheCollectorBusier: with a live heap near the
// base, the guarded limit must let the collector run about as often as
// GOGC=100 alone does. The old guard (1.5 × live heap, stacks and runtime
// memory not counted) ran it more than twice as often; at rest in graspd that
// was most of its CPU (docs/decisions.md, "A default soft memory limit for
// graspd").
// garbageSink keeps the churn's allocations on the heap.
var garbageSink []byte

func TestGuardedLimitDoesNotMakeTheCollectorBusier(t *testing.T) {
	old := debug.SetMemoryLimit(-1)
	t.Cleanup(func() { debug.SetMemoryLimit(old) })
	live := make([][]byte, 64)
	for i := range live {
		live[i] = make([]byte, 1<<20)
	}
	churn := func() uint32 {
		runtime.GC()
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		before := ms.NumGC
		for range 16 << 10 { // 1 GiB of garbage in 64 KiB pieces
			garbageSink = make([]byte, 64<<10)
		}
		runtime.ReadMemStats(&ms)
		return ms.NumGC - before
	}
	debug.SetMemoryLimit(math.MaxInt64)
	unlimited := churn()

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { config.GuardMemoryLimit(ctx, 1<<20, time.Millisecond); close(done) }()
	deadline := time.Now().Add(10 * time.Second)
	for debug.SetMemoryLimit(-1) < 128<<20 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	guarded := churn()
	t.Logf("limit in force %d MiB", debug.SetMemoryLimit(-1)>>20)
	cancel()
	<-done
	t.Logf("collections for 1 GiB of garbage over a 64 MiB live heap: %d without a limit, %d guarded", unlimited, guarded)
	if guarded > unlimited+unlimited/2+2 {
		t.Errorf("guarded limit: %d collections, without a limit %d: the limit makes the collector run more than GOGC", guarded, unlimited)
	}
	runtime.KeepAlive(live)
}

func TestGuardedMemoryLimit(t *testing.T) {
	const mb = 1 << 20
	tests := []struct {
		name  string
		base  int64
		s     config.MemorySample
		boost float64
		want  int64
	}{
		{"small heap keeps the base", 160 * mb, config.MemorySample{Live: 20 * mb, Other: 30 * mb, GOGC: 100}, 1, 160 * mb},
		{"live heap at the base: the GOGC goal plus the rest", 160 * mb, config.MemorySample{Live: 130 * mb, Other: 40 * mb, GOGC: 100}, 1, 300 * mb},
		{"a larger GOGC is honoured", 10 * mb, config.MemorySample{Live: 100 * mb, GOGC: 200}, 1, 300 * mb},
		{"GOGC off or lower counts as 100", 10 * mb, config.MemorySample{Live: 100 * mb, GOGC: 0}, 1, 200 * mb},
		{"boost raises the goal", 10 * mb, config.MemorySample{Live: 100 * mb, Other: 10 * mb, GOGC: 100}, 2, 410 * mb},
		{"boost under 1 counts as 1", 10 * mb, config.MemorySample{Live: 100 * mb, GOGC: 100}, 0.5, 200 * mb},
	}
	for _, tc := range tests {
		if got := config.GuardedMemoryLimit(tc.base, tc.s, tc.boost); got != tc.want {
			t.Errorf("%s: %d MiB, want %d MiB", tc.name, got/mb, tc.want/mb)
		}
	}
}

func TestNextBoost(t *testing.T) {
	tests := []struct{ boost, share, want float64 }{
		{1, 0.30, 2},
		{4, 0.30, 8},
		{8, 0.50, 8},
		{8, 0.01, 4},
		{1, 0.01, 1},
		{4, 0.05, 4},
	}
	for _, tc := range tests {
		if got := config.NextBoost(tc.boost, tc.share); got != tc.want {
			t.Errorf("NextBoost(%v, %v) = %v, want %v", tc.boost, tc.share, got, tc.want)
		}
	}
}
