package config_test

import (
	"context"
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

func TestGuardedMemoryLimit(t *testing.T) {
	for _, tc := range []struct{ base, live, want int64 }{
		{base: 160 << 20, live: 0, want: 160 << 20},
		{base: 160 << 20, live: 100 << 20, want: 160 << 20},
		// A live heap past two thirds of the base lifts the limit: the
		// heap may always grow by half of what is live.
		{base: 160 << 20, live: 200 << 20, want: 300 << 20},
	} {
		if got := config.GuardedMemoryLimit(tc.base, tc.live); got != tc.want {
			t.Errorf("GuardedMemoryLimit(%d, %d) = %d, want %d", tc.base, tc.live, got, tc.want)
		}
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
	// least 1.5 times that after a collection.
	live := make([]byte, 64<<20)
	runtime.GC()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { config.GuardMemoryLimit(ctx, 1<<20, time.Millisecond); close(done) }()
	deadline := time.Now().Add(10 * time.Second)
	for debug.SetMemoryLimit(-1) < 96<<20 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	cancel()
	<-done
	if got := debug.SetMemoryLimit(-1); got < 96<<20 {
		t.Errorf("limit %d with a live heap of 64 MiB, want at least %d", got, 96<<20)
	}
	runtime.KeepAlive(live)
}
