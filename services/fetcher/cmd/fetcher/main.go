// Command fetcher runs one fetcher replica for its shards.
package main

import (
	"context"
	"fmt"

	"golang.org/x/sync/errgroup"

	"github.com/grasp-sync/grasp-sync/pkg/clock"
	"github.com/grasp-sync/grasp-sync/pkg/rejected"
	"github.com/grasp-sync/grasp-sync/pkg/service"
	"github.com/grasp-sync/grasp-sync/pkg/store"
	"github.com/grasp-sync/grasp-sync/services/fetcher"
)

type config struct {
	fetcher.Config
	// StoreURL is the shared event store (PostgreSQL) read for the local set
	// of NIP-77 reconciliation; empty: the local set is only what the policy
	// refused, so NIP-77 saves little, catch-ups keep their since on NIP-77
	// relays and the daily resync's misses are not counted.
	StoreURL string `envconfig:"STORE_URL"`
}

func main() {
	var c config
	service.Main("fetcher", &c, func(ctx context.Context, env *service.Env) error {
		kv, err := rejected.Open(ctx, env.Bus)
		if err != nil {
			return err
		}
		refused := rejected.NewCache()
		local := fetcher.UnionLocalSet{refused}
		if c.StoreURL != "" {
			st, err := store.Open(c.StoreURL)
			if err != nil {
				return fmt.Errorf("GRASP_STORE_URL: %w", err)
			}
			defer st.Close()
			local = append(local, fetcher.StoreLocalSet{Store: st})
		}
		g, ctx := errgroup.WithContext(ctx)
		g.Go(func() error { return refused.Run(ctx, kv) })
		f := fetcher.New(c.Config, env.Bus, clock.Real{}, env.Log, env.Registry).WithReplicas(env.Options.Replicas)
		if c.StoreURL != "" {
			f.WithLocalSet(local)
		} else {
			f.WithRefusalsLocalSet(local)
		}
		g.Go(func() error { return f.Run(ctx) })
		return g.Wait()
	})
}
