package main_test

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// stamp is what the Makefile's LDFLAGS do to every binary.
const stamp = "-X github.com/grasp-sync/grasp-sync/pkg/obs.Version=v9.9.9-test -X github.com/grasp-sync/grasp-sync/pkg/obs.Commit=abc1234"

// graspd and a service binary answer --version with the stamped version
// and commit and the verifier (pure Go: built here without the
// libsecp256k1 tag), and --help with their usage, exit 0, and refuse any other
// argument with one line and exit 2, without starting.
func TestVersionHelpAndBadArguments(t *testing.T) {
	dir := t.TempDir()
	for _, pkg := range []string{".", "github.com/grasp-sync/grasp-sync/services/planner/cmd/planner"} {
		out, err := exec.Command("go", "build", "-ldflags", stamp, "-o", dir+string(os.PathSeparator), pkg).CombinedOutput()
		if err != nil {
			t.Fatalf("go build %s: %v\n%s", pkg, err, out)
		}
	}
	for _, name := range []string{"graspd", "planner"} {
		bin := filepath.Join(dir, name)
		for _, tc := range []struct {
			args   []string
			code   int
			stdout string
			stderr string
		}{
			{[]string{"--version"}, 0, name + " v9.9.9-test (commit abc1234, verifier pure Go)", ""},
			{[]string{"--help"}, 0, "usage: " + name, ""},
			{[]string{"-h"}, 0, "GRASP_LOG_FORMAT=text|json", ""},
			{[]string{"--nats", "nats://127.0.0.1:1"}, 2, "", name + `: usage: unexpected argument "--nats"`},
		} {
			t.Run(name+" "+strings.Join(tc.args, " "), func(t *testing.T) {
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				defer cancel()
				cmd := exec.CommandContext(ctx, bin, tc.args...)
				// Were the arguments ignored, the binary would start and
				// fail on this NATS, with exit code 1.
				cmd.Env = graspdEnv(t, "GRASP_NATS_URL=nats://127.0.0.1:1", "GRASP_STORE_URL="+t.TempDir())
				var stdout, stderr bytes.Buffer
				cmd.Stdout, cmd.Stderr = &stdout, &stderr
				err := cmd.Run()
				code := 0
				var ee *exec.ExitError
				if errors.As(err, &ee) {
					code = ee.ExitCode()
				} else if err != nil {
					t.Fatal(err)
				}
				if code != tc.code {
					t.Fatalf("exit %d, want %d; stdout %q stderr %q", code, tc.code, stdout.String(), stderr.String())
				}
				if !strings.Contains(stdout.String(), tc.stdout) || tc.stdout == "" && stdout.Len() > 0 {
					t.Errorf("stdout %q, want %q", stdout.String(), tc.stdout)
				}
				errOut := strings.TrimSpace(stderr.String())
				if tc.stderr == "" && errOut != "" || !strings.HasPrefix(errOut, tc.stderr) || strings.Contains(errOut, "\n") {
					t.Errorf("stderr %q, want one line starting %q", errOut, tc.stderr)
				}
			})
		}
	}
}

// GRASP_LOG_FORMAT=text makes graspd log text; without it, its stderr (a
// pipe here, as under a log collector) gets JSON.
func TestLogFormatOfGraspd(t *testing.T) {
	bin := build(t)
	for _, tc := range []struct {
		format string
		want   string // how the configuration record starts
	}{
		{"text", "time="},
		{"", `{"time":`},
	} {
		t.Run("GRASP_LOG_FORMAT="+tc.format, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			cmd := exec.CommandContext(ctx, bin)
			cmd.Env = graspdEnv(t, "GRASP_LOG_FORMAT="+tc.format)
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
			sc := bufio.NewScanner(stderr)
			sc.Buffer(make([]byte, 1<<20), 1<<20)
			for sc.Scan() {
				line := sc.Text()
				if !strings.Contains(line, "configuration") {
					continue
				}
				if !strings.HasPrefix(line, tc.want) {
					t.Fatalf("configuration record %q, want it to start %q", line, tc.want)
				}
				return
			}
			t.Fatalf("graspd logged no configuration record (%v)", sc.Err())
		})
	}
}
