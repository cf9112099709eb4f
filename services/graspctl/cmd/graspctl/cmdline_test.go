package main

import (
	"bytes"
	"context"
	"errors"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/grasp-sync/grasp-sync/pkg/testkit/natstest"
)

// The built graspctl, as a person runs it: connection flags after the
// command reach NATS, --help prints the command's usage and exits 0, an
// unknown flag is one line on stderr and exit 2.
func TestBuiltCommandLine(t *testing.T) {
	n := natstest.Start(t) // JetStream up, nothing has created the buckets
	bin := filepath.Join(t.TempDir(), "graspctl")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	for _, tc := range []struct {
		args   []string
		code   int
		stdout string // a substring
		stderr string // the one line's start; "" expects nothing
	}{
		// Exit 4 (bucket missing) says graspctl reached the NATS given
		// after the command.
		{[]string{"status", "--nats", n.URL}, exitNoBucket, "", "graspctl: grasp_repo_index: bucket missing"},
		{[]string{"repos", "--json", "--nats=" + n.URL}, exitNoBucket, "", "graspctl: grasp_repo_index: bucket missing"},
		{[]string{"status", "--help"}, 0, "usage: graspctl status", ""},
		{[]string{"tap", "-h"}, 0, "usage: graspctl tap", ""},
		{[]string{"explain", "--help"}, 0, "usage: graspctl explain", ""},
		{[]string{"repos", "--help"}, 0, "usage: graspctl repos", ""},
		{[]string{"--help"}, 0, "usage: graspctl COMMAND", ""},
		{[]string{"--version"}, 0, "graspctl dev (commit unknown, verifier ", ""},
		{[]string{"status", "--nats", n.URL, "--bogus"}, exitUsage, "", "graspctl: status: unknown flag --bogus"},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			cmd := exec.CommandContext(ctx, bin, tc.args...)
			cmd.Env = []string{"GRASP_NATS_URL=nats://127.0.0.1:1"} // the flag must win
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
			errOut := strings.TrimSpace(stderr.String())
			if code != tc.code {
				t.Fatalf("exit %d, want %d; stderr %q", code, tc.code, errOut)
			}
			if !strings.Contains(stdout.String(), tc.stdout) {
				t.Errorf("stdout %q, want %q", stdout.String(), tc.stdout)
			}
			if tc.stderr == "" && errOut != "" || !strings.HasPrefix(errOut, tc.stderr) || strings.Contains(errOut, "\n") {
				t.Errorf("stderr %q, want one line starting %q", errOut, tc.stderr)
			}
		})
	}
}
