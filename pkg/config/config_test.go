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
