// Command ingester runs one ingester replica over a shared store.
package main

import (
	"context"
	"fmt"

	"github.com/grasp-sync/grasp-sync/pkg/service"
	"github.com/grasp-sync/grasp-sync/pkg/store"
	"github.com/grasp-sync/grasp-sync/services/ingester"
)

type config struct {
	ingester.Config
	// StoreURL is the event store every ingester replica writes:
	// postgres://user:password@host/db when several processes share it
	// (the usual case for the separate binaries), or a directory for the
	// embedded kv store when this is the only process using it.
	StoreURL string `envconfig:"STORE_URL" required:"true"`
	// PublicURL is the public websocket URL of the relay this deployment
	// serves (ws:// or wss://): the write policy accepts announcements that
	// list it, and the events about their repositories.
	PublicURL string `envconfig:"PUBLIC_URL" required:"true"`
}

func main() {
	var c config
	service.Main("ingester", &c, func(ctx context.Context, env *service.Env) error {
		st, err := store.Open(c.StoreURL)
		if err != nil {
			return fmt.Errorf("GRASP_STORE_URL: %w", err)
		}
		defer st.Close()
		return ingester.New(c.Config, env.Bus, st, c.PublicURL, env.Log, env.Registry).Run(ctx)
	})
}
