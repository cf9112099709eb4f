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

// The env file lists exactly the settings of configdoc.EnvGroups, each
// once and each one of graspd's variables on the configuration page, at
// most MaxEnvSettings, commented out at its default unless assigned; it
// refuses to assign a variable that is not one of them.
func TestEnvFileListsGraspdVariables(t *testing.T) {
	root := filepath.Join("..", "..", "..")
	got, err := configdoc.EnvFile(root, map[string]string{"GRASP_DATA_DIR": "/var/lib/grasp-sync"})
	if err != nil {
		t.Fatal(err)
	}
	page, err := configdoc.Generate(root)
	if err != nil {
		t.Fatal(err)
	}
	// graspd's section of the page: from "## graspd" to the next section.
	section := string(page)[strings.Index(string(page), "## graspd\n"):]
	section = section[:strings.Index(section[1:], "\n## ")+1]
	onPage := map[string]bool{}
	for _, line := range strings.Split(section, "\n") {
		if name, ok := strings.CutPrefix(line, "| `GRASP_"); ok {
			onPage["GRASP_"+name[:strings.Index(name, "`")]] = true
		}
	}
	if len(onPage) < 50 {
		t.Fatalf("found only %d variables in graspd's section of the page", len(onPage))
	}
	want := map[string]bool{}
	for _, g := range configdoc.EnvGroups {
		for _, n := range g.Names {
			want[n] = true
		}
	}
	if len(want) > configdoc.MaxEnvSettings {
		t.Errorf("the env file offers %d settings, more than %d", len(want), configdoc.MaxEnvSettings)
	}
	seen := map[string]bool{}
	for _, line := range strings.Split(string(got), "\n") {
		assign := strings.TrimPrefix(line, "#")
		name, val, ok := strings.Cut(assign, "=")
		if !ok || !strings.HasPrefix(name, "GRASP_") || strings.Contains(name, " ") {
			continue
		}
		if seen[name] {
			t.Errorf("%s appears twice", name)
		}
		seen[name] = true
		if !want[name] || !onPage[name] {
			t.Errorf("env file has %s, which is not a setting of the groups on graspd's section of the page", name)
		}
		if commented := strings.HasPrefix(line, "#"); commented == (name == "GRASP_DATA_DIR") {
			t.Errorf("line %q: only GRASP_DATA_DIR is assigned", line)
		}
		if name == "GRASP_DATA_DIR" && val != "/var/lib/grasp-sync" {
			t.Errorf("GRASP_DATA_DIR=%q", val)
		}
	}
	for name := range want {
		if !seen[name] {
			t.Errorf("env file lacks %s", name)
		}
	}
	if _, err := configdoc.EnvFile(root, map[string]string{"GRASP_INGESTER_FETCH_BATCH": "64"}); err == nil {
		t.Error("assigning a tuning variable in the env file: no error")
	}
	if _, err := configdoc.EnvFile(root, map[string]string{"GRASP_NO_SUCH": "x"}); err == nil || !strings.Contains(err.Error(), "GRASP_NO_SUCH") {
		t.Errorf("assigning an unknown variable: err = %v, want one naming it", err)
	}
}
