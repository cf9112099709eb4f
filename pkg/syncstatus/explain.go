package syncstatus

import (
	"fmt"
	"strings"
)

// RepoRelay is the state of one repository on one relay its announcement
// lists.
type RepoRelay struct {
	URL string `json:"url"`
	// Status is the relay's planner status; "Untracked" when the planner has
	// no record of it yet.
	Status string `json:"status"`
	// RepoConfirmed says the repository's own history was fetched there.
	RepoConfirmed bool `json:"repo_confirmed"`
	// ConfirmedRoots counts this repository's root events whose replies were
	// fetched from the relay.
	ConfirmedRoots int `json:"confirmed_roots"`
	// PendingRoots is Roots − ConfirmedRoots: what the planner still has to
	// fetch (or has in flight) from this relay.
	PendingRoots int `json:"pending_roots"`
	// Why says in words why this relay syncs the repository.
	Why string `json:"why"`
	// Incomplete, when set, is why this repository is not fully synced
	// from the relay although the relay was read: its last incomplete
	// batch (retried on the failure schedule).
	Incomplete string `json:"incomplete,omitempty"`
}

// Explanation says which relays a repository is synced from and how far.
type Explanation struct {
	Repo   Repo        `json:"repo"`
	Relays []RepoRelay `json:"relays"`
	// Announcement is what sync made of each URL of the announcement in
	// force (filled by AddAnnouncement when the announcement was fetched).
	Announcement []URLVerdict `json:"announcement,omitempty"`
}

// Explain looks a repository up by its coordinate (30617:<pubkey>:<d>).
// It fails with ErrUnknownRepo when the index has no such entry.
func (s *Snapshot) Explain(ref string) (*Explanation, error) {
	ref = strings.TrimSpace(ref)
	for _, repo := range s.Repos {
		if repo.Ref != ref {
			continue
		}
		ex := &Explanation{Repo: repo}
		for _, url := range repo.Relays {
			rr := RepoRelay{URL: url, Status: "Untracked", PendingRoots: repo.Roots,
				Why: "listed by the announcement (relays tag or GRASP clone URL)"}
			if slicesContains(s.Bootstrap, url) {
				rr.Why += "; also a bootstrap relay"
			}
			if r, ok := s.Relay(url); ok {
				rr.Status = r.Status
				for _, c := range r.state.GetConfirmed() {
					if c.GetRepoRef() != ref {
						continue
					}
					rr.RepoConfirmed = c.GetRepoConfirmed()
					if c.GetAllRoots() {
						rr.ConfirmedRoots = int(c.GetRootCount())
					} else {
						rr.ConfirmedRoots = len(c.GetRootPrefixes()) / 8
					}
				}
				rr.PendingRoots = max(repo.Roots-rr.ConfirmedRoots, 0)
				if r.IncompleteBatches > 0 && (!rr.RepoConfirmed || rr.PendingRoots > 0) {
					rr.Incomplete = fmt.Sprintf("%d batches incomplete; last: %s", r.IncompleteBatches, r.LastIncomplete)
				}
			}
			ex.Relays = append(ex.Relays, rr)
		}
		return ex, nil
	}
	return nil, fmt.Errorf("%s: %w", ref, ErrUnknownRepo)
}

func slicesContains(ss []string, s string) bool {
	for _, x := range ss {
		if x == s {
			return true
		}
	}
	return false
}

// ReposOfRelay returns the repositories whose announcement lists url.
func (s *Snapshot) ReposOfRelay(url string) []Repo {
	var out []Repo
	for _, r := range s.Repos {
		if slicesContains(r.Relays, url) {
			out = append(out, r)
		}
	}
	return out
}
