package natstest

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/grasp-sync/grasp-sync/pkg/testkit"
)

// Cluster is an embedded JetStream cluster of several nodes on
// 127.0.0.1, for tests of behaviour only a cluster has: replicated streams,
// a meta leader answering (or not) API requests, concurrent creates racing
// through it.
type Cluster struct {
	// Servers are the nodes, in start order.
	Servers []*server.Server
	// URL lists every node's client URL, comma-separated, as a NATS client
	// accepts it.
	URL string
}

// StartCluster starts an n-node JetStream cluster (file stores in
// t.TempDir()) and waits until it has a meta leader and every node is
// current, so replicated streams can be created at once. Every node is shut
// down when the test ends.
func StartCluster(t testing.TB, n int) *Cluster {
	t.Helper()
	// Route ports must be known before the nodes start, to list them.
	ports := make([]int, n)
	for i := range ports {
		ports[i] = freePort(t)
	}
	var routes []string
	for _, p := range ports {
		routes = append(routes, fmt.Sprintf("nats-route://127.0.0.1:%d", p))
	}
	c := &Cluster{}
	var urls []string
	for i := range n {
		opts := &server.Options{
			ServerName: fmt.Sprintf("n%d", i),
			Host:       "127.0.0.1",
			Port:       -1,
			JetStream:  true,
			StoreDir:   t.TempDir(),
			NoLog:      true,
			NoSigs:     true,
			Cluster:    server.ClusterOpts{Name: "testkit", Host: "127.0.0.1", Port: ports[i]},
			Routes:     server.RoutesFromStr(strings.Join(routes, ",")),
		}
		s, err := server.NewServer(opts)
		if err != nil {
			t.Fatalf("natstest: create nats node %d: %v", i, err)
		}
		go s.Start()
		t.Cleanup(func() {
			s.Shutdown()
			s.WaitForShutdown()
		})
		if !s.ReadyForConnections(10 * time.Second) {
			t.Fatalf("natstest: nats node %d not ready for connections after 10s", i)
		}
		c.Servers = append(c.Servers, s)
		urls = append(urls, s.ClientURL())
	}
	c.URL = strings.Join(urls, ",")
	deadline := time.Now().Add(30 * time.Second)
	for !c.ready() {
		if time.Now().After(deadline) {
			t.Fatalf("natstest: nats cluster has no meta leader or a node is behind after 30s")
		}
		time.Sleep(50 * time.Millisecond)
	}
	return c
}

// ready reports whether the cluster has a meta leader and every node is
// current with it.
func (c *Cluster) ready() bool {
	leader := false
	for _, s := range c.Servers {
		if !s.JetStreamIsCurrent() {
			return false
		}
		leader = leader || s.JetStreamIsLeader()
	}
	return leader
}

// freePort returns a TCP port on 127.0.0.1 nobody listens on now.
func freePort(t testing.TB) int {
	t.Helper()
	p, err := testkit.FreePort()
	if err != nil {
		t.Fatalf("natstest: %v", err)
	}
	return p
}
