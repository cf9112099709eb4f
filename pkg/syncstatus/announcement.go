package syncstatus

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/nbd-wtf/go-nostr"

	"github.com/grasp-sync/grasp-sync/pkg/nip34"
	"github.com/grasp-sync/grasp-sync/pkg/relayconn"
	"github.com/grasp-sync/grasp-sync/pkg/relayurl"
)

// URLVerdict is what sync made of one URL the announcement lists.
type URLVerdict struct {
	// Tag is "relays" or "clone".
	Tag string `json:"tag"`
	// URL is the value as the announcement has it.
	URL string `json:"url"`
	// Relay is the normalised relay URL it stands for ("" when none).
	Relay string `json:"relay,omitempty"`
	// Verdict is "synced", "this service", "not a GRASP clone URL" or
	// "refused: <reason>".
	Verdict string `json:"verdict"`
}

// ClassifyAnnouncement says, for each relays value and clone URL of the
// announcement in force, what sync made of it. It judges from the index
// entry rather than re-deciding: a URL that normalises, is not this service
// and is still missing from repo.Relays was refused by discovery's relay
// guard or its per-announcement bound (discovery's configuration decides
// which; see grasp_discovery_refused_relay_urls_total).
func ClassifyAnnouncement(evt *nostr.Event, repo Repo, serviceURL string) ([]URLVerdict, error) {
	a, err := nip34.ParseAnnouncement(evt)
	if err != nil {
		return nil, fmt.Errorf("announcement %s: %w", evt.ID, err)
	}
	judge := func(tag, raw, candidate string) URLVerdict {
		v := URLVerdict{Tag: tag, URL: raw}
		u, err := relayurl.Normalize(candidate)
		switch {
		case err != nil:
			v.Verdict = "refused: " + err.Error()
		case serviceURL != "" && relayurl.SameService(u, serviceURL):
			v.Relay, v.Verdict = u, "this service"
		case slices.Contains(repo.Relays, u):
			v.Relay, v.Verdict = u, "synced"
		default:
			v.Relay, v.Verdict = u, "refused: private or internal address not allowlisted, or beyond the per-announcement relay limit"
		}
		return v
	}
	var out []URLVerdict
	for _, raw := range a.Relays {
		out = append(out, judge("relays", raw, raw))
	}
	for _, raw := range a.Clone {
		if u, ok := relayurl.FromCloneURL(raw); ok {
			out = append(out, judge("clone", raw, u))
		} else {
			out = append(out, URLVerdict{Tag: "clone", URL: raw, Verdict: "not a GRASP clone URL (git remote only)"})
		}
	}
	return out, nil
}

// AddAnnouncement records the verdicts on the explanation and rewrites each
// relay's Why from the tags that list it.
func (ex *Explanation) AddAnnouncement(verdicts []URLVerdict) {
	ex.Announcement = verdicts
	for i := range ex.Relays {
		var from []string
		for _, v := range verdicts {
			if v.Relay == ex.Relays[i].URL && v.Verdict == "synced" {
				if v.Tag == "relays" {
					from = append(from, "relays tag")
				} else {
					from = append(from, "clone URL "+v.URL)
				}
			}
		}
		if len(from) > 0 {
			ex.Relays[i].Why = "listed by the announcement: " + strings.Join(slices.Compact(from), ", ")
		}
	}
}

// ErrNotHeld is FetchEvent's error when the relay answered that it does
// not hold the event (as opposed to not answering).
var ErrNotHeld = errors.New("not held")

// FetchEvent reads one event by id from a relay (normally this service's
// own relay, where every hosted announcement is stored).
func FetchEvent(ctx context.Context, relayURL, id string) (*nostr.Event, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	c, err := relayconn.Dial(ctx, relayURL, relayconn.Options{PingInterval: -1})
	if err != nil {
		return nil, fmt.Errorf("dial %s: %w", relayURL, err)
	}
	defer c.Close()
	sub, err := c.Subscribe(ctx, nostr.Filters{{IDs: []string{id}, Limit: 1}})
	if err != nil {
		return nil, fmt.Errorf("query %s: %w", relayURL, err)
	}
	defer sub.Close()
	for {
		select {
		case evt := <-sub.Events():
			if evt != nil && evt.ID == id {
				return evt, nil
			}
		case <-sub.EOSE():
			for _, evt := range sub.Buffered() {
				if evt.ID == id {
					return evt, nil
				}
			}
			return nil, fmt.Errorf("%s does not have event %s: %w", relayURL, id, ErrNotHeld)
		case reason := <-sub.Closed():
			return nil, fmt.Errorf("%s closed the query: %s", relayURL, reason)
		case <-ctx.Done():
			return nil, fmt.Errorf("query %s: %w", relayURL, ctx.Err())
		}
	}
}
