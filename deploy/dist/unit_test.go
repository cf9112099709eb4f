package dist_test

import (
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/grasp-sync/grasp-sync/deploy/dist"
)

func readUnit(t *testing.T) dist.Unit {
	t.Helper()
	f, err := os.Open("graspd.service")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	u, err := dist.ParseUnit(f)
	if err != nil {
		t.Fatal(err)
	}
	return u
}

// The unit confines graspd: it runs unprivileged and cannot gain
// privileges, the only writable path is its state directory (plus a
// private /tmp), it may open only IP and local sockets and make only the
// system calls of an ordinary service; it restarts on failure and gives the
// graceful stop time to finish (docs/deploy.md, "On one host").
func TestUnitHardening(t *testing.T) {
	u := readUnit(t)
	const svc = "Service"
	for key, want := range map[string]string{
		"ExecStart":               "/usr/bin/graspd",
		"EnvironmentFile":         "/etc/grasp-sync/graspd.env",
		"DynamicUser":             "yes",
		"StateDirectory":          "grasp-sync",
		"WorkingDirectory":        "/var/lib/grasp-sync",
		"NoNewPrivileges":         "yes",
		"ProtectSystem":           "strict",
		"ProtectHome":             "yes",
		"PrivateTmp":              "yes",
		"PrivateDevices":          "yes",
		"RestrictAddressFamilies": "AF_INET AF_INET6 AF_UNIX",
		"RestrictSUIDSGID":        "yes",
		"CapabilityBoundingSet":   "",
		"AmbientCapabilities":     "",
		"Restart":                 "on-failure",
		"SystemCallArchitectures": "native",
		"SystemCallErrorNumber":   "EPERM",
		"MemoryDenyWriteExecute":  "yes",
		"ProtectKernelTunables":   "yes",
		"ProtectControlGroups":    "yes",
		"ProtectKernelModules":    "yes",
		"RestrictNamespaces":      "yes",
		"LockPersonality":         "yes",
		"RestrictRealtime":        "yes",
		"ProtectClock":            "yes",
		"ProtectKernelLogs":       "yes",
		"ProtectHostname":         "yes",
		"KillSignal":              "SIGTERM",
		"Type":                    "exec",
		"StateDirectoryMode":      "0700",
		"UMask":                   "0077",
		"PrivateUsers":            "yes",
		"ProtectProc":             "invisible",
		"RemoveIPC":               "yes",
		"RestartSec":              "5s",
		"LimitNOFILE":             "65536",
		"TimeoutStopSec":          "90s",
	} {
		if vals, ok := u[svc][key]; !ok || u.Get(svc, key) != want {
			t.Errorf("[Service] %s = %q (set: %v), want %q", key, u.Get(svc, key), ok && len(vals) > 0, want)
		}
	}
	// Nothing writable beside the state directory: no path made writable,
	// no other managed directory, no user that could be root.
	for _, key := range []string{"ReadWritePaths", "ReadWriteDirectories", "BindPaths", "LogsDirectory", "CacheDirectory",
		"RuntimeDirectory", "ConfigurationDirectory", "User", "Group", "SupplementaryGroups", "PermissionsStartOnly",
		"ExecStartPre", "ExecStartPost", "ExecStop", "Delegate"} {
		if _, ok := u[svc][key]; ok {
			t.Errorf("[Service] sets %s", key)
		}
	}
	if strings.ContainsAny(u.Get(svc, "ExecStart"), "+!@:-") {
		t.Errorf("ExecStart %q has a prefix that lifts the sandbox", u.Get(svc, "ExecStart"))
	}
	filters := u[svc]["SystemCallFilter"]
	if !slices.Contains(filters, "@system-service") || !slices.Contains(filters, "~@privileged") || slices.Contains(filters, "") {
		t.Errorf("SystemCallFilter %q: want @system-service and ~@privileged, never reset", filters)
	}
	// The stop timeout covers graspd's drain: the ingester's in-flight
	// events (GRASP_INGESTER_ACK_WAIT, 30 s by default) and the relay's
	// shutdown (5 s).
	stop, err := time.ParseDuration(u.Get(svc, "TimeoutStopSec"))
	if err != nil || stop < 35*time.Second {
		t.Errorf("TimeoutStopSec %q, want a duration over 35 s", u.Get(svc, "TimeoutStopSec"))
	}
	if u.Get("Install", "WantedBy") != "multi-user.target" {
		t.Errorf("[Install] WantedBy = %q", u.Get("Install", "WantedBy"))
	}
}

func TestParseUnit(t *testing.T) {
	u, err := dist.ParseUnit(strings.NewReader("# c\n[Service]\nA=1\n; c\nB = x y \nA=\nA=2\n"))
	if err != nil {
		t.Fatal(err)
	}
	if got := u["Service"]["A"]; !slices.Equal(got, []string{"1", "", "2"}) || u.Get("Service", "B") != "x y" {
		t.Errorf("parsed %v", u)
	}
	for _, bad := range []string{"A=1\n", "[S]\nnoequals\n", "[S]\nA=1 \\\n"} {
		if _, err := dist.ParseUnit(strings.NewReader(bad)); err == nil {
			t.Errorf("%q parsed", bad)
		}
	}
}
