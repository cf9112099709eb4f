package fetcher

import (
	"context"
	"errors"
	"regexp"
	"strings"
	"sync"
	"time"

	"github.com/grasp-sync/grasp-sync/pkg/negsync"
)

// nip77Reprobe is how long a relay that answered a NEG-OPEN with a refusal
// is left alone before NIP-77 is tried on it again (a relay may be
// upgraded; once a day, like the resync).
const nip77Reprobe = 24 * time.Hour

// nip77Support is what a relay worker learnt of the relay's NIP-77 across
// sessions (docs/decisions/0040-neg-open-only-to-relays-that-answered.md):
// a relay that refused a NEG-OPEN (NEG-ERR, a NOTICE, a message it does not
// understand) is sent none for nip77Reprobe; while nothing is known, one
// NEG-OPEN at a time probes it and the other batches wait for its verdict
// instead of each sending their own. A relay that once answered a NEG-MSG
// is known to speak NIP-77: later failures there are per filter and per
// session (session.fallBack), never remembered.
type nip77Support struct {
	mu        sync.Mutex
	supported bool
	refused   string    // the refusal, while remembered
	until     time.Time // when a refusal is forgotten
	probing   chan struct{}
}

// begin says whether a batch may send a NEG-OPEN now. While a probe of an
// unknown relay is in flight it waits for its verdict (or ctx). probe is
// set for the caller that must report its outcome with settle; refused is
// the remembered refusal when try is false.
func (n *nip77Support) begin(ctx context.Context, now func() time.Time) (try, probe bool, refused string) {
	for {
		n.mu.Lock()
		switch {
		case n.supported:
			n.mu.Unlock()
			return true, false, ""
		case n.refused != "" && now().Before(n.until):
			r := n.refused
			n.mu.Unlock()
			return false, false, r
		case n.probing == nil:
			n.refused = ""
			n.probing = make(chan struct{})
			n.mu.Unlock()
			return true, true, ""
		}
		wait := n.probing
		n.mu.Unlock()
		select {
		case <-wait:
		case <-ctx.Done():
			return false, false, ""
		}
	}
}

// refusal is the remembered refusal, "" when the relay may speak NIP-77
// (it did, or nothing is known yet). It waits for nothing.
func (n *nip77Support) refusal(now time.Time) string {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.supported || !now.Before(n.until) {
		return ""
	}
	return n.refused
}

// settle records the outcome of a NEG-OPEN: answered (a NEG-MSG came
// back), refused (the relay said it cannot; its reason), or neither (a
// timeout, the session ending: nothing learnt). A probe's settle lets the
// waiting batches go on.
func (n *nip77Support) settle(probe, answered bool, refused string, now time.Time) {
	n.mu.Lock()
	defer n.mu.Unlock()
	switch {
	case answered:
		n.supported, n.refused = true, ""
	case refused != "" && !n.supported:
		n.refused, n.until = refused, now.Add(nip77Reprobe)
	}
	if probe && n.probing != nil {
		close(n.probing)
		n.probing = nil
	}
}

// nip77Verdict reads a NEG-OPEN's outcome: answered when the relay sent a
// NEG-MSG (rounds) or a NEG-ERR other than a refusal of the protocol (it
// understood the NEG-OPEN: the refusal is of the filter, not of NIP-77);
// refusal when, before any NEG-MSG, it said it cannot (a NOTICE, a NEG-ERR
// naming the protocol as disabled or unknown). A timeout or a lost
// connection says neither.
func nip77Verdict(rounds int, err error) (answered bool, refusal string) {
	if err == nil || rounds > 0 {
		return true, ""
	}
	var ue *negsync.UnsupportedError
	if !errors.As(err, &ue) {
		return false, ""
	}
	switch {
	case strings.HasPrefix(ue.Reason, "NOTICE: "):
		return false, ue.Reason
	case strings.HasPrefix(ue.Reason, "NEG-ERR"):
		if nip77Refused.MatchString(ue.Reason) {
			return false, ue.Reason
		}
		return true, ""
	}
	return false, ""
}

// nip77Refused matches a NEG-ERR that refuses the protocol itself rather
// than one filter.
var nip77Refused = regexp.MustCompile(`(?i)disabled|unsupported|not supported|unknown|not implemented`)
