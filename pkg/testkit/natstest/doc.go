// Package natstest serves tests that need a NATS broker: an embedded,
// single-node JetStream server (Start) and an embedded JetStream cluster of
// several nodes (StartCluster), on 127.0.0.1 with file stores in the test's
// temporary directory. Nothing is mocked: streams, consumers and KV are the
// real server's. Each helper registers its own cleanup with testing.TB.
package natstest
