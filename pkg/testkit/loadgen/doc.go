// Package loadgen serves tests of what must hold up under load (leases,
// leadership): Start saturates the test's own process the way a big sync
// does, with spinning goroutines on every core and a flood of JetStream
// publishes, until Stop or the end of the test.
package loadgen
