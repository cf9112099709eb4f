// Command relay runs the own relay alone, over a shared store.
package main

import (
	"context"
	"fmt"
	"net"

	"github.com/grasp-sync/grasp-sync/pkg/service"
	"github.com/grasp-sync/grasp-sync/pkg/store"
	"github.com/grasp-sync/grasp-sync/services/relay"
)

type config struct {
	relay.Config
	// StoreURL is the event store the relay serves and writes:
	// postgres://user:password@host/db, shared with the ingesters and any
	// other relay replica, or a directory for the embedded kv store when the
	// relay is the only process using it.
	StoreURL string `envconfig:"STORE_URL" required:"true"`
}

func main() {
	var c config
	service.Main("relay", &c, func(ctx context.Context, env *service.Env) error {
		st, err := store.Open(c.StoreURL)
		if err != nil {
			return fmt.Errorf("GRASP_STORE_URL: %w", err)
		}
		defer st.Close()
		ln, err := net.Listen("tcp", c.Addr)
		if err != nil {
			return fmt.Errorf("GRASP_RELAY_ADDR=%s: cannot listen: %w", c.Addr, err)
		}
		r := relay.New(c.Config, st, env.Bus, env.Log)
		env.Registry.MustRegister(r.Collectors()...)
		return r.Run(ctx, ln)
	})
}
