// Command fetcher runs one fetcher replica for its shards.
package main

import (
	"context"

	"github.com/grasp-sync/grasp-sync/pkg/clock"
	"github.com/grasp-sync/grasp-sync/pkg/service"
	"github.com/grasp-sync/grasp-sync/services/fetcher"
)

func main() {
	var c fetcher.Config
	service.Main("fetcher", &c, func(ctx context.Context, env *service.Env) error {
		return fetcher.New(c, env.Bus, clock.Real{}, env.Log, env.Registry).Run(ctx)
	})
}
