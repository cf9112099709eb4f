// Package planner decides what to fetch from which relay. It mirrors the
// RepoSyncIndex from KV, derives per-relay targets, runs ComputeActions once
// per discovery batch, follows each relay's lifecycle from fetcher reports,
// and sends fetch commands to the fetcher owning the relay's shard. It is the
// only place that decides what to subscribe to.
//
// The decisions live in Machine, a pure state machine (index changes,
// reports and the time in; commands and changed relay records out). The
// algorithm is docs/sync.md; the files, by concern:
//
//   - index.go: the RepoSyncIndex mirror with interned ids (RepoID, RootID,
//     RelayID) and the relay → repositories targets.
//   - plan.go: per-relay state (RelayState, PairState, PendingBatch) and the
//     pure three-way diff (ComputeActions, MissingItems).
//   - rules.go: the lifecycle constants (Rules, DefaultRules) and the
//     Observer the machine reports facts to.
//   - machine.go: Machine itself, its outputs (Drain, TakeDirty), index
//     changes (ApplyIndex) and Recompute.
//   - lifecycle.go: a relay's session lifecycle: fetcher reports
//     (HandleReport), connects and session kinds, batch completion
//     including failed and incomplete batches, Tick and NextDeadline.
//   - budget.go: the live-filter budget, consolidation (ReplaceLive) and
//     the queue of deferred consolidations.
//   - batch.go: building batches and encoding them as AddFilters commands.
//   - persist.go: relay records as stored in grasp_relay_state (Snapshot,
//     Restore).
//   - planner.go: the I/O around the machine: the KV watch, the report
//     consumer, command publishing, persistence, leadership (its recompute
//     is debounced by pkg/debounce); metrics.go serves it.
package planner
