package planner

import (
	"testing"
	"time"

	"github.com/grasp-sync/grasp-sync/pkg/config"
)

func TestConfigFromEnvironment(t *testing.T) {
	var d Config
	if err := config.Load(&d); err != nil || d.Rules != DefaultRules() {
		t.Fatalf("environment defaults %+v differ from DefaultRules %+v (%v)", d.Rules, DefaultRules(), err)
	}
	t.Setenv("GRASP_PLANNER_MAX_LIVE_FILTERS", "40")
	t.Setenv("GRASP_PLANNER_QUICK_RECONNECT", "10m")
	t.Setenv("GRASP_BOOTSTRAP_RELAYS", "wss://a.example,wss://b.example")
	// Fixed rules are not read: a former variable does nothing.
	t.Setenv("GRASP_PLANNER_CONSOLIDATE_PER_TICK", "0")
	t.Setenv("GRASP_PLANNER_LEASE_KEY", "other")
	var c Config
	if err := config.Load(&c); err != nil {
		t.Fatal(err)
	}
	if c.MaxLiveFilters != 40 || c.QuickReconnect != 10*time.Minute || c.ResyncMin != 23*time.Hour ||
		c.MaxFiltersPerCommand != 50 || c.ConsolidatePerTick != 2 || c.LeaseKey != "" || len(c.BootstrapRelays) != 2 || c.ID == "" {
		t.Fatalf("config %+v", c)
	}
	t.Setenv("GRASP_PLANNER_RESYNC_MAX", "1h")
	if err := config.Load(&Config{}); err == nil {
		t.Fatal("resync max below min accepted")
	}
}
