// Package testkit holds the test helpers shared by every grasp-sync package:
// a real khatru relay backed by an on-disk eventstore, a websocket client to
// publish to and query relays, and signed NIP-34 fixtures with real keys.
// Its subpackages serve narrower needs: natstest (embedded NATS),
// delayproxy (a slow network), loadgen (a saturated process) and
// syncbaseline (the benchmarks' baseline sync).
//
// Nothing here is a mock: tests exercise the same protocols, stores and
// signatures as production, so a green test means the real wire behaviour
// works. Every helper registers its own cleanup with testing.TB.
package testkit
