// Command discovery runs discovery alone: it subscribes to the own relay
// and maintains the RepoSyncIndex in NATS KV.
package main

import (
	"context"

	"github.com/nbd-wtf/go-nostr"

	"github.com/grasp-sync/grasp-sync/pkg/clock"
	"github.com/grasp-sync/grasp-sync/pkg/policy"
	"github.com/grasp-sync/grasp-sync/pkg/service"
	"github.com/grasp-sync/grasp-sync/services/discovery"
)

type config struct {
	discovery.Config
	// PublicURL is the public websocket URL of the relay this deployment
	// serves (ws:// or wss://): the repositories whose announcements list
	// it are the ones discovery indexes.
	PublicURL string `envconfig:"PUBLIC_URL" required:"true"`
}

func main() {
	var c config
	service.Main("discovery", &c, func(ctx context.Context, env *service.Env) error {
		if c.RelayURL == "" {
			c.RelayURL = c.PublicURL
		}
		pol := &policy.Policy{ServiceURL: c.PublicURL}
		d := discovery.New(c.Config, env.Bus, c.PublicURL, func(e *nostr.Event) bool { return pol.ListsService(e) }, clock.Real{}, env.Log, env.Registry)
		env.Health.AddReadiness("self-subscription", d.Ready)
		return d.Run(ctx)
	})
}
