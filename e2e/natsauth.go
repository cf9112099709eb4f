package e2e

import (
	"bufio"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strings"
)

// The shipped NATS permissions, run for real: DeploymentOptions.Auth starts
// nats-server with the manifests' own configuration (k8s/base/nats: nats.conf,
// the auth.conf deploy/validate generates, extra.conf) and every service
// connects as its own user, as in Kubernetes. Only what differs between a
// pod and a test process is rewritten: addresses, the store directory, the
// server name and the pid file; on a 3-node cluster extra.conf is the
// production overlay's cluster block without its TLS (natsNodeConfig.Cluster). The passwords come from the environment of
// nats-server, as the manifests pass them ($<USER>_PASSWORD).

// manifestNATSDir is k8s/base/nats relative to the e2e package directory,
// where go test runs.
var manifestNATSDir = filepath.Join("..", "k8s", "base", "nats")

// natsAuth is the manifests' users with a password drawn for each, and
// the configuration files written for the nodes that check them.
type natsAuth struct {
	// passwords by NATS user (relay, discovery, …, graspctl).
	passwords map[string]string
	// env is nats-server's environment: <USER>_PASSWORD for every user.
	env Env
}

// newManifestAuth draws a password for every user the manifests'
// auth.conf declares. Every node of a cluster gets the same ones, as every
// pod of the StatefulSet reads the same Secret.
func newManifestAuth() (*natsAuth, error) {
	users, err := authUsers(filepath.Join(manifestNATSDir, "auth.conf"))
	if err != nil {
		return nil, err
	}
	a := &natsAuth{passwords: map[string]string{}, env: Env{}}
	for _, u := range users {
		b := make([]byte, 16)
		if _, err := rand.Read(b); err != nil {
			return nil, err
		}
		a.passwords[u] = hex.EncodeToString(b)
		a.env[strings.ToUpper(u)+"_PASSWORD"] = a.passwords[u]
	}
	return a, nil
}

// natsNodeConfig is where one node of a test deployment listens and keeps
// its store.
type natsNodeConfig struct {
	// Dir receives the node's nats.conf, auth.conf and extra.conf.
	Dir, StoreDir, ServerName string
	ClientPort, MonitorPort   int
	// ProfPort, when set, serves the node's Go profiles (/debug/pprof/) for
	// a benchmark that asks where the server's CPU goes; never shipped.
	ProfPort int
	// Cluster, when set, replaces the manifests' extra.conf (empty in the
	// base, nothing a single node needs) with the cluster block of the
	// production overlay (k8s/components/production/extra.conf) as a test
	// process runs it: the same name-less route list of every node, on
	// 127.0.0.1, without the overlay's TLS (a test has no certificates; TLS
	// changes how routes and clients connect, not what users may do).
	Cluster *natsClusterConfig
}

// natsClusterConfig is the cluster block of a node.
type natsClusterConfig struct {
	Name   string
	Port   int      // this node's route port
	Routes []string // every node's route URL
}

// writeConfig writes the manifests' NATS configuration for node n,
// rewritten for a test process on 127.0.0.1, and returns the path of its
// nats.conf (nats-server -c).
func (a *natsAuth) writeConfig(n natsNodeConfig) (string, error) {
	if err := os.MkdirAll(n.Dir, 0o755); err != nil {
		return "", err
	}
	conf, err := os.ReadFile(filepath.Join(manifestNATSDir, "nats.conf"))
	if err != nil {
		return "", fmt.Errorf("the manifests' nats.conf: %w", err)
	}
	// Each rewritten setting must be found: a manifest that renames one
	// would otherwise run the test on the pod's addresses or paths.
	rewrite := map[string]string{
		"server_name": "server_name: " + n.ServerName,
		"listen":      fmt.Sprintf("listen: 127.0.0.1:%d", n.ClientPort),
		"http":        fmt.Sprintf("http: 127.0.0.1:%d", n.MonitorPort),
		"pid_file":    "# pid_file: none in a test",
		"store_dir":   fmt.Sprintf("store_dir: %q", n.StoreDir),
	}
	found := map[string]bool{}
	var out []string
	for _, line := range strings.Split(string(conf), "\n") {
		key, _, ok := strings.Cut(strings.TrimSpace(line), ":")
		if repl, known := rewrite[key]; ok && known && !strings.HasPrefix(strings.TrimSpace(line), "#") {
			line, found[key] = repl, true
		}
		out = append(out, line)
	}
	for key := range rewrite {
		if !found[key] {
			return "", fmt.Errorf("the manifests' nats.conf has no %s setting: teach e2e/natsauth.go where a test process puts it", key)
		}
	}
	if n.ProfPort > 0 {
		out = append(out, fmt.Sprintf("# Written by e2e/natsauth.go for a profiled benchmark run.\nprof_port: %d", n.ProfPort))
	}
	confPath := filepath.Join(n.Dir, "nats.conf")
	if err := os.WriteFile(confPath, []byte(strings.Join(out, "\n")), 0o600); err != nil {
		return "", err
	}
	for _, name := range []string{"auth.conf", "extra.conf"} {
		b, err := os.ReadFile(filepath.Join(manifestNATSDir, name))
		if err != nil {
			return "", fmt.Errorf("the manifests' %s: %w", name, err)
		}
		if name == "extra.conf" && n.Cluster != nil {
			b = []byte(n.Cluster.block())
		}
		if err := os.WriteFile(filepath.Join(n.Dir, name), b, 0o600); err != nil {
			return "", err
		}
	}
	return confPath, nil
}

