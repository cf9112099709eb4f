// Package testkit holds the protocol fixtures every grasp-sync test
// shares: real secp256k1 keys, signed NIP-34 events (announcements, states,
// patches, pull requests, issues, comments, statuses, deletions, GRASP
// lists) with options for timestamps, tags and content, repository
// addresses and GRASP clone URLs, a deterministic generated world of
// repositories for the benchmarks, free ports for child processes, and a
// log buffer safe for concurrent writers.
//
// Its subpackages serve narrower needs and may import it, not the reverse:
// testrelay (khatru relays, a GRASP relay stand-in, relay limits, the relay
// farm and a websocket client), faultrelay (a relay that misbehaves on
// demand), natstest (embedded NATS), delayproxy (a slow or stalled
// network), loadgen (a saturated process) and syncbaseline (the
// benchmarks' baseline sync).
//
// Nothing here is a mock: tests exercise the same protocols, stores and
// signatures as production, so a green test means the real wire behaviour
// works. Every helper registers its own cleanup with testing.TB.
package testkit
