package main

import (
	"slices"
	"strings"
	"testing"
	"time"
)

// The command line as people type it: connection flags anywhere, --help on
// every command, one line for a mistake.
func TestParseArgs(t *testing.T) {
	env := map[string]string{"GRASP_NATS_URL": "nats://from-env:4222", "GRASP_PREFIX": "envprefix"}
	getenv := func(k string) string { return env[k] }
	const coord = "30617:" + "abababababababababababababababababababababababababababababababab" + ":repo"
	for _, tc := range []struct {
		name  string
		args  []string
		check func(t *testing.T, inv invocation)
		err   string // a substring of the one-line error; "" means none
	}{
		{"connection flag after the command", []string{"status", "--nats", "nats://h:1"}, func(t *testing.T, inv invocation) {
			if inv.Command != "status" || inv.Conn.NATS != "nats://h:1" {
				t.Errorf("%+v", inv)
			}
		}, ""},
		{"connection flag before the command", []string{"--nats", "nats://h:1", "status", "--json"}, func(t *testing.T, inv invocation) {
			if inv.Command != "status" || inv.Conn.NATS != "nats://h:1" || !inv.Status.JSON {
				t.Errorf("%+v", inv)
			}
		}, ""},
		{"flag=value form", []string{"repos", "--prefix=p2", "--creds=/c", "--ca=/ca", "--cert=/crt", "--key=/k"}, func(t *testing.T, inv invocation) {
			want := connFlags{NATS: "nats://from-env:4222", Creds: "/c", CA: "/ca", Cert: "/crt", Key: "/k", Prefix: "p2"}
			if inv.Conn != want {
				t.Errorf("conn %+v, want %+v", inv.Conn, want)
			}
		}, ""},
		{"defaults from the environment", []string{"status"}, func(t *testing.T, inv invocation) {
			if inv.Conn.NATS != "nats://from-env:4222" || inv.Conn.Prefix != "envprefix" || inv.Status.Interval != 2*time.Second {
				t.Errorf("%+v", inv)
			}
		}, ""},
		{"a command's flag before the command", []string{"--json", "status", "--watch", "--interval", "5s"}, func(t *testing.T, inv invocation) {
			if !inv.Status.JSON || !inv.Status.Watch || inv.Status.Interval != 5*time.Second {
				t.Errorf("%+v", inv.Status)
			}
		}, ""},
		{"a value flag before the command", []string{"--interval", "5s", "status"}, func(t *testing.T, inv invocation) {
			if inv.Command != "status" || inv.Status.Interval != 5*time.Second {
				t.Errorf("%+v", inv)
			}
		}, ""},
		{"flags after the argument", []string{"explain", coord, "--json", "--nats", "nats://h:1"}, func(t *testing.T, inv invocation) {
			if inv.RepoRef != coord || !inv.Explain.JSON || inv.Conn.NATS != "nats://h:1" {
				t.Errorf("%+v", inv)
			}
		}, ""},
		{"tap subjects among flags", []string{"tap", "grasp.fetch.>", "--kind", "1617", "grasp.ingest.>", "--pretty"}, func(t *testing.T, inv invocation) {
			if !slices.Equal(inv.Tap.Subjects, []string{"grasp.fetch.>", "grasp.ingest.>"}) || inv.Tap.Filter.Kind != 1617 || !inv.Tap.Pretty {
				t.Errorf("%+v", inv.Tap)
			}
		}, ""},
		{"-- ends the flags", []string{"tap", "--relay", "ws://r", "--", "-odd.subject"}, func(t *testing.T, inv invocation) {
			if !slices.Equal(inv.Tap.Subjects, []string{"-odd.subject"}) || inv.Tap.Filter.Relay != "ws://r" {
				t.Errorf("%+v", inv.Tap)
			}
		}, ""},
		{"status --help", []string{"status", "--help"}, helpFor("usage: graspctl status", "--interval", "--nats"), ""},
		{"status -h with other flags", []string{"--nats", "nats://h:1", "status", "--json", "-h"}, helpFor("usage: graspctl status"), ""},
		{"repos --help", []string{"repos", "--help"}, helpFor("usage: graspctl repos", "--relay URL"), ""},
		{"explain --help without its argument", []string{"explain", "--help"}, helpFor("usage: graspctl explain", "REPO_REF"), ""},
		{"tap --help", []string{"tap", "--help"}, helpFor("usage: graspctl tap", "--from-start"), ""},
		{"--help", []string{"--help"}, helpFor("usage: graspctl COMMAND", "explain", "--nats URL"), ""},
		{"-h", []string{"-h"}, helpFor("usage: graspctl COMMAND"), ""},
		{"help", []string{"help"}, helpFor("usage: graspctl COMMAND"), ""},
		{"help COMMAND", []string{"help", "tap"}, helpFor("usage: graspctl tap"), ""},
		{"--version", []string{"--version"}, isVersion, ""},
		{"--version after a command", []string{"status", "--version"}, isVersion, ""},
		{"unknown flag", []string{"status", "--bogus"}, nil, "status: unknown flag --bogus (see graspctl status --help)"},
		{"another command's flag", []string{"repos", "--pretty"}, nil, "repos: unknown flag --pretty"},
		{"unknown flag, no command", []string{"--bogus"}, nil, "unknown flag --bogus (see graspctl --help)"},
		{"bad value", []string{"status", "--interval", "soon"}, nil, `invalid value "soon" for flag --interval`},
		{"missing value", []string{"status", "--interval"}, nil, "a value is needed by --interval"},
		{"unknown command", []string{"frobnicate"}, nil, `unknown command "frobnicate"`},
		{"explain without its argument", []string{"explain"}, nil, "graspctl repos"},
		{"stray argument", []string{"repos", "extra"}, nil, `repos: unexpected argument "extra"`},
		{"help for an unknown command", []string{"help", "frobnicate"}, nil, `unknown command "frobnicate"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			inv, err := parseArgs(tc.args, getenv)
			if tc.err != "" {
				if err == nil {
					t.Fatalf("no error; parsed %+v", inv)
				}
				if code := exitCode(err); code != exitUsage {
					t.Errorf("exit code %d, want %d", code, exitUsage)
				}
				if msg := err.Error(); !strings.Contains(msg, tc.err) || strings.Contains(msg, "\n") {
					t.Errorf("error %q: want one line with %q", msg, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			tc.check(t, inv)
		})
	}
	// No command at all is a usage error that shows the usage.
	if _, err := parseArgs(nil, getenv); err == nil || exitCode(err) != exitUsage || !strings.Contains(err.Error(), "usage: graspctl") {
		t.Errorf("no arguments: %v", err)
	}
}

func helpFor(want ...string) func(t *testing.T, inv invocation) {
	return func(t *testing.T, inv invocation) {
		t.Helper()
		for _, w := range want {
			if !strings.Contains(inv.Help, w) {
				t.Errorf("help %q lacks %q", inv.Help, w)
			}
		}
	}
}

func isVersion(t *testing.T, inv invocation) {
	if !inv.Version || inv.Help != "" {
		t.Errorf("%+v, want the version", inv)
	}
}
