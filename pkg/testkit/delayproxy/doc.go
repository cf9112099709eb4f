// Package delayproxy serves tests of a slow or partitioned network between
// a service and its server (typically NATS): a TCP proxy (Start) that
// delivers each direction's bytes late, holds them, or stalls them
// periodically, with the connections left open, as a saturated machine or
// a short partition does.
package delayproxy
