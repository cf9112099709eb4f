// Package obs is what every service needs to be watched: a slog logger (text
// at a terminal, JSON otherwise), a Prometheus registry, and an HTTP server
// for /metrics, /healthz and /readyz, plus a context that ends on SIGINT or
// SIGTERM, and the build's version with the command line every binary
// answers (--version, --help).
package obs

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"os/signal"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// NewLogger returns a JSON logger at the given level (debug, info, warn,
// error; anything else is info). Binaries use NewLoggerFor, which also
// picks the format.
func NewLogger(w io.Writer, level string) *slog.Logger {
	return slog.New(slog.NewJSONHandler(w, &slog.HandlerOptions{Level: parseLevel(level)}))
}

func parseLevel(level string) slog.Level {
	switch strings.ToLower(level) {
	case "debug":
		return slog.LevelDebug
	case "warn":
		return slog.LevelWarn
	case "error":
		return slog.LevelError
	}
	return slog.LevelInfo
}

// NewRegistry returns a Prometheus registry with the Go and process
// collectors, so every service exposes its runtime health. The Go
// collector adds the CPU the garbage collector took
// (go_cpu_classes_gc_total_cpu_seconds_total, of
// go_cpu_classes_total_cpu_seconds_total: GOMAXPROCS over wall time), so
// the collector's share at rest is visible beside the memory limit
// (go_gc_gomemlimit_bytes; docs/decisions/0065-work-in-flight-bounded-by-bytes.md).
// It also counts the collections the process forced
// (go_gc_cycles_forced_gc_cycles_total): graspd forces one when it goes
// quiet, to return its free heap (config.IdleTrim), so a reader can tell
// when graspd has settled into rest.
func NewRegistry() *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(
		collectors.NewGoCollector(collectors.WithGoCollectorRuntimeMetrics(collectors.GoRuntimeMetricsRule{
			Matcher: regexp.MustCompile(`^(/cpu/classes/(total|gc/total|gc/mark/idle):cpu-seconds|/gc/cycles/forced:gc-cycles)$`),
		})),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return reg
}

// SignalContext returns a context cancelled on SIGINT or SIGTERM, for
// graceful shutdown.
func SignalContext(parent context.Context) (context.Context, context.CancelFunc) {
	return signal.NotifyContext(parent, os.Interrupt, syscall.SIGTERM)
}

// Server serves /metrics, /healthz and /readyz.
type Server struct {
	Registry *prometheus.Registry

	mu     sync.Mutex
	checks map[string]func() error
	root   http.Handler
	pprof  bool
	ln     net.Listener
	srv    *http.Server
}

// NewServer creates the server; Listen binds it.
func NewServer(reg *prometheus.Registry) *Server {
	return &Server{Registry: reg, checks: map[string]func() error{}}
}

// AddReadiness registers a check that must return nil for /readyz to say
// ready (for example: connected to NATS, self-subscription live).
func (s *Server) AddReadiness(name string, check func() error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.checks[name] = check
}

// SetRoot serves h for every path other than /metrics, /healthz and
// /readyz (graspd's status page when it runs no relay of its own).
func (s *Server) SetRoot(h http.Handler) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.root = h
}

// EnablePprof serves the Go runtime's profiles under /debug/pprof/ (heap,
// goroutine, CPU…) beside /metrics; call before Listen. Off by default: a
// profile shows what the process holds, so only an operator asks for it.
func (s *Server) EnablePprof() { s.pprof = true }

// Ready runs every readiness check and returns the failures.
func (s *Server) Ready() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	var errs []error
	for name, check := range s.checks {
		if err := check(); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", name, err))
		}
	}
	return errors.Join(errs...)
}

// Handler returns the HTTP handler, for embedding into another mux.
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(s.Registry, promhttp.HandlerOpts{Registry: s.Registry}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, r *http.Request) {
		if err := s.Ready(); err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ready")
	})
	if s.pprof {
		mux.HandleFunc("/debug/pprof/", pprof.Index)
		mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
		mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
		mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	}
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		s.mu.Lock()
		root := s.root
		s.mu.Unlock()
		if root == nil {
			http.NotFound(w, r)
			return
		}
		root.ServeHTTP(w, r)
	})
	return mux
}

// Listen binds addr, so a taken port is reported at start. varName is the
// configuration variable the address came from, named in the error.
func (s *Server) Listen(varName, addr string) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("%s=%s: cannot listen: %w", varName, addr, err)
	}
	s.ln = ln
	s.srv = &http.Server{Handler: s.Handler(), ReadHeaderTimeout: 10 * time.Second}
	return nil
}

// Addr is the bound address (after Listen).
func (s *Server) Addr() string { return s.ln.Addr().String() }

// Serve serves until ctx is done, then shuts down gracefully.
func (s *Server) Serve(ctx context.Context) error {
	return ServeHTTP(ctx, s.srv, s.ln)
}

// ServeHTTP runs srv on ln until ctx is done, then shuts it down with a
// bounded grace period.
func ServeHTTP(ctx context.Context, srv *http.Server, ln net.Listener) error {
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
		shutdownCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(shutdownCtx)
		<-errc
		return nil
	}
}

// LineWriter adapts a library's unstructured log output (the standard
// logger) to slog: each write becomes one debug record with the text under
// "msg" and the source named by the "lib" attribute.
func LineWriter(log *slog.Logger, lib string) io.Writer {
	return lineWriter{log: log.With("lib", lib)}
}

type lineWriter struct{ log *slog.Logger }

func (w lineWriter) Write(p []byte) (int, error) {
	w.log.Debug(strings.TrimSpace(string(p)))
	return len(p), nil
}

// Version and Commit identify the build; `make build` and the images stamp
// them with -ldflags -X.
var (
	Version = "dev"
	Commit  = "unknown"
)
