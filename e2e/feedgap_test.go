package e2e

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"
)

// The built relay and discovery, each its own NATS user under the
// manifests' configuration; the relay's NATS connection alone is cut (its
// node lost, discovery's not). Announcements published meanwhile never
// reach the relay's live subscribers, and before decision 0070 nothing told
// them: discovery's websocket stayed up, and a faults row left 193 roots out
// of its index. Now the relay drops its clients with a NOTICE that says
// why, discovery's session is lost and comes back live, and the relay
// counts the drop.
func TestRelayDropsClientsAfterItsNATSReconnects(t *testing.T) {
	d := StartDeployment(t, DeploymentOptions{PostgresURL: postgresURL(t), Auth: true, RelayNATSProxy: true})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	metric := func(p *Proc, name string) float64 {
		m := map[string]float64{}
		if err := scrapeInto(ctx, p.MetricsAddr, m); err != nil {
			return -1
		}
		return MetricSum(m, name)
	}
	logCount := func(p *Proc, msg string) int {
		b, _ := os.ReadFile(p.Log)
		return strings.Count(string(b), msg)
	}
	const connected = "self-subscription connected"
	waitFor(t, ctx, "discovery's self-subscription live", func() bool {
		return metric(d.Discovery, "grasp_discovery_self_subscription_connected") == 1
	})
	sessions := logCount(d.Discovery, connected)
	if n := metric(d.Relay, "grasp_relay_feed_gap_drops_total"); n != 0 {
		t.Fatalf("feed gap drops before any gap: %v", n)
	}

	d.RelayNATS.Cut()
	waitFor(t, ctx, "the relay dropping its clients after its NATS connection reconnected", func() bool {
		return metric(d.Relay, "grasp_relay_feed_gap_drops_total") == 1
	})
	waitFor(t, ctx, "discovery logging the relay's NOTICE and a new live session", func() bool {
		return logCount(d.Discovery, "own relay sent a NOTICE") >= 1 &&
			logCount(d.Discovery, "self-subscription lost") >= 1 &&
			logCount(d.Discovery, connected) > sessions &&
			metric(d.Discovery, "grasp_discovery_self_subscription_connected") == 1
	})
	if n := logCount(d.Relay, "dropped every client"); n != 1 {
		t.Errorf("the relay logged %d drops, want 1", n)
	}
}
