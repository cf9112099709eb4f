package fetcher

import (
	"context"
	"regexp"
	"strings"
	"sync"
	"time"

	"github.com/grasp-sync/grasp-sync/pkg/clock"
	"github.com/grasp-sync/grasp-sync/pkg/relaylimits"
)

// rateLimitText matches what relays say when they want us to slow down, in
// NOTICE, OK and CLOSED messages.
var rateLimitText = regexp.MustCompile(`(?i)rate[-_ ]?limit|too many|slow down|throttl`)

// IsRateLimit reports whether a relay message (a CLOSED reason, NOTICE or
// OK message) asks us to slow down. A refusal of a budget ("too many
// concurrent REQs", "too many filters") is not one: it is a property of
// the relay, learned and kept to (limits.go), never a cooldown of the
// whole relay.
func IsRateLimit(msg string) bool {
	if strings.HasPrefix(msg, "rate-limited:") {
		return true
	}
	return rateLimitText.MatchString(msg) && !relaylimits.Classify(msg).IsLimit()
}

// Cooldown is a relay's rate-limit state: after the relay asks us to slow
// down, new subscriptions and pages wait until it ends. The first cooldown
// lasts Base; one that starts within Base of the previous one's end doubles
// (up to Max). Waiting blocks only the caller, never other relays.
type Cooldown struct {
	Base, Max time.Duration
	Clock     clock.Clock

	mu    sync.Mutex
	until time.Time
	last  time.Duration
}

// Trigger starts (or extends) a cooldown and returns when it ends and
// whether a new one started (false while already cooling down).
func (c *Cooldown) Trigger() (until time.Time, started bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	now := c.Clock.Now()
	if now.Before(c.until) {
		return c.until, false
	}
	d := c.Base
	if c.last > 0 && now.Sub(c.until) < c.Base {
		d = min(c.last*2, c.Max)
	}
	c.last = d
	c.until = now.Add(d)
	return c.until, true
}

// Until is when the current cooldown ends (zero or past when none).
func (c *Cooldown) Until() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.until
}

// Wait returns once no cooldown is active, or with ctx's error.
func (c *Cooldown) Wait(ctx context.Context) error {
	for {
		c.mu.Lock()
		remaining := c.until.Sub(c.Clock.Now())
		c.mu.Unlock()
		if remaining <= 0 {
			return ctx.Err()
		}
		select {
		case <-c.Clock.After(remaining):
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}
