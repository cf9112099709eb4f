package configdoc_test

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/grasp-sync/grasp-sync/services/graspd/configdoc"
)

// The committed configuration page must equal what the structs say now.
func TestConfigurationDocIsCurrent(t *testing.T) {
	root := filepath.Join("..", "..", "..")
	got, err := configdoc.Generate(root)
	if err != nil {
		t.Fatal(err)
	}
	want, err := os.ReadFile(filepath.Join(root, "docs", "configuration.md"))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatal("docs/configuration.md is stale: run `make docs`")
	}
}

func TestGenerateFollowsEmbeddedStructs(t *testing.T) {
	got, err := configdoc.Generate(filepath.Join("..", "..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	page := string(got)
	for _, want := range []string{
		"`GRASP_NATS_URL`",                          // pkg/service.Common
		"`GRASP_RELAY_ADDR`",                        // relay.Config embedded in cmd/relay's config
		"`GRASP_STORE_URL` | string | **required**", // declared in cmd/relay's own struct
		"`GRASP_DISCOVERY_BATCH_WINDOW` | duration | `5s`",
		"`GRASP_PARKING_MAX_EVENTS`", // parking.Config nested in ingester.Config
	} {
		if !strings.Contains(page, want) {
			t.Errorf("generated page lacks %s", want)
		}
	}
}
