package planner

import (
	"encoding/binary"
	"slices"
	"time"

	graspv1 "github.com/grasp-sync/grasp-sync/proto/grasp/v1"
)

func unixOrZero(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.Unix()
}

func timeOrZero(sec int64) time.Time {
	if sec == 0 {
		return time.Time{}
	}
	return time.Unix(sec, 0)
}

// Snapshot is the persisted record of a relay: confirmed state per
// repository in compact form, timestamps and status. Pending batches are
// not persisted: a restarted planner cannot receive their reports reliably,
// so their items count as not fetched and are fetched again.
func (m *Machine) Snapshot(s *RelayState, now time.Time) *graspv1.RelayState {
	_, roots, pendRepos, pendRoots := s.Counts()
	st := &graspv1.RelayState{
		RelayUrl:            s.URL,
		Status:              s.Status,
		SessionId:           s.Session,
		Bootstrap:           s.Bootstrap,
		LastConnected:       unixOrZero(s.LastConnected),
		DisconnectedAt:      unixOrZero(s.DisconnectedAt),
		AnnouncementsSynced: s.AnnouncementsSynced,
		LiveFilterCount:     uint32(s.LiveFilters),
		LastSeen:            unixOrZero(s.LastSeen),
		CatchUpSince:        s.CatchUpSince,
		NextResync:          unixOrZero(s.NextResync),
		HistoricFailures:    uint32(s.Failures),
		IncompleteBatches:   uint32(s.Incomplete),
		LastIncomplete:      s.LastIncomplete,
		ResyncMissed:        s.ResyncMissed,
		LastMissedAt:        unixOrZero(s.LastMissedAt),
		PendingBatches:      uint32(len(s.Batches)),
		PendingRepos:        uint32(pendRepos),
		PendingRoots:        uint32(pendRoots),
		ConfirmedRoots:      uint32(roots),
		UpdatedAt:           now.Unix(),
		Epoch:               m.epoch,
	}
	if s.restored {
		// Not yet reconnected under this planner: keep what the previous one
		// knew, so a second restart still finds the session to resume.
		st.SessionId = s.resumeSession
	}
	ids := make([]RepoID, 0, len(s.Pairs))
	for r := range s.Pairs {
		ids = append(ids, r)
	}
	slices.SortFunc(ids, func(a, b RepoID) int {
		if m.idx.Repo(a).Ref < m.idx.Repo(b).Ref {
			return -1
		}
		return 1
	})
	for _, r := range ids {
		p := s.Pairs[r]
		if !p.RepoConfirmed && len(p.Confirmed) == 0 {
			continue
		}
		repo := m.idx.Repo(r)
		c := &graspv1.ConfirmedRepo{RepoRef: repo.Ref, RepoConfirmed: p.RepoConfirmed}
		if len(p.Confirmed) == len(repo.Roots) {
			c.AllRoots, c.RootCount, c.RootsDigest = true, uint32(len(repo.Roots)), repo.Digest
		} else {
			buf := make([]byte, 8*len(p.Confirmed))
			for i, root := range p.Confirmed {
				binary.BigEndian.PutUint64(buf[8*i:], m.idx.Roots.Prefix(root))
			}
			c.RootPrefixes = buf
		}
		st.Confirmed = append(st.Confirmed, c)
	}
	return st
}

// Restore loads relay records written by a previous planner, after the index
// mirror has been loaded. Each relay resumes when its fetcher reports the
// session: the same session as before continues (resume: live subscriptions
// replaced, catch-up from when the record was last known alive), a new one is
// a reconnect judged by when the old one ended. A confirmed set that no
// longer matches the index (roots changed while no planner ran) is trusted
// only as far as it can be matched. Every restored relay that is still a
// target gets an EnsureConnected.
func (m *Machine) Restore(states []*graspv1.RelayState) (mismatched int) {
	for _, st := range states {
		id := m.idx.Relay(st.GetRelayUrl())
		s := NewRelayState(id, st.GetRelayUrl())
		s.Status = graspv1.RelayStatus_RELAY_STATUS_CONNECTING
		s.Bootstrap = m.idx.IsBootstrap(id)
		s.LastConnected = timeOrZero(st.GetLastConnected())
		s.LastSeen = timeOrZero(st.GetLastSeen())
		s.AnnouncementsSynced = st.GetAnnouncementsSynced()
		s.CatchUpSince = st.GetCatchUpSince()
		s.NextResync = timeOrZero(st.GetNextResync())
		s.Failures = int(st.GetHistoricFailures())
		s.Incomplete, s.LastIncomplete = int(st.GetIncompleteBatches()), st.GetLastIncomplete()
		s.ResyncMissed, s.LastMissedAt = st.GetResyncMissed(), timeOrZero(st.GetLastMissedAt())
		s.restored = true
		s.resumeSession = st.GetSessionId()
		// The moment the live stream was (or may have been) lost: when the
		// session ended, or the last sign of life of a session that was
		// still running.
		s.DisconnectedAt = timeOrZero(st.GetDisconnectedAt())
		if st.GetSessionId() != "" {
			// Only a report proves the session was alive; the record's
			// write time does not.
			s.DisconnectedAt = s.LastSeen
		}
		targets := m.idx.TargetRepos(id)
		for _, c := range st.GetConfirmed() {
			repoID, ok := m.idx.LookupRepo(c.GetRepoRef())
			if !ok {
				continue
			}
			if _, listed := targets[repoID]; !listed {
				continue
			}
			repo := m.idx.Repo(repoID)
			p := &PairState{RepoConfirmed: c.GetRepoConfirmed()}
			switch {
			case c.GetAllRoots() && c.GetRootCount() == uint32(len(repo.Roots)) && c.GetRootsDigest() == repo.Digest:
				p.Confirmed = repo.Roots // shared, see shareRoots
			case c.GetAllRoots():
				mismatched++ // the roots changed: which are confirmed is unknown
			default:
				pre := c.GetRootPrefixes()
				want := make(map[uint64]bool, len(pre)/8)
				for i := 0; i+8 <= len(pre); i += 8 {
					want[binary.BigEndian.Uint64(pre[i:])] = true
				}
				for _, root := range repo.Roots {
					if want[m.idx.Roots.Prefix(root)] {
						p.Confirmed = append(p.Confirmed, root)
					}
				}
			}
			if p.RepoConfirmed || len(p.Confirmed) > 0 {
				s.Pairs[repoID] = p
			}
		}
		m.relays[id] = s
		if m.idx.IsTarget(id) {
			m.send(s, "", &graspv1.FetchCommand{Command: &graspv1.FetchCommand_EnsureConnected{EnsureConnected: &graspv1.EnsureConnected{}}})
		}
		m.affected[id] = nil // the whole relay
	}
	return mismatched
}
