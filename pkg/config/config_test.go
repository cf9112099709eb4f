package config_test

import (
	"strings"
	"testing"
	"time"

	"github.com/grasp-sync/grasp-sync/pkg/config"
)

type spec struct {
	Window time.Duration `envconfig:"WINDOW" default:"5s"`
	Shards int           `envconfig:"SHARDS" default:"16"`
}

func (s *spec) Validate() error {
	if s.Shards < 1 {
		return config.Invalid("SHARDS", s.Shards, "must be at least 1")
	}
	return nil
}

func TestLoad(t *testing.T) {
	tests := []struct {
		name    string
		env     map[string]string
		wantErr string
	}{
		{name: "defaults"},
		{name: "bad duration", env: map[string]string{"GRASP_WINDOW": "soon"}, wantErr: `GRASP_WINDOW="soon"`},
		{name: "bad int", env: map[string]string{"GRASP_SHARDS": "x"}, wantErr: `GRASP_SHARDS="x"`},
		{name: "invalid", env: map[string]string{"GRASP_SHARDS": "0"}, wantErr: "GRASP_SHARDS=0: must be at least 1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for k, v := range tt.env {
				t.Setenv(k, v)
			}
			var s spec
			err := config.Load(&s)
			if tt.wantErr == "" {
				if err != nil || s.Window != 5*time.Second || s.Shards != 16 {
					t.Fatalf("Load = %v, %+v", err, s)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) || strings.Contains(err.Error(), "\n") {
				t.Fatalf("Load error = %v, want one line containing %q", err, tt.wantErr)
			}
		})
	}
}

type secrets struct {
	Store    string   `envconfig:"STORE_URL"`
	AuthKey  string   `envconfig:"FETCHER_AUTH_KEY"`
	LeaseKey string   `envconfig:"PLANNER_LEASE_KEY"`
	Relays   []string `envconfig:"RELAYS"`
	Nested   struct {
		Shards int `envconfig:"SHARDS"`
	}
}

func TestEffectiveMasksSecrets(t *testing.T) {
	s := secrets{Store: "postgres://grasp:hunter2@db:5432/grasp", AuthKey: "nsec1abc", LeaseKey: "planner", Relays: []string{"wss://a", "wss://b"}}
	s.Nested.Shards = 4
	got := config.Effective(&s)
	want := map[string]string{
		"GRASP_STORE_URL":         "postgres://grasp:xxxxx@db:5432/grasp",
		"GRASP_FETCHER_AUTH_KEY":  "***",
		"GRASP_PLANNER_LEASE_KEY": "planner", // a key name, not a secret
		"GRASP_RELAYS":            "wss://a,wss://b",
		"GRASP_SHARDS":            "4",
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s = %q, want %q", k, got[k], v)
		}
	}
	for k, v := range got {
		if strings.Contains(v, "hunter2") || strings.Contains(v, "nsec1abc") {
			t.Errorf("%s leaks a secret: %q", k, v)
		}
	}
}
