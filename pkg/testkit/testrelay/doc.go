// Package testrelay serves tests that need remote nostr relays: a real
// khatru relay on a random 127.0.0.1 port backed by an on-disk eventstore
// (Start), a stand-in for a third-party GRASP relay with its own policy,
// per-address rate limit and NIP-42 (StartGraspRelay), public relays'
// per-connection limits in strfry's, nostr-rs-relay's or NIP-01's style
// (Limits), a farm of many counted relays over an in-memory store for the
// benchmarks (StartFarm, MemStore), and a websocket client to publish to
// and query any relay (Dial, Publish, QueryAll).
//
// Nothing is mocked: clients speak the real protocol to a real relay. Every
// helper that takes a testing.TB registers its own cleanup with it.
package testrelay
