package main_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// build compiles graspd once per test binary run.
func build(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "graspd")
	out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// graspdEnv is a clean environment on free ports, plus overrides.
func graspdEnv(t *testing.T, overrides ...string) []string {
	env := []string{
		"PATH=" + os.Getenv("PATH"),
		"HOME=" + os.Getenv("HOME"),
		"GRASP_DATA_DIR=" + t.TempDir(),
		"GRASP_RELAY_ADDR=127.0.0.1:0",
		"GRASP_NATS_LISTEN=127.0.0.1:0",
		"GRASP_METRICS_ADDR=127.0.0.1:0",
	}
	return append(env, overrides...)
}

// Start-up mistakes exit non-zero with one line naming the variable or
// address, and no stack trace.
func TestBadInputExitsWithOneClearLine(t *testing.T) {
	bin := build(t)
	held, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	taken := held.Addr().String()

	tests := []struct {
		name string
		env  []string
		want string
	}{
		{"bad duration", []string{"GRASP_DISCOVERY_BATCH_WINDOW=soon"}, "GRASP_DISCOVERY_BATCH_WINDOW"},
		{"bad number", []string{"GRASP_SHARDS=many"}, "GRASP_SHARDS"},
		{"unknown service", []string{"GRASP_SERVICES=relay,gateway"}, "GRASP_SERVICES"},
		{"unknown log format", []string{"GRASP_LOG_FORMAT=xml"}, "GRASP_LOG_FORMAT"},
		{"bad public url", []string{"GRASP_PUBLIC_URL=https://git.example.com"}, "GRASP_PUBLIC_URL"},
		{"unreachable nats", []string{"GRASP_NATS_URL=nats://127.0.0.1:1"}, "GRASP_NATS_URL"},
		{"relay port taken", []string{"GRASP_RELAY_ADDR=" + taken}, "GRASP_RELAY_ADDR=" + taken},
		{"nats port taken", []string{"GRASP_NATS_LISTEN=" + taken}, "GRASP_NATS_LISTEN=" + taken},
		{"metrics port taken", []string{"GRASP_METRICS_ADDR=" + taken}, "GRASP_METRICS_ADDR=" + taken},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			cmd := exec.CommandContext(ctx, bin)
			cmd.Env = graspdEnv(t, tt.env...)
			var stderr bytes.Buffer
			cmd.Stderr = &stderr
			err := cmd.Run()
			if ctx.Err() != nil {
				t.Fatal("graspd did not exit")
			}
			if err == nil {
				t.Fatal("graspd exited 0")
			}
			out := strings.TrimSpace(stderr.String())
			if strings.Count(out, "\n") != 0 || !strings.Contains(out, tt.want) || strings.Contains(out, "goroutine") {
				t.Fatalf("stderr = %q, want one line naming %s", out, tt.want)
			}
		})
	}
}

// `make run` serves NIP-11 on the default relay address within 10 s.
func TestDefaultsServeNIP11(t *testing.T) {
	for _, addr := range []string{"127.0.0.1:7777", "127.0.0.1:4233", "127.0.0.1:9477"} {
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			t.Skipf("SKIP: default address %s is in use on this machine (%v)", addr, err)
		}
		ln.Close()
	}
	bin := build(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cmd := exec.CommandContext(ctx, bin)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + os.Getenv("HOME")}
	cmd.Dir = t.TempDir() // default GRASP_DATA_DIR=./data lands here
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		_ = cmd.Process.Signal(os.Interrupt)
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		select {
		case <-done:
		case <-time.After(15 * time.Second):
			t.Error("graspd did not stop within 15s of SIGINT")
		}
	}()
	start := time.Now()
	for time.Since(start) < 10*time.Second {
		req, _ := http.NewRequest("GET", "http://127.0.0.1:7777", nil)
		req.Header.Set("Accept", "application/nostr+json")
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 && resp.Header.Get("Content-Type") == "application/nostr+json" {
				t.Logf("NIP-11 served %s after start", time.Since(start).Round(time.Millisecond))
				return
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("no NIP-11 at http://127.0.0.1:7777 within 10s; stderr:\n%s", stderr.String())
}

// graspd logs at start which signature verifier it runs: libsecp256k1 when
// built with the tag (the default of `make build` where cgo and a C
// compiler exist), pure Go when built with CGO_ENABLED=0.
func TestLogsVerifier(t *testing.T) {
	for _, tc := range []struct {
		want string
		env  []string
		args []string
	}{
		{"pure Go", []string{"CGO_ENABLED=0"}, nil},
		{"libsecp256k1", []string{"CGO_ENABLED=1"}, []string{"-tags", "libsecp256k1"}},
	} {
		t.Run(tc.want, func(t *testing.T) {
			if tc.want == "libsecp256k1" {
				cc, _ := exec.Command("go", "env", "CC").Output()
				if _, err := exec.LookPath(strings.TrimSpace(string(cc))); err != nil {
					t.Skipf("SKIP: no C compiler (%q) for the libsecp256k1 build", strings.TrimSpace(string(cc)))
				}
			}
			bin := filepath.Join(t.TempDir(), "graspd")
			cmd := exec.Command("go", append(append([]string{"build"}, tc.args...), "-o", bin, ".")...)
			cmd.Env = append(os.Environ(), tc.env...)
			if out, err := cmd.CombinedOutput(); err != nil {
				t.Fatalf("go build: %v\n%s", err, out)
			}
			if got := startupVerifier(t, bin); got != tc.want {
				t.Fatalf("graspd logged verifier %q, want %q", got, tc.want)
			}
		})
	}
}

// startupVerifier runs bin on free ports until it logs its configuration
// line, and returns that line's verifier field.
func startupVerifier(t *testing.T, bin string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin)
	cmd.Env = graspdEnv(t)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		_ = cmd.Process.Signal(os.Interrupt)
		_ = cmd.Wait()
	}()
	lines := bufio.NewScanner(stderr)
	lines.Buffer(make([]byte, 0, 64<<10), 1<<20)
	var seen []string
	for lines.Scan() {
		var rec struct {
			Msg      string `json:"msg"`
			Verifier string `json:"verifier"`
		}
		if json.Unmarshal(lines.Bytes(), &rec) == nil && rec.Msg == "configuration" {
			return rec.Verifier
		}
		seen = append(seen, lines.Text())
	}
	t.Fatalf("graspd logged no configuration line; stderr:\n%s", strings.Join(seen, "\n"))
	return ""
}
