// Package faultrelay serves tests of how clients cope with relays that
// misbehave: a websocket server in front of a testrelay.Relay (Start) that
// forwards every message and injects the faults it is told to (dropped or
// stalled connections, capped pages, withheld events, rate limits, NIP-42
// challenges, malformed or oversized messages), and counts connections,
// REQs and NEG-OPENs.
package faultrelay
