package e2e

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"
)

// A child process of a multi-process Deployment (multiproc.go): started,
// killed with SIGKILL and started again with the same binary, arguments and
// environment, its output appended to one log.

// Proc is one child process of a Deployment: a binary with its arguments
// and environment that can be killed (SIGKILL) and started again with the
// same ones. Its stdout and stderr go to Log, appended across restarts.
type Proc struct {
	// Name identifies the process in logs and reports (planner, fetcher-1, nats-2).
	Name string
	// Log is the path of its log file.
	Log string
	// HealthURL answers 200 once the process is ready (/readyz of a
	// service, /healthz of a NATS node's monitor).
	HealthURL string
	// MetricsAddr serves /metrics; empty for NATS nodes.
	MetricsAddr string
	// ProfAddr serves /debug/pprof/ (DeploymentOptions.Profile); empty
	// when the process is not profiled.
	ProfAddr string

	bin  string
	args []string
	env  []string

	mu  sync.Mutex
	cur *procRun
}

// procRun is one run of a Proc: the child and its exit.
type procRun struct {
	cmd    *exec.Cmd
	exited chan struct{} // closed once cmd.Wait returned
	err    error         // cmd.Wait's result, set before exited closes
}

// Start starts the process (it must not be running).
func (p *Proc) Start() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cur != nil {
		select {
		case <-p.cur.exited:
		default:
			return fmt.Errorf("start %s: already running (pid %d)", p.Name, p.cur.cmd.Process.Pid)
		}
	}
	f, err := os.OpenFile(p.Log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("start %s: log: %w", p.Name, err)
	}
	cmd := exec.Command(p.bin, p.args...)
	cmd.Env = p.env
	cmd.Stdout, cmd.Stderr = f, f
	// The child dies with the test process even when the test binary is
	// killed before its cleanups run: no leftovers.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	fmt.Fprintf(f, "=== e2e: start %s at %s\n", p.Name, time.Now().Format(time.RFC3339Nano))
	if err := cmd.Start(); err != nil {
		_ = f.Close()
		return fmt.Errorf("start %s: %w", p.Name, err)
	}
	r := &procRun{cmd: cmd, exited: make(chan struct{})}
	p.cur = r
	// The waiter is owned by the run: it ends when the child does, which
	// Kill (and the deployment's cleanup) guarantees.
	go func() {
		r.err = cmd.Wait()
		_ = f.Close()
		close(r.exited)
	}()
	return nil
}

// Running reports whether the process is started and has not exited.
func (p *Proc) Running() bool {
	p.mu.Lock()
	r := p.cur
	p.mu.Unlock()
	if r == nil {
		return false
	}
	select {
	case <-r.exited:
		return false
	default:
		return true
	}
}

// Pid is the current run's process id (0 when not started).
func (p *Proc) Pid() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cur == nil {
		return 0
	}
	return p.cur.cmd.Process.Pid
}

// Kill sends SIGKILL (no drain, no goodbye: kill -9) and waits for the
// process to be gone. Killing a process that is not running is a no-op.
func (p *Proc) Kill() error {
	p.mu.Lock()
	r := p.cur
	p.mu.Unlock()
	if r == nil {
		return nil
	}
	select {
	case <-r.exited:
		return nil
	default:
	}
	if err := r.cmd.Process.Signal(syscall.SIGKILL); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("kill %s: %w", p.Name, err)
	}
	select {
	case <-r.exited:
	case <-time.After(10 * time.Second):
		return fmt.Errorf("kill %s: still running 10s after SIGKILL", p.Name)
	}
	if f, err := os.OpenFile(p.Log, os.O_WRONLY|os.O_APPEND, 0o644); err == nil {
		fmt.Fprintf(f, "=== e2e: killed %s (SIGKILL) at %s\n", p.Name, time.Now().Format(time.RFC3339Nano))
		_ = f.Close()
	}
	return nil
}

// WaitReady polls HealthURL until it answers 200, the process exits (an
// error quoting the end of its log) or ctx ends.
func (p *Proc) WaitReady(ctx context.Context) error {
	for {
		p.mu.Lock()
		r := p.cur
		p.mu.Unlock()
		if r == nil {
			return fmt.Errorf("%s: not started", p.Name)
		}
		select {
		case <-r.exited:
			return fmt.Errorf("%s exited during start (%v); log ends:\n%s", p.Name, r.err, Tail(p.Log, 20))
		default:
		}
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, p.HealthURL, nil)
		if err != nil {
			return err
		}
		if resp, err := http.DefaultClient.Do(req); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s not ready at %s: %w; log ends:\n%s", p.Name, p.HealthURL, ctx.Err(), Tail(p.Log, 20))
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// Restart starts the process again (after Kill) and waits until it is
// ready, for at most a minute.
func (p *Proc) Restart() error {
	if err := p.Start(); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	return p.WaitReady(ctx)
}

// Tail returns the last n lines of the file at path (or why it cannot).
func Tail(path string, n int) string {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Sprintf("(%v)", err)
	}
	defer f.Close()
	var lines []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 4<<20)
	for sc.Scan() {
		lines = append(lines, sc.Text())
		if len(lines) > n {
			lines = lines[1:]
		}
	}
	return strings.Join(lines, "\n")
}

// processEnv is the environment of a child: this process's, without any
// GRASP_* variable (the test's own settings must not leak in), plus env
// and extra.
func processEnv(env, extra Env) []string {
	var out []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "GRASP_") {
			out = append(out, kv)
		}
	}
	for _, m := range []Env{env, extra} {
		for k, v := range m {
			out = append(out, k+"="+v)
		}
	}
	return out
}
