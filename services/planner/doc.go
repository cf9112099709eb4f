// Package planner decides what to fetch from which relay. It mirrors the
// RepoSyncIndex from KV, derives per-relay targets, runs ComputeActions once
// per discovery batch, follows each relay's lifecycle from fetcher reports,
// and sends fetch commands to the fetcher owning the relay's shard. It is the
// only place that decides what to subscribe to.
//
// The decisions live in Machine, a pure state machine (index changes,
// reports and the time in; commands and changed relay records out). The
// algorithm is docs/sync.md. README.md, beside this file, maps the files by
// concern and records the planner's own choices; it is the one map, so a
// file added here is listed there.
package planner
