package main

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/grasp-sync/grasp-sync/pkg/testkit/natstest"
)

// Exit codes and messages tell the operator what to do.
func TestExitCodes(t *testing.T) {
	n := natstest.Start(t) // JetStream up, but nothing has created the buckets
	for _, tc := range []struct {
		name string
		args []string
		code int
		hint string
	}{
		{"no command", nil, exitUsage, "usage"},
		{"unknown command", []string{"--nats", n.URL, "frobnicate"}, exitUsage, "unknown command"},
		{"explain without a repo", []string{"--nats", n.URL, "explain"}, exitUsage, "graspctl repos"},
		{"NATS unreachable", []string{"--nats", "nats://127.0.0.1:1", "status"}, exitUnreachable, "is graspd running"},
		{"bucket missing", []string{"--nats", n.URL, "status"}, exitNoBucket, "start graspd"},
		{"missing credentials file", []string{"--nats", n.URL, "--creds", "/nonexistent.creds", "status"}, exitUsage, "credentials"},
		{"missing CA file", []string{"--nats", n.URL, "--ca", "/nonexistent-ca.pem", "status"}, exitUsage, "GRASP_NATS_CA=/nonexistent-ca.pem"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			err := run(context.Background(), tc.args, &stdout, &stderr)
			if err == nil {
				t.Fatal("no error")
			}
			if got := exitCode(err); got != tc.code {
				t.Errorf("exit code %d, want %d (err %v)", got, tc.code, err)
			}
			if !strings.Contains(err.Error(), tc.hint) {
				t.Errorf("error %q does not say %q", err, tc.hint)
			}
		})
	}
}
