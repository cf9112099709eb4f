package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// The NATS nodes of a multi-process Deployment (multiproc.go): one node, or
// a 3-node JetStream cluster started together and given time to settle its
// routes. The manifests' configuration with users is in natsauth.go.

// addNATS starts n NATS nodes (a cluster when n > 1) and returns the
// client URL list the services get. With auth, every node runs the
// manifests' configuration (natsAuth.writeConfig), a cluster's with the
// production overlay's cluster block.
func (d *Deployment) addNATS(t testing.TB, bin string, n int, auth bool) string {
	t.Helper()
	type ports struct{ client, cluster, monitor, prof int }
	ps := make([]ports, n)
	var routes, clients []string
	for i := range ps {
		ps[i] = ports{mustPort(t), mustPort(t), mustPort(t), 0}
		if d.profile {
			ps[i].prof = mustPort(t)
		}
		routes = append(routes, fmt.Sprintf("nats://127.0.0.1:%d", ps[i].cluster))
		clients = append(clients, fmt.Sprintf("nats://127.0.0.1:%d", ps[i].client))
	}
	if auth {
		a, err := newManifestAuth()
		if err != nil {
			t.Fatal(err)
		}
		d.auth = a
	}
	for i, p := range ps {
		name := fmt.Sprintf("nats-%d", i)
		storeDir := filepath.Join(d.Dir, name)
		args := []string{"-a", "127.0.0.1", "-p", strconv.Itoa(p.client), "-m", strconv.Itoa(p.monitor),
			"-js", "-sd", storeDir, "-n", name}
		if p.prof > 0 {
			args = append(args, "--profile", strconv.Itoa(p.prof))
		}
		if n > 1 {
			args = append(args, "--cluster_name", "grasp-e2e",
				"--cluster", routes[i], "--routes", strings.Join(routes, ","))
		}
		var env Env
		if auth {
			// The manifests' configuration, the cluster in its extra.conf.
			nc := natsNodeConfig{Dir: filepath.Join(d.Dir, name+"-conf"), StoreDir: storeDir, ServerName: name,
				ClientPort: p.client, MonitorPort: p.monitor, ProfPort: p.prof}
			if n > 1 {
				nc.Cluster = &natsClusterConfig{Name: "grasp-e2e", Port: p.cluster, Routes: routes}
			}
			confPath, err := d.auth.writeConfig(nc)
			if err != nil {
				t.Fatal(err)
			}
			args, env = []string{"-c", confPath}, d.auth.env
		}
		np := &Proc{Name: name, Log: filepath.Join(d.Dir, name+".log"),
			HealthURL: fmt.Sprintf("http://127.0.0.1:%d/healthz", p.monitor),
			bin:       natsServerBinary(bin), args: args, env: processEnv(env, nil)}
		if p.prof > 0 {
			np.ProfAddr = fmt.Sprintf("127.0.0.1:%d", p.prof)
		}
		d.NATS = append(d.NATS, np)
	}
	for _, p := range d.NATS {
		if err := p.Start(); err != nil {
			t.Fatal(err)
		}
	}
	// A cluster's nodes are healthy only once they see each other and
	// agree on a JetStream meta leader, so they start together first.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, p := range d.NATS {
		if err := p.WaitReady(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if n > 1 {
		monitors := make([]int, n)
		for i, p := range ps {
			monitors[i] = p.monitor
		}
		if err := waitRoutesSettled(ctx, monitors, n-1); err != nil {
			t.Fatal(err)
		}
	}
	return strings.Join(clients, ",")
}

// waitRoutesSettled waits until every node reports at least want routes
// and no node's route count changed for two seconds. A cluster answers
// /healthz before its pooled routes settle; the duplicate routes it then
// closes can drop JetStream API replies in flight, so services would start
// into a cluster still rearranging itself, which a long-running cluster
// never is. (See the report: the ingester does not survive that today.)
func waitRoutesSettled(ctx context.Context, monitors []int, want int) error {
	last := make([]int, len(monitors))
	var stable time.Time
	for {
		ok := true
		for i, port := range monitors {
			n, err := numRoutes(ctx, port)
			if err != nil || n < want {
				ok = false
			}
			if n != last[i] {
				last[i] = n
				ok = false
			}
		}
		switch {
		case !ok:
			stable = time.Time{}
		case stable.IsZero():
			stable = time.Now()
		case time.Since(stable) >= 2*time.Second:
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("NATS routes did not settle (last counts %v): %w", last, ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// numRoutes reads num_routes from a NATS node's /routez.
func numRoutes(ctx context.Context, monitorPort int) (int, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, fmt.Sprintf("http://127.0.0.1:%d/routez", monitorPort), nil)
	if err != nil {
		return 0, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	var rz struct {
		NumRoutes int `json:"num_routes"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&rz); err != nil {
		return 0, fmt.Errorf("routez: %w", err)
	}
	return rz.NumRoutes, nil
}
