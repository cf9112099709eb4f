// Package testkit holds the test helpers shared by every grasp-sync package:
// an embedded JetStream server, a real khatru relay backed by an on-disk
// eventstore, a websocket client to publish to and query relays, and signed
// NIP-34 fixtures with real keys.
//
// Nothing here is a mock: tests exercise the same protocols, stores and
// signatures as production, so a green test means the real wire behaviour
// works. Every helper registers its own cleanup with testing.TB.
package testkit
