package config_test

import (
	"runtime/debug"
	"testing"

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
