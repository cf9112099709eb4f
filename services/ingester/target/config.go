// Package target is bolt-on mode (docs/decisions/0035-bolt-on-target-relay.md): instead of storing accepted events in
// our own relay's store, the ingester publishes each one to a GRASP relay
// someone else runs (the target) with a plain NIP-01 EVENT, and the target's
// OK is the last word. graspd's own store stays as a mirror of what is known
// to be on the target: the write policy reads it and the fetcher's NIP-77
// local set comes from it, so a resync does not download the target.
//
// The Publisher owns the one connection to the target: it paces writes with
// a token bucket (rate and burst), bounds the EVENTs waiting for their OK
// (concurrency), answers NIP-42 challenges with a configured key, and backs
// off when the target answers "rate-limited:" or goes away. Store wraps the
// mirror so the ingester's pipeline (batches, parking, deletions, redelivery)
// works unchanged: a write is publish-then-mirror.
package target

import (
	"strings"
	"time"

	"github.com/grasp-sync/grasp-sync/pkg/config"
)

// Settings is bolt-on mode's configuration (GRASP_TARGET_* variables), read
// by graspd and by the separate ingester binary.
type Settings struct {
	// Relay, when set, is the GRASP relay (ws:// or wss://) accepted events are published to instead of our own relay: graspd then runs no relay of its own, discovery reads this one, and the event store is only a mirror of what is on it (bolt-on mode, docs/decisions/0035-bolt-on-target-relay.md). GRASP_PUBLIC_URL is then the address announcements list for the target (graspd: the target's URL when unset).
	Relay string `envconfig:"TARGET_RELAY"`
	// PublishRate is the steady rate, in events per second, at which events are published to the target (a token bucket with PublishBurst). Match the target's own limit: stock ngit-relay allows 3 events every 3 minutes per address, 0.0167.
	PublishRate float64 `envconfig:"TARGET_PUBLISH_RATE" default:"20"`
	// PublishBurst is how many events may be published at once before PublishRate applies (stock ngit-relay: 15).
	PublishBurst int `envconfig:"TARGET_PUBLISH_BURST" default:"15"`
	// PublishConcurrency bounds the events sent to the target and still waiting for its OK.
	PublishConcurrency int `envconfig:"TARGET_PUBLISH_CONCURRENCY" default:"4"`
	// AuthKey is the nostr secret key (hex or nsec) answering the target's NIP-42 AUTH challenges; relays that exempt authenticated pubkeys from their rate limits then let the sidecar write at full speed. A secret: pass it from a secret store.
	AuthKey string `envconfig:"TARGET_AUTH_KEY"`
	// Timeout bounds the wait for the target's OK to one EVENT; past it the connection is dropped and the event retried.
	Timeout time.Duration `envconfig:"TARGET_TIMEOUT" default:"15s"`
	// BackoffMax caps the pause after "rate-limited:" answers or a lost connection (the pause starts at 1 s and doubles; a success halves it).
	BackoffMax time.Duration `envconfig:"TARGET_BACKOFF_MAX" default:"3m"`
	// RefreshInterval is how often the mirror (what graspd knows to be on the target) is reconciled with the target by NIP-77, a minute after start and then at this interval: events others wrote to the target directly are downloaded into the mirror, so they are not fetched from remotes and published again. 0 disables it; a target without NIP-77 is skipped (the mirror then only knows what we published and what discovery reads there).
	RefreshInterval time.Duration `envconfig:"TARGET_REFRESH_INTERVAL" default:"24h" zero:"off"`
}

// Enabled reports whether bolt-on mode is configured.
func (c Settings) Enabled() bool { return c.Relay != "" }

// Validate checks the settings of bolt-on mode (nothing when it is off).
func (c Settings) Validate() error {
	if !c.Enabled() {
		return nil
	}
	if !strings.HasPrefix(c.Relay, "ws://") && !strings.HasPrefix(c.Relay, "wss://") {
		return config.Invalid("TARGET_RELAY", c.Relay, "want a ws:// or wss:// URL")
	}
	switch {
	case c.PublishRate <= 0:
		return config.Invalid("TARGET_PUBLISH_RATE", c.PublishRate, "must be positive")
	case c.PublishBurst < 1:
		return config.Invalid("TARGET_PUBLISH_BURST", c.PublishBurst, "must be at least 1")
	case c.PublishConcurrency < 1:
		return config.Invalid("TARGET_PUBLISH_CONCURRENCY", c.PublishConcurrency, "must be at least 1")
	case c.Timeout <= 0:
		return config.Invalid("TARGET_TIMEOUT", c.Timeout, "must be positive")
	case c.BackoffMax < time.Second:
		return config.Invalid("TARGET_BACKOFF_MAX", c.BackoffMax, "must be at least 1s")
	case c.RefreshInterval < 0:
		return config.Invalid("TARGET_REFRESH_INTERVAL", c.RefreshInterval, "must not be negative (0 disables)")
	}
	if c.AuthKey != "" {
		if _, err := config.SecretKey(c.AuthKey); err != nil {
			return config.Invalid("TARGET_AUTH_KEY", "(secret)", err.Error())
		}
	}
	return nil
}

// withDefaults fills zero fields from their default tags (a Config built in
// code behaves like one read from the environment).
func (c Settings) withDefaults() Settings {
	config.FillDefaults(&c)
	return c
}