// block is the cluster block of extra.conf.
func (c *natsClusterConfig) block() string {
	var b strings.Builder
	b.WriteString("# Written by e2e/natsauth.go: the production overlay's cluster block\n")
	b.WriteString("# (k8s/components/production/extra.conf) on 127.0.0.1, without TLS.\n")
	fmt.Fprintf(&b, "cluster {\n  name: %s\n  listen: 127.0.0.1:%d\n  no_advertise: true\n  connect_retries: 120\n  routes: [\n", c.Name, c.Port)
	for _, r := range c.Routes {
		fmt.Fprintf(&b, "    %s\n", r)
	}
	b.WriteString("  ]\n}\n")
	return b.String()
}

var authUserLine = regexp.MustCompile(`^\s*user:\s*"?([A-Za-z0-9_-]+)"?\s*$`)

// authUsers lists the users an auth.conf declares.
func authUsers(path string) ([]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("the manifests' auth.conf: %w", err)
	}
	defer f.Close()
	var users []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if m := authUserLine.FindStringSubmatch(sc.Text()); m != nil {
			users = append(users, m[1])
		}
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if len(users) == 0 {
		return nil, fmt.Errorf("%s declares no user", path)
	}
	return users, nil
}

// userURL is the client URL list with a user's credentials on every URL,
// as the manifests build GRASP_NATS_URL (nats://<user>:$(NATS_PASSWORD)@grasp-nats:4222,
// one Service address). nats.go uses a URL's own credentials when it
// connects to that server, so a cluster's list with them on the first URL
// alone would leave the other nodes refusing the service (authentication
// error), and it could not move to them when its node dies.
func (a *natsAuth) userURL(clientURLs, user string) (string, error) {
	pw, ok := a.passwords[user]
	if !ok {
		return "", fmt.Errorf("the manifests' auth.conf has no NATS user %q", user)
	}
	var out []string
	for _, clientURL := range strings.Split(clientURLs, ",") {
		u, err := url.Parse(strings.TrimSpace(clientURL))
		if err != nil {
			return "", err
		}
		u.User = url.UserPassword(user, pw)
		out = append(out, u.String())
	}
	return strings.Join(out, ","), nil
}

// permissionDenial matches what nats-server logs when it refuses a client
// (Publish Violation, Subscription Violation, Authorization Violation) and
// what a client reports of it (nats.go: "Permissions Violation for Publish
// to …", "permissions violation").
var permissionDenial = regexp.MustCompile(`(?i)(permissions? violation|publish violation|subscription violation|authorization violation)`)

// PermissionDenials returns every log line of the deployment's processes
// (NATS nodes and services) saying NATS refused something, prefixed with the
// process name.
func (d *Deployment) PermissionDenials() []string {
	var out []string
	for _, p := range d.Procs() {
		out = append(out, logDenials(p.Name, p.Log)...)
	}
	return out
}

// logDenials returns the lines of the log at path that match
// permissionDenial, prefixed with name.
func logDenials(name, path string) []string {
	f, err := os.Open(path)
	if err != nil {
		return []string{fmt.Sprintf("%s: cannot read its log: %v", name, err)}
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 4<<20)
	for sc.Scan() {
		if permissionDenial.MatchString(sc.Text()) {
			out = append(out, name+": "+sc.Text())
		}
	}
	return out
}

// NATSUserURL is the NATS client URL with user's credentials (a deployment
// started with Auth), for graspctl and other clients a test runs.
func (d *Deployment) NATSUserURL(user string) (string, error) {
	if d.auth == nil {
		return "", fmt.Errorf("the deployment runs NATS without users (DeploymentOptions.Auth is false)")
	}
	return d.auth.userURL(d.natsURL, user)
}

// Bin is the path of a binary BuildBinaries built (e.g. "graspctl").
func (d *Deployment) Bin(name string) string { return filepath.Join(d.binDir, name) }

// natsServerBinary is the nats-server a deployment runs: the one built from
// the version the workspace pins (the manifests' image runs the same
// version), or GRASP_E2E_NATS_SERVER, e.g. a distribution's
// /usr/sbin/nats-server, to check another server version.
func natsServerBinary(buildDir string) string {
	if p := os.Getenv("GRASP_E2E_NATS_SERVER"); p != "" {
		return p
	}
	return filepath.Join(buildDir, "nats-server")
}

// firstN is at most the first n elements of s.
func firstN(s []string, n int) []string {
	if len(s) > n {
		return s[:n]
	}
	return s
}

// LeakedPasswords returns the processes whose log contains a NATS user's
// password (the manifests pass it inside GRASP_NATS_URL).
func (d *Deployment) LeakedPasswords() []string {
	if d.auth == nil {
		return nil
	}
	var out []string
	for _, p := range d.Procs() {
		b, err := os.ReadFile(p.Log)
		if err != nil {
			out = append(out, fmt.Sprintf("%s: cannot read its log: %v", p.Name, err))
			continue
		}
		for user, pw := range d.auth.passwords {
			if strings.Contains(string(b), pw) {
				out = append(out, fmt.Sprintf("%s logs the password of NATS user %s", p.Name, user))
			}
		}
	}
	return out
}
