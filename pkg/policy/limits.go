package policy

import (
	"time"

	"github.com/grasp-sync/grasp-sync/pkg/config"
)

// Bounds on the work one hostile event can cause.
const (
	// maxReferences caps how many distinct ids and coordinates of one event
	// are looked up (rule 5) and reported in Decision.Missing.
	maxReferences = 100
	// maxAnnouncements caps how many stored announcements sharing one
	// identifier are read to build a maintainer set.
	maxAnnouncements = 500
	// maxListedURLs caps how many clone and relays values are parsed when
	// deciding whether an announcement lists this service.
	maxListedURLs = 256
	// maxMaintainers caps the maintainers read from one announcement.
	maxMaintainers = 256
	// maxVersions caps the stored versions read for one replaceable key
	// (normally one; more only when a multi-writer store raced).
	maxVersions = 10
	// maxForwardScan caps the events read per forward-reference query; the
	// first one that may anchor the event suffices.
	maxForwardScan = 20
	// deletionBatch is how many ids one deletion-target query asks for.
	deletionBatch = 100
)

// Limits bounds the size of accepted events. A zero field means "use the
// default" (see DefaultLimits). They are the one configuration of the policy
// (GRASP_POLICY_*): the relay judges client events and the ingester synced
// events with the same values, so an event is accepted or refused the same
// way whichever path it arrives by (docs/decisions/0018-one-policy-configured-once.md). The former GRASP_RELAY_* names are still read.
type Limits struct {
	// MaxEventBytes bounds an accepted event's serialised size, for client
	// and synced events alike (formerly GRASP_RELAY_MAX_EVENT_BYTES, still
	// read).
	MaxEventBytes int `envconfig:"POLICY_MAX_EVENT_BYTES" default:"262144" formerly:"RELAY_MAX_EVENT_BYTES"`
	// MaxTags bounds an accepted event's number of tags, for client and
	// synced events alike (formerly GRASP_RELAY_MAX_TAGS, still read).
	MaxTags int `envconfig:"POLICY_MAX_TAGS" default:"2000" formerly:"RELAY_MAX_TAGS"`
	// MaxTagValueBytes bounds each element of each tag of an accepted
	// event, for client and synced events alike (formerly
	// GRASP_RELAY_MAX_TAG_VALUE_BYTES, still read). Patches carry big
	// content; tags stay small.
	MaxTagValueBytes int `envconfig:"POLICY_MAX_TAG_VALUE_BYTES" default:"65536" formerly:"RELAY_MAX_TAG_VALUE_BYTES"`
	// MaxFutureSkew is how far an accepted event's created_at may lie ahead
	// of the clock, for client and synced events alike.
	MaxFutureSkew time.Duration `envconfig:"POLICY_MAX_FUTURE_SKEW" default:"15m"`
}

// DefaultLimits returns the limits used for unset fields: 256 KiB events,
// 2000 tags, 64 KiB tag values, 15 minutes of clock skew (the default tags
// of Limits).
func DefaultLimits() Limits {
	return Limits{}.WithDefaults()
}

// limits returns the configured limits with defaults filled in.
func (p *Policy) limits() Limits { return p.Limits.WithDefaults() }

// WithDefaults returns l with its zero (or negative) fields set to their
// default tags, the same values GRASP_POLICY_* take when unset.
func (l Limits) WithDefaults() Limits {
	if l.MaxEventBytes > 0 && l.MaxTags > 0 && l.MaxTagValueBytes > 0 && l.MaxFutureSkew > 0 {
		// Every field set (a Policy built from a filled Config): no
		// reflection per evaluated event (~1.5 cpu-µs in BenchmarkIngest).
		// TestWithDefaultsFillsEachField fails if a new field is missing.
		return l
	}
	config.FillDefaults(&l)
	return l
}
