package discovery

import (
	"time"

	"github.com/grasp-sync/grasp-sync/pkg/config"
	"github.com/grasp-sync/grasp-sync/pkg/policy"
	"github.com/grasp-sync/grasp-sync/pkg/relayurl"
)

// Config is discovery's configuration (GRASP_* variables). Fields tagged
// ignored:"true" are not read from the environment: their default tag is
// the value (withDefaults fills it), and tests set them in code. They
// describe how discovery reads its own relay, which the deployment
// fixes; they were variables once (docs/configuration.md, "No longer
// read").
type Config struct {
	// RelayURL is the own relay discovery subscribes to.
	RelayURL string `envconfig:"DISCOVERY_RELAY_URL"`
	// TargetRelay is the GRASP relay bolt-on mode syncs into (services/ingester/target): discovery subscribes to it when GRASP_DISCOVERY_RELAY_URL is unset.
	TargetRelay string `envconfig:"TARGET_RELAY"`
	// BatchQuiet is how long index changes must have been quiet before
	// they are written: a single announcement reaches the planner after
	// this, not after the whole window (docs/decisions/0005-discovery-batch-quiet-period.md). A quiet period
	// longer than the window acts as the window.
	BatchQuiet time.Duration `ignored:"true" default:"150ms"`
	// BatchWindow is the longest a change waits to be written: it starts at
	// the first change after a flush and does not reset, so a stream of
	// changes that never pauses is still one index update per window. The
	// planner's quiet for a large stream (8 s, fixed) is longer, so those
	// updates count as one stream
	// (docs/decisions/0083-chunk-quiet-beyond-discovery-window.md).
	BatchWindow time.Duration `envconfig:"DISCOVERY_BATCH_WINDOW" default:"5s"`
	// PageSize is the limit of each history page: the own relay's
	// MaxLimit (500).
	PageSize int `ignored:"true" default:"500"`
	// MaxPages bounds one history read: 100,000 pages of 500, a backstop
	// no real history meets.
	MaxPages int `ignored:"true" default:"100000"`
	// RelayMinCap is the smallest per-REQ result cap assumed of the own
	// relay: a page of at least min(this, PageSize) events that all share
	// one created_at may hide more of that second, which is then read on
	// its own (NIP-77, or REQs split by kind;
	// docs/decisions/0021-history-crowded-second.md). It must not exceed
	// the own relay's MaxLimit (500, relay.Config).
	RelayMinCap int `ignored:"true" default:"100"`
	// ReconnectBuffer is subtracted from the moment the live stream was lost
	// to get the since of the catch-up after a reconnect: 15 min, the
	// planner's propagation buffer (GRASP_PLANNER_SINCE_BUFFER) too.
	ReconnectBuffer time.Duration `ignored:"true" default:"15m"`
	// FeedGapMinLive is the shortest a live session lasts, after its
	// history read, before it is ended because NATS reconnected (and the
	// whole history read again): a connection that keeps reconnecting costs
	// at most one whole-history read per FeedGapMinLive
	// (docs/decisions/0068-discovery-feed-gap-rereads.md).
	FeedGapMinLive time.Duration `ignored:"true" default:"1m"`
	// BackoffBase and BackoffMax bound the reconnect backoff (doubling from
	// base up to max; reset once a connection is live).
	BackoffBase time.Duration `envconfig:"DISCOVERY_BACKOFF_BASE" default:"1s"`
	BackoffMax  time.Duration `envconfig:"DISCOVERY_BACKOFF_MAX" default:"1m"`
	// ResyncInterval is how often the index is rebuilt from the relay's
	// whole history (0: never). A catch-up with since misses events stored
	// during a disconnection with an older created_at (synced history); the
	// resync picks them up. The writers' stored-event announcements on NATS
	// (grasp.stored.<kind>) cover such gaps while NATS is up; the resync
	// remains the backstop.
	ResyncInterval time.Duration `envconfig:"DISCOVERY_RESYNC_INTERVAL" default:"24h" zero:"off"`
	// MaxRelaysPerAnnouncement bounds the relays one announcement adds.
	MaxRelaysPerAnnouncement int `envconfig:"MAX_RELAYS_PER_ANNOUNCEMENT" default:"20" zero:"off"`
	// RelayAllowlist names internal hosts (or host:port) sync may dial
	// anyway, for tests and local demos.
	RelayAllowlist []string `envconfig:"RELAY_ALLOWLIST"`
	// BootstrapRelays are published under the index bucket's reserved key
	// so the planner keeps them connected whether or not a repository lists
	// them.
	BootstrapRelays []string `envconfig:"BOOTSTRAP_RELAYS"`
	// Archive names the repositories synced although their announcements
	// do not list us (GRASP_ARCHIVE_*, GRASP-05), the same settings the
	// relay and the ingester judge announcements by and the planner asks
	// for relay lists by.
	policy.Archive
	// ArchiveMaxRepos bounds the archived repositories matched only by an identifier entry of GRASP_ARCHIVE_WHITELIST or by GRASP_ARCHIVE_ALL, which anyone can publish: past it further ones are stored but not synced (logged, and counted by grasp_discovery_archive_over_limit). Repositories matched by an npub entry are always synced and not counted.
	ArchiveMaxRepos int `envconfig:"ARCHIVE_MAX_REPOS" default:"1000"`
	// InstanceID names this instance in the discovery lease (default
	// host-pid).
	InstanceID string `envconfig:"DISCOVERY_ID"`
}

// Validate checks what the defaults cannot guarantee and normalises the
// bootstrap relays.
func (c *Config) Validate() error {
	switch {
	case c.BatchWindow <= 0:
		return config.Invalid("DISCOVERY_BATCH_WINDOW", c.BatchWindow, "must be positive")
	case c.BackoffBase <= 0:
		return config.Invalid("DISCOVERY_BACKOFF_BASE", c.BackoffBase, "must be positive")
	case c.BackoffMax < c.BackoffBase:
		return config.Invalid("DISCOVERY_BACKOFF_MAX", c.BackoffMax, "must not be below GRASP_DISCOVERY_BACKOFF_BASE")
	case c.ArchiveMaxRepos < 0:
		return config.Invalid("ARCHIVE_MAX_REPOS", c.ArchiveMaxRepos, "must not be negative")
	}
	for i, raw := range c.BootstrapRelays {
		u, err := relayurl.Normalize(raw)
		if err != nil {
			return config.Invalid("BOOTSTRAP_RELAYS", raw, err.Error())
		}
		c.BootstrapRelays[i] = u
	}
	return nil
}

// withDefaults fills what a Config built in code (not from the
// environment) may leave zero, from the default tags (config.FillDefaults;
// the fields tagged zero:"off" stay as they are), then what depends on
// other fields.
func (c Config) withDefaults() Config {
	config.FillDefaults(&c)
	c.BatchQuiet = min(c.BatchQuiet, c.BatchWindow)
	if c.BackoffMax < c.BackoffBase {
		c.BackoffMax = max(time.Minute, c.BackoffBase)
	}
	if c.InstanceID == "" {
		c.InstanceID = config.InstanceID()
	}
	if c.RelayURL == "" {
		c.RelayURL = c.TargetRelay
	}
	return c
}
