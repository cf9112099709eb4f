package config_test

import (
	"os"
	"strconv"
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

type RenamedLimits struct {
	MaxTags int           `envconfig:"POLICY_MAX_TAGS" default:"2000" formerly:"RELAY_MAX_TAGS"`
	Skew    time.Duration `envconfig:"POLICY_SKEW" default:"15m" formerly:"RELAY_SKEW"`
}

type renamedSpec struct {
	RenamedLimits
	Other int `envconfig:"OTHER" default:"1"`
}

// TestFormerNames: a renamed variable is still read under its former name,
// the new name wins when both agree, and two different values are an error.
func TestFormerNames(t *testing.T) {
	tests := []struct {
		name     string
		env      map[string]string
		wantTags int
		wantSkew time.Duration
		wantErr  string
	}{
		{name: "defaults", wantTags: 2000, wantSkew: 15 * time.Minute},
		{name: "new name", env: map[string]string{"GRASP_POLICY_MAX_TAGS": "30"}, wantTags: 30, wantSkew: 15 * time.Minute},
		{name: "former name", env: map[string]string{"GRASP_RELAY_MAX_TAGS": "40", "GRASP_RELAY_SKEW": "1m"}, wantTags: 40, wantSkew: time.Minute},
		{name: "both agree", env: map[string]string{"GRASP_RELAY_MAX_TAGS": "50", "GRASP_POLICY_MAX_TAGS": "50"}, wantTags: 50, wantSkew: 15 * time.Minute},
		{name: "both disagree", env: map[string]string{"GRASP_RELAY_MAX_TAGS": "50", "GRASP_POLICY_MAX_TAGS": "60"}, wantErr: `GRASP_POLICY_MAX_TAGS="60" and GRASP_RELAY_MAX_TAGS="50" disagree`},
		{name: "former name invalid", env: map[string]string{"GRASP_RELAY_MAX_TAGS": "many"}, wantErr: `GRASP_RELAY_MAX_TAGS="many": not a valid int`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for k, v := range tt.env {
				t.Setenv(k, v)
			}
			var s renamedSpec
			err := config.Load(&s)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("Load error = %v, want %q", err, tt.wantErr)
				}
				return
			}
			if err != nil || s.MaxTags != tt.wantTags || s.Skew != tt.wantSkew || s.Other != 1 {
				t.Fatalf("Load = %v, %+v; want MaxTags %d, Skew %s", err, s, tt.wantTags, tt.wantSkew)
			}
		})
	}
}

func TestInstanceIDNamesHostAndProcess(t *testing.T) {
	host, _ := os.Hostname()
	want := host + "-" + strconv.Itoa(os.Getpid())
	if got := config.InstanceID(); got != want {
		t.Errorf("InstanceID() = %q, want %q", got, want)
	}
}

type defaulted struct {
	Name     string          `default:"grasp"`
	Count    int             `default:"16"`
	Size     int64           `default:"4194304"`
	Rate     float64         `default:"2.5"`
	Wait     time.Duration   `default:"15s"`
	Hosts    []string        `default:"127.0.0.1,::1"`
	Bytes    config.ByteSize `default:"8MiB"`
	Untagged int
	Nested   struct {
		Depth uint `default:"3"`
	}
	EmbeddedDefaults
}

type EmbeddedDefaults struct {
	Inner int `default:"7"`
}

func TestFillDefaultsFillsZeroAndNegativeFields(t *testing.T) {
	var d defaulted
	config.FillDefaults(&d)
	if d.Name != "grasp" || d.Count != 16 || d.Size != 4<<20 || d.Rate != 2.5 || d.Wait != 15*time.Second ||
		strings.Join(d.Hosts, " ") != "127.0.0.1 ::1" || d.Bytes != 8<<20 || d.Untagged != 0 || d.Nested.Depth != 3 || d.Inner != 7 {
		t.Errorf("FillDefaults(zero) = %+v", d)
	}
	set := defaulted{Name: "x", Count: 1, Size: -1, Rate: -2, Wait: time.Second, Hosts: []string{"h"}, Untagged: 9}
	config.FillDefaults(&set)
	if set.Name != "x" || set.Count != 1 || set.Size != 4<<20 || set.Rate != 2.5 || set.Wait != time.Second ||
		len(set.Hosts) != 1 || set.Untagged != 9 {
		t.Errorf("FillDefaults kept the wrong fields: %+v", set)
	}
}

// TestFillDefaultsLeavesZeroOff: a field whose zero value means "off" in a
// Config built in code keeps it; the environment still gets its default.
func TestFillDefaultsLeavesZeroOff(t *testing.T) {
	var d struct {
		Resync  time.Duration `default:"24h" zero:"off"`
		Trusted string        `default:"127.0.0.1" zero:"off"`
		Window  time.Duration `default:"5s"`
	}
	config.FillDefaults(&d)
	if d.Resync != 0 || d.Trusted != "" || d.Window != 5*time.Second {
		t.Errorf("FillDefaults = %+v, want Resync and Trusted left zero, Window 5s", d)
	}
}

func TestFillDefaultsRefusesBadTags(t *testing.T) {
	for name, spec := range map[string]any{
		"unparsable": &struct {
			N int `default:"many"`
		}{},
		"bool": &struct {
			B bool `default:"true"`
		}{},
		"not a pointer": struct{}{},
	} {
		t.Run(name, func(t *testing.T) {
			defer func() {
				if recover() == nil {
					t.Error("FillDefaults did not panic")
				}
			}()
			config.FillDefaults(spec)
		})
	}
}

// Every default tag of this package's test spec parses.
func TestFillDefaultsMatchesLoad(t *testing.T) {
	var loaded, filled spec
	if err := config.Load(&loaded); err != nil {
		t.Fatal(err)
	}
	config.FillDefaults(&filled)
	if loaded != filled {
		t.Errorf("Load = %+v, FillDefaults = %+v", loaded, filled)
	}
}
