package validate

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

// TestCompose: the compose file runs every service from the images the
// Makefile builds, with variables that are real configuration fields and
// values that load.
func TestCompose(t *testing.T) {
	images := makefileImages(t)
	data, err := os.ReadFile(filepath.Join(repoRoot, "deploy", "compose", "compose.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Services map[string]struct {
			Image       string            `json:"image"`
			Environment map[string]string `json:"environment"`
		} `json:"services"`
	}
	// sigs.k8s.io/yaml resolves the anchors and merge keys compose uses.
	if err := yaml.Unmarshal(data, &doc); err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for name, s := range doc.Services {
		img := imageRe.FindStringSubmatch(s.Image)[1]
		svc, ours := images[img]
		if !ours {
			if strings.Contains(img, "grasp") {
				t.Errorf("%s: image %s is not one `make images` builds", name, s.Image)
			}
			continue
		}
		seen[svc] = true
		fields, err := AllEnvNames(repoRoot, svc)
		if err != nil {
			t.Fatal(err)
		}
		for k := range s.Environment {
			if !fields[k] && !boltOnPending(t, k) {
				t.Errorf("%s: %s is not a configuration field of %s", name, k, svc)
			}
		}
		specs, _ := ServiceConfig(svc)
		for _, spec := range specs {
			loadEnv(t, s.Environment, spec)
		}
		if svc == "relay" {
			checkRelayTrustsProxy(t, s.Environment, dockerPeers)
		}
	}
	for _, svc := range Services {
		if !seen[svc] {
			t.Errorf("compose runs no %s", svc)
		}
	}
}
