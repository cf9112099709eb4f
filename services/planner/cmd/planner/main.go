// Command planner runs the planner alone.
package main

import (
	"context"

	"github.com/grasp-sync/grasp-sync/pkg/clock"
	"github.com/grasp-sync/grasp-sync/pkg/service"
	"github.com/grasp-sync/grasp-sync/services/planner"
)

func main() {
	var c planner.Config
	service.Main("planner", &c, func(ctx context.Context, env *service.Env) error {
		return planner.New(c, env.Bus, clock.Real{}, env.Log, env.Registry).Run(ctx)
	})
}
