package validate

import (
	"os"
	"path/filepath"
	"reflect"
	"testing"

	"github.com/grasp-sync/grasp-sync/pkg/policy"
	"github.com/grasp-sync/grasp-sync/services/ingester"
	"github.com/grasp-sync/grasp-sync/services/relay"
)

// TestOnePolicyVariables: the relay and the ingester read the same policy
// variables, and every overlay and the compose file give them the same
// values, so client and synced events are judged alike.
func TestOnePolicyVariables(t *testing.T) {
	want := EnvNames(&policy.Limits{})
	if len(want) == 0 {
		t.Fatal("policy.Limits has no variables")
	}
	for name, spec := range map[string]any{"relay": &relay.Config{}, "ingester": &ingester.Config{}} {
		got := map[string]bool{}
		for _, n := range EnvNames(spec) {
			got[n] = true
		}
		for _, n := range want {
			if !got[n] {
				t.Errorf("the %s does not read %s", name, n)
			}
		}
	}

	docs, err := os.ReadFile(filepath.Join(repoRoot, "docs", "deploy.md"))
	if err != nil {
		t.Fatal(err)
	}
	images := makefileImages(t)
	for overlay, objs := range renderAll(t) {
		r := load(t, objs)
		envs := map[string]map[string]string{}
		for _, w := range r.workloads() {
			for _, c := range w.pod.Containers {
				m := imageRe.FindStringSubmatch(c.Image)
				if svc, ours := images[m[1]]; ours && (svc == "relay" || svc == "ingester") {
					envs[svc] = checkEnv(t, r, c, svc, string(docs))
				}
			}
		}
		comparePolicy(t, overlay, envs["relay"], envs["ingester"])
	}

	doc := readCompose(t, "compose.yaml")
	comparePolicy(t, "compose", doc.Services["relay"].Environment, doc.Services["ingester"].Environment)
}

func comparePolicy(t *testing.T, where string, relayEnv, ingesterEnv map[string]string) {
	t.Helper()
	lt := reflect.TypeFor[policy.Limits]()
	for i := range lt.NumField() {
		former := lt.Field(i).Tag.Get("formerly")
		if former == "" {
			continue
		}
		for _, env := range []map[string]string{relayEnv, ingesterEnv} {
			if _, set := env["GRASP_"+former]; set {
				t.Errorf("%s: GRASP_%s is the former name of GRASP_%s: set that, for the relay and the ingester",
					where, former, lt.Field(i).Tag.Get("envconfig"))
			}
		}
	}
	for _, n := range EnvNames(&policy.Limits{}) {
		if relayEnv[n] != ingesterEnv[n] {
			t.Errorf("%s: %s is %q for the relay and %q for the ingester: one policy judges client and synced events",
				where, n, relayEnv[n], ingesterEnv[n])
		}
	}
}
