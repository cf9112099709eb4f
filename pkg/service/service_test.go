package service

import (
	"context"
	"runtime/debug"
	"strings"
	"testing"
)

// A set-up timeout that cannot be met is a configuration mistake: one line
// naming the variable, before anything is dialled or served.
func TestSetupTimeoutMustBePositive(t *testing.T) {
	t.Setenv("GRASP_NATS_SETUP_TIMEOUT", "0s")
	t.Setenv("GRASP_METRICS_ADDR", "127.0.0.1:0")
	ran := false
	err := mainErr("test", nil, func(context.Context, *Env) error { ran = true; return nil })
	if err == nil || ran {
		t.Fatalf("mainErr = %v (ran %v), want a refusal", err, ran)
	}
	if msg := err.Error(); !strings.Contains(msg, "GRASP_NATS_SETUP_TIMEOUT") || strings.Contains(msg, "\n") {
		t.Fatalf("error %q: want one line naming GRASP_NATS_SETUP_TIMEOUT", msg)
	}
}

// The NATS security variables are read (bus.Security is embedded in Common)
// and checked before anything is dialled.
func TestNATSSecurityVariablesAreRead(t *testing.T) {
	missing := t.TempDir() + "/ca.pem"
	t.Setenv("GRASP_NATS_CA", missing)
	t.Setenv("GRASP_METRICS_ADDR", "127.0.0.1:0")
	err := mainErr("test", nil, func(context.Context, *Env) error { return nil })
	if err == nil || !strings.Contains(err.Error(), "GRASP_NATS_CA="+missing) {
		t.Fatalf("mainErr = %v, want one line naming GRASP_NATS_CA", err)
	}
}

// A log format nobody knows is a configuration mistake: one line naming
// GRASP_LOG_FORMAT, before anything is dialled or served.
func TestLogFormatMustBeKnown(t *testing.T) {
	t.Setenv("GRASP_LOG_FORMAT", "xml")
	t.Setenv("GRASP_NATS_URL", "nats://127.0.0.1:1")
	t.Setenv("GRASP_METRICS_ADDR", "127.0.0.1:0")
	ran := false
	err := mainErr("test", nil, func(context.Context, *Env) error { ran = true; return nil })
	if err == nil || ran {
		t.Fatalf("mainErr = %v (ran %v), want a refusal", err, ran)
	}
	if msg := err.Error(); !strings.Contains(msg, "GRASP_LOG_FORMAT") || strings.Contains(msg, "\n") {
		t.Fatalf("error %q: want one line naming GRASP_LOG_FORMAT", msg)
	}
}

// A memory limit that is not a size is a configuration mistake: one line
// naming GRASP_MEMORY_LIMIT, before anything is dialled or served.
func TestMemoryLimitMustBeASize(t *testing.T) {
	t.Setenv("GRASP_MEMORY_LIMIT", "256 megs")
	t.Setenv("GRASP_NATS_URL", "nats://127.0.0.1:1")
	t.Setenv("GRASP_METRICS_ADDR", "127.0.0.1:0")
	ran := false
	err := mainErr("test", nil, func(context.Context, *Env) error { ran = true; return nil })
	if err == nil || ran {
		t.Fatalf("mainErr = %v (ran %v), want a refusal", err, ran)
	}
	if msg := err.Error(); !strings.HasPrefix(msg, `GRASP_MEMORY_LIMIT="256 megs"`) || strings.Contains(msg, "\n") {
		t.Fatalf("error %q: want one line naming GRASP_MEMORY_LIMIT", msg)
	}
}

// GRASP_MEMORY_LIMIT becomes the runtime's soft memory limit before the
// service connects anywhere (here NATS is unreachable, so mainErr fails
// after applying it).
func TestMemoryLimitIsApplied(t *testing.T) {
	old := debug.SetMemoryLimit(-1)
	t.Cleanup(func() { debug.SetMemoryLimit(old) })
	t.Setenv("GRASP_MEMORY_LIMIT", "300MiB")
	t.Setenv("GRASP_NATS_URL", "nats://127.0.0.1:1")
	t.Setenv("GRASP_NATS_SETUP_TIMEOUT", "1s")
	t.Setenv("GRASP_METRICS_ADDR", "127.0.0.1:0")
	_ = mainErr("test", nil, func(context.Context, *Env) error { return nil })
	if got := debug.SetMemoryLimit(-1); got != 300<<20 {
		t.Fatalf("runtime memory limit %d, want %d", got, 300<<20)
	}
}
