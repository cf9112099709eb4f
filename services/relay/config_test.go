package relay

import (
	"testing"

	"github.com/grasp-sync/grasp-sync/pkg/config"
)

// TestPolicyLimitsFromEnvironment: the relay reads the policy's limits
// under GRASP_POLICY_*, and still under their former GRASP_RELAY_* names.
func TestPolicyLimitsFromEnvironment(t *testing.T) {
	t.Setenv("GRASP_POLICY_MAX_TAGS", "2500")
	t.Setenv("GRASP_RELAY_MAX_TAG_VALUE_BYTES", "1000")
	t.Setenv("GRASP_POLICY_MAX_FUTURE_SKEW", "1h")
	var cfg Config
	if err := config.Load(&cfg); err != nil {
		t.Fatal(err)
	}
	if cfg.MaxTags != 2500 || cfg.MaxTagValueBytes != 1000 || cfg.MaxEventBytes != 262144 || cfg.MaxFutureSkew.Hours() != 1 {
		t.Fatalf("limits %+v", cfg.Limits)
	}
	r := New(cfg, nil, nil, discard())
	if lim := r.Info().Limitation; lim.MaxEventTags != 2500 || lim.CreatedAtUpperLimit != 3600 {
		t.Fatalf("NIP-11 limitation %+v", lim)
	}
}

// TestFixedLimitsNotRead: the REQ limits and the write timeout are fixed,
// so their former variables do nothing.
func TestFixedLimitsNotRead(t *testing.T) {
	t.Setenv("GRASP_RELAY_MAX_LIMIT", "10")
	t.Setenv("GRASP_RELAY_MAX_SUBSCRIPTIONS", "1")
	var cfg Config
	if err := config.Load(&cfg); err != nil {
		t.Fatal(err)
	}
	r := New(cfg, nil, nil, discard())
	if lim := r.Info().Limitation; lim.MaxLimit != 500 || lim.MaxSubscriptions != 200 {
		t.Fatalf("NIP-11 limitation %+v", lim)
	}
}
