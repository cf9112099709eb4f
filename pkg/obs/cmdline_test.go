package obs_test

import (
	"bytes"
	"errors"
	"strings"
	"testing"

	"github.com/grasp-sync/grasp-sync/pkg/obs"
	"github.com/grasp-sync/grasp-sync/pkg/verify"
)

func TestCommandLine(t *testing.T) {
	help := obs.ServiceHelp("fetcher", "Runs the fetcher.")
	for _, tc := range []struct {
		name   string
		args   []string
		done   bool
		stdout string // a substring; "" expects nothing printed
		usage  bool
	}{
		{"no arguments: run", nil, false, "", false},
		{"--version", []string{"--version"}, true, "fetcher dev (commit unknown, verifier " + verify.Backend() + ")", false},
		{"-version", []string{"-version"}, true, "fetcher dev (commit unknown, verifier " + verify.Backend() + ")", false},
		{"--help", []string{"--help"}, true, "usage: fetcher [--version | --help]", false},
		{"-h", []string{"-h"}, true, "GRASP_LOG_FORMAT", false},
		{"unknown flag", []string{"--nats", "nats://x"}, false, "", true},
		{"stray argument", []string{"run"}, false, "", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out bytes.Buffer
			done, err := obs.CommandLine("fetcher", help, tc.args, &out)
			if done != tc.done {
				t.Errorf("done = %v, want %v", done, tc.done)
			}
			if tc.usage {
				if !errors.Is(err, obs.ErrUsage) || strings.Contains(err.Error(), "\n") || !strings.Contains(err.Error(), tc.args[0]) {
					t.Errorf("err = %v, want one usage line naming %q", err, tc.args[0])
				}
			} else if err != nil {
				t.Errorf("err = %v", err)
			}
			if tc.stdout == "" && out.Len() > 0 || !strings.Contains(out.String(), tc.stdout) {
				t.Errorf("stdout %q, want %q", out.String(), tc.stdout)
			}
		})
	}
}
