package validate

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

// composeFile is what the checks read of a Compose file.
type composeFile struct {
	Services map[string]composeService `json:"services"`
}

// composeService is one service of a Compose file.
type composeService struct {
	Image       string            `json:"image"`
	Environment map[string]string `json:"environment"`
}

// readCompose reads deploy/compose/<file>; sigs.k8s.io/yaml resolves the
// anchors and merge keys compose uses.
func readCompose(t *testing.T, file string) composeFile {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(repoRoot, "deploy", "compose", file))
	if err != nil {
		t.Fatal(err)
	}
	var doc composeFile
	if err := yaml.Unmarshal(data, &doc); err != nil {
		t.Fatalf("%s: %v", file, err)
	}
	return doc
}

// checkComposeService checks a Compose service that runs one of our images
// (images maps image name → binary): its variables are real configuration
// fields of that binary and their values load. It returns the binary, or ""
// for an image that is not ours (NATS, PostgreSQL).
func checkComposeService(t *testing.T, name string, s composeService, images map[string]string) string {
	t.Helper()
	img := imageRe.FindStringSubmatch(s.Image)[1]
	svc, ours := images[img]
	if !ours {
		if strings.Contains(img, "grasp") {
			t.Errorf("%s: image %s is not one `make images` builds", name, s.Image)
		}
		return ""
	}
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
	return svc
}

// TestCompose: the compose file runs every service from the images the
// Makefile builds, with variables that are real configuration fields and
// values that load.
func TestCompose(t *testing.T) {
	images := makefileImages(t)
	seen := map[string]bool{}
	for name, s := range readCompose(t, "compose.yaml").Services {
		svc := checkComposeService(t, name, s, images)
		seen[svc] = true
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
