package e2e

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestNATSClusterConfig: a cluster node's configuration is the manifests'
// nats.conf and auth.conf with the node's own name, addresses and store,
// and an extra.conf holding the cluster block with every node's route;
// every node gets the same passwords.
func TestNATSClusterConfig(t *testing.T) {
	a, err := newManifestAuth()
	if err != nil {
		t.Fatal(err)
	}
	if len(a.passwords) < 5 || a.env["FETCHER_PASSWORD"] == "" {
		t.Fatalf("passwords drawn for %d users (%v); want every service's", len(a.passwords), a.env)
	}
	dir := t.TempDir()
	routes := []string{"nats://127.0.0.1:7001", "nats://127.0.0.1:7002", "nats://127.0.0.1:7003"}
	conf, err := a.writeConfig(natsNodeConfig{Dir: dir, StoreDir: "/tmp/js-1", ServerName: "nats-1", ClientPort: 4001, MonitorPort: 8001,
		Cluster: &natsClusterConfig{Name: "grasp-e2e", Port: 7002, Routes: routes}})
	if err != nil {
		t.Fatal(err)
	}
	read := func(name string) string {
		b, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	if conf != filepath.Join(dir, "nats.conf") {
		t.Errorf("config at %s, want %s", conf, filepath.Join(dir, "nats.conf"))
	}
	nc := read("nats.conf")
	for _, want := range []string{"server_name: nats-1", "listen: 127.0.0.1:4001", "http: 127.0.0.1:8001", `store_dir: "/tmp/js-1"`, "include ./auth.conf", "include ./extra.conf"} {
		if !strings.Contains(nc, want) {
			t.Errorf("nats.conf lacks %q:\n%s", want, nc)
		}
	}
	if shipped, _ := os.ReadFile(filepath.Join(manifestNATSDir, "auth.conf")); read("auth.conf") != string(shipped) {
		t.Error("auth.conf differs from the manifests'")
	}
	extra := read("extra.conf")
	for _, want := range append([]string{"cluster {", "name: grasp-e2e", "listen: 127.0.0.1:7002"}, routes...) {
		if !strings.Contains(extra, want) {
			t.Errorf("extra.conf lacks %q:\n%s", want, extra)
		}
	}
}

// TestUserURLEveryNode: every URL of a cluster's list carries the user's
// credentials, so the service may connect to, and move to, any node.
func TestUserURLEveryNode(t *testing.T) {
	a := &natsAuth{passwords: map[string]string{"fetcher": "s3cret"}}
	got, err := a.userURL("nats://127.0.0.1:4001,nats://127.0.0.1:4002,nats://127.0.0.1:4003", "fetcher")
	if err != nil {
		t.Fatal(err)
	}
	want := "nats://fetcher:s3cret@127.0.0.1:4001,nats://fetcher:s3cret@127.0.0.1:4002,nats://fetcher:s3cret@127.0.0.1:4003"
	if got != want {
		t.Errorf("userURL = %s, want %s", got, want)
	}
	if _, err := a.userURL("nats://127.0.0.1:4001", "nobody"); err == nil {
		t.Error("a user auth.conf does not declare got a URL")
	}
}
