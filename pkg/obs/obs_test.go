package obs_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strconv"
	"strings"
	"testing"

	"github.com/grasp-sync/grasp-sync/pkg/obs"
)

func TestServerEndpoints(t *testing.T) {
	s := obs.NewServer(obs.NewRegistry())
	ready := errors.New("not connected")
	s.AddReadiness("nats", func() error { return ready })
	if err := s.Listen("GRASP_METRICS_ADDR", "127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Serve(ctx) }()
	defer func() { cancel(); <-done }()

	get := func(path string) (int, string) {
		resp, err := http.Get("http://" + s.Addr() + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, _ := get("/healthz"); code != 200 {
		t.Errorf("/healthz = %d", code)
	}
	if code, body := get("/readyz"); code != 503 || !strings.Contains(body, "nats: not connected") {
		t.Errorf("/readyz = %d %q, want 503 naming the failed check", code, body)
	}
	ready = nil
	if code, _ := get("/readyz"); code != 200 {
		t.Errorf("/readyz after ready = %d", code)
	}
	if code, body := get("/metrics"); code != 200 || !strings.Contains(body, "go_goroutines") {
		t.Errorf("/metrics = %d", code)
	}
	// A forced collection (what graspd's guard does when it goes quiet)
	// is counted, so a reader can see that graspd settled into rest.
	forced := func() float64 {
		_, body := get("/metrics")
		for _, line := range strings.Split(body, "\n") {
			if v, ok := strings.CutPrefix(line, "go_gc_cycles_forced_gc_cycles_total "); ok {
				f, err := strconv.ParseFloat(v, 64)
				if err != nil {
					t.Fatal(err)
				}
				return f
			}
		}
		t.Fatal("no go_gc_cycles_forced_gc_cycles_total in /metrics")
		return 0
	}
	before := forced()
	runtime.GC()
	if after := forced(); after != before+1 {
		t.Errorf("forced collections %v after one more than %v", after, before)
	}
}

func TestListenTakenPortNamesVariable(t *testing.T) {
	a := obs.NewServer(obs.NewRegistry())
	if err := a.Listen("GRASP_METRICS_ADDR", "127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	b := obs.NewServer(obs.NewRegistry())
	err := b.Listen("GRASP_METRICS_ADDR", a.Addr())
	if err == nil || !strings.HasPrefix(err.Error(), "GRASP_METRICS_ADDR="+a.Addr()) {
		t.Fatalf("err = %v", err)
	}
}

// TestPprofOnlyWhenEnabled: the runtime's profiles are served only when asked
// for (GRASP_PPROF), never by default.
func TestPprofOnlyWhenEnabled(t *testing.T) {
	for _, enabled := range []bool{false, true} {
		s := obs.NewServer(obs.NewRegistry())
		if enabled {
			s.EnablePprof()
		}
		req := httptest.NewRequest(http.MethodGet, "/debug/pprof/heap", nil)
		rec := httptest.NewRecorder()
		s.Handler().ServeHTTP(rec, req)
		if got := rec.Code == http.StatusOK; got != enabled {
			t.Errorf("pprof enabled=%v: GET /debug/pprof/heap answered %d", enabled, rec.Code)
		}
	}
}
