package validate

import (
	"path/filepath"
	"testing"
)

// repoRoot is the repository, two levels above this module.
var repoRoot = filepath.Join("..", "..")

func k8sDir() string { return filepath.Join(repoRoot, "k8s") }

// renderAll renders every overlay once per test binary run.
func renderAll(t *testing.T) map[string][]Object {
	t.Helper()
	dirs, err := Overlays(k8sDir())
	if err != nil {
		t.Fatal(err)
	}
	if len(dirs) < 3 {
		t.Fatalf("found overlays %v, want at least dev, production and production-hpa", dirs)
	}
	out := map[string][]Object{}
	for _, d := range dirs {
		objs, err := Render(d)
		if err != nil {
			t.Fatal(err)
		}
		out[filepath.Base(d)] = objs
	}
	return out
}

func TestRenderOverlays(t *testing.T) {
	for name, objs := range renderAll(t) {
		t.Logf("%s: %d objects", name, len(objs))
		for _, o := range objs {
			t.Log("  ", o.ID())
		}
	}
}
