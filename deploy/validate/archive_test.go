package validate

import (
	"slices"
	"testing"

	"github.com/grasp-sync/grasp-sync/pkg/policy"
	"github.com/grasp-sync/grasp-sync/services/discovery"
	"github.com/grasp-sync/grasp-sync/services/ingester"
	"github.com/grasp-sync/grasp-sync/services/planner"
	"github.com/grasp-sync/grasp-sync/services/relay"
)

// TestOneArchiveConfiguration: the relay, the ingester, discovery and the
// planner read the archive settings (GRASP_ARCHIVE_*, GRASP-05) and every
// overlay and the compose file give them the same values, so what the
// policy accepts as archived, what discovery syncs, whose relay lists layer 1
// asks for and what the relay keeps read-only agree. GRASP_ARCHIVE_WHITELIST is one variable (read from one string),
// not a struct walked into.
func TestOneArchiveConfiguration(t *testing.T) {
	want := EnvNames(&policy.Archive{})
	if !slices.Contains(want, "GRASP_ARCHIVE_WHITELIST") || !slices.Contains(want, "GRASP_ARCHIVE_ALL") {
		t.Fatalf("policy.Archive reads %v", want)
	}
	for name, spec := range map[string]any{"relay": &relay.Config{}, "ingester": &ingester.Config{}, "discovery": &discovery.Config{}, "planner": &planner.Config{}} {
		got := EnvNames(spec)
		for _, n := range want {
			if !slices.Contains(got, n) {
				t.Errorf("the %s does not read %s", name, n)
			}
		}
	}
	images := makefileImages(t)
	for overlay, objs := range renderAll(t) {
		r := load(t, objs)
		envs := map[string]map[string]string{}
		for _, w := range r.workloads() {
			for _, c := range w.pod.Containers {
				m := imageRe.FindStringSubmatch(c.Image)
				if svc, ours := images[m[1]]; ours && (svc == "relay" || svc == "ingester" || svc == "discovery" || svc == "planner") {
					envs[svc] = map[string]string{}
					for _, e := range c.Env {
						envs[svc][e.Name] = e.Value
					}
				}
			}
		}
		compareArchive(t, overlay, want, envs)
	}
	doc := readCompose(t, "compose.yaml")
	compareArchive(t, "compose", want, map[string]map[string]string{
		"relay": doc.Services["relay"].Environment, "ingester": doc.Services["ingester"].Environment,
		"discovery": doc.Services["discovery"].Environment, "planner": doc.Services["planner"].Environment,
	})
}

func compareArchive(t *testing.T, where string, names []string, envs map[string]map[string]string) {
	t.Helper()
	for _, n := range names {
		for _, svc := range []string{"ingester", "discovery", "planner"} {
			if envs["relay"][n] != envs[svc][n] {
				t.Errorf("%s: %s is %q for the relay and %q for the %s: the relay, ingester, discovery and planner must agree",
					where, n, envs["relay"][n], envs[svc][n], svc)
			}
		}
	}
}
