package e2e

import (
	"github.com/nbd-wtf/go-nostr"
)

type nostrEvent = nostr.Event

type appWithMetrics = Target

func nostrTimestamp(unix int64) nostr.Timestamp { return nostr.Timestamp(unix) }
