package e2e

import (
	"github.com/nbd-wtf/go-nostr"

	"github.com/grasp-sync/grasp-sync/services/graspd"
)

type nostrEvent = nostr.Event

type appWithMetrics = *graspd.App

func nostrTimestamp(unix int64) nostr.Timestamp { return nostr.Timestamp(unix) }
