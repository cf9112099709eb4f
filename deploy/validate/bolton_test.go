package validate

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/grasp-sync/grasp-sync/pkg/relayurl"
	"sigs.k8s.io/yaml"
)

// targetRelayEnv is the variable that puts a deployment in bolt-on mode
// (issue 18): no own relay, sync into the GRASP relay it names.
const targetRelayEnv = "GRASP_TARGET_RELAY"

// boltOnEnv are the bolt-on settings (docs/bolt-on.md).
var boltOnEnv = []string{
	targetRelayEnv,
	"GRASP_TARGET_PUBLISH_RATE",
	"GRASP_TARGET_PUBLISH_BURST",
	"GRASP_TARGET_PUBLISH_CONCURRENCY",
	"GRASP_TARGET_AUTH_KEY",
}

var boltOnInCode = sync.OnceValue(func() bool {
	for _, svc := range append([]string{"graspd"}, Services...) {
		fields, err := AllEnvNames(repoRoot, svc)
		if err == nil && fields[targetRelayEnv] {
			return true
		}
	}
	return false
})

// boltOnPending reports whether name is a bolt-on setting the code does not
// read yet: the deployment files for bolt-on mode were written alongside
// the code, so until some service reads GRASP_TARGET_RELAY they are accepted
// unchecked (logged). Once the code has it, every check applies.
func boltOnPending(t *testing.T, name string) bool {
	t.Helper()
	if !slices.Contains(boltOnEnv, name) || boltOnInCode() {
		return false
	}
	t.Logf("%s: no service reads %s yet (issue 18); accepted unchecked", name, targetRelayEnv)
	return true
}

// isBoltOn reports whether an overlay runs in bolt-on mode: some workload
// is given GRASP_TARGET_RELAY.
func isBoltOn(envs map[string]map[string]string) bool {
	for _, env := range envs {
		if env[targetRelayEnv] != "" {
			return true
		}
	}
	return false
}

// checkBoltOn: a bolt-on overlay runs no own relay and nothing refers to
// it; every workload that reads GRASP_TARGET_RELAY gets it, all the same
// ws(s) URL; discovery and the ingester have it; and the NetworkPolicies let
// those pods reach the target's port.
func checkBoltOn(t *testing.T, r rendered, envs map[string]map[string]string, seen map[string]bool) {
	t.Helper()
	if seen["relay"] {
		t.Error("a bolt-on overlay runs the own relay as well")
	}
	for _, o := range r.objs {
		if o.Name == "grasp-relay" {
			t.Errorf("%s is left over in a bolt-on overlay", o.ID())
		}
	}
	target := ""
	for name, env := range envs {
		for k, v := range env {
			if strings.Contains(v, "grasp-relay") {
				t.Errorf("%s: %s=%s refers to the own relay, which a bolt-on overlay does not run", name, k, v)
			}
		}
		v, set := env[targetRelayEnv]
		if !set {
			continue
		}
		if _, _, err := relayurl.HostPort(v); err != nil || !strings.HasPrefix(v, "ws") {
			t.Errorf("%s: %s=%q is not a ws(s) URL", name, targetRelayEnv, v)
		}
		if target != "" && v != target {
			t.Errorf("%s: %s=%s, another workload has %s", name, targetRelayEnv, v, target)
		}
		target = v
		if env["GRASP_PUBLIC_URL"] == "" {
			t.Errorf("%s: bolt-on without GRASP_PUBLIC_URL (what announcements list for the target)", name)
		}
	}
	for _, name := range []string{"grasp-discovery", "grasp-ingester"} {
		if _, set := envs[name][targetRelayEnv]; !set {
			t.Errorf("%s has no %s", name, targetRelayEnv)
		}
	}
	if boltOnInCode() {
		for _, w := range r.workloads() {
			svc := strings.TrimPrefix(w.name, "grasp-")
			fields, err := AllEnvNames(repoRoot, svc)
			if err != nil {
				continue // not one of ours (NATS)
			}
			if _, set := envs[w.name][targetRelayEnv]; fields[targetRelayEnv] && !set {
				t.Errorf("%s reads %s but the overlay does not set it", w.name, targetRelayEnv)
			}
		}
	}
	if target == "" {
		return
	}
	_, port, _ := relayurl.HostPort(target)
	for _, w := range r.workloads() {
		if _, set := envs[w.name][targetRelayEnv]; set && !egressAllows(r, w.labels, port) {
			t.Errorf("no NetworkPolicy lets %s reach the target relay's port %s (%s)", w.name, port, target)
		}
	}
}

// egressAllows reports whether some NetworkPolicy selecting pods with
// these labels allows egress on TCP port (a rule without ports allows every
// port). Destinations are not checked: the target may be anywhere.
func egressAllows(r rendered, podLabels map[string]string, port string) bool {
	for _, v := range r.typed {
		np, ok := v.(*networkingv1.NetworkPolicy)
		if !ok || !slices.Contains(np.Spec.PolicyTypes, networkingv1.PolicyTypeEgress) {
			continue
		}
		sel, err := metav1.LabelSelectorAsSelector(&np.Spec.PodSelector)
		if err != nil || !sel.Matches(labels.Set(podLabels)) {
			continue
		}
		for _, rule := range np.Spec.Egress {
			if len(rule.Ports) == 0 {
				return true
			}
			for _, p := range rule.Ports {
				if (p.Protocol == nil || *p.Protocol == corev1.ProtocolTCP) && p.Port != nil && p.Port.String() == port {
					return true
				}
			}
		}
	}
	return false
}

// TestComposeBoltOn: the bolt-on compose file runs graspd in bolt-on mode
// beside a relay container: images we build, real variables that load, no
// own relay in the sidecar, and a ws(s) target.
func TestComposeBoltOn(t *testing.T) {
	images := makefileImages(t)
	data, err := os.ReadFile(filepath.Join(repoRoot, "deploy", "compose", "bolt-on.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Services map[string]struct {
			Image       string            `json:"image"`
			Environment map[string]string `json:"environment"`
		} `json:"services"`
	}
	if err := yaml.Unmarshal(data, &doc); err != nil {
		t.Fatal(err)
	}
	sidecars := 0
	for name, s := range doc.Services {
		img := imageRe.FindStringSubmatch(s.Image)[1]
		svc, ours := images[img]
		if !ours {
			if strings.Contains(img, "grasp") {
				t.Errorf("%s: image %s is not one `make images` builds", name, s.Image)
			}
			continue
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
		target := s.Environment[targetRelayEnv]
		if target == "" {
			continue
		}
		sidecars++
		if svc != "graspd" {
			t.Errorf("%s: the bolt-on example runs %s, want graspd", name, svc)
		}
		if list := s.Environment["GRASP_SERVICES"]; slices.Contains(strings.Split(list, ","), "relay") {
			t.Errorf("%s: GRASP_SERVICES=%s runs the own relay beside the target", name, list)
		}
		if s.Environment["GRASP_PUBLIC_URL"] == "" {
			t.Errorf("%s: no GRASP_PUBLIC_URL (what announcements list for the target)", name)
		}
		if _, _, err := relayurl.HostPort(target); err != nil || !strings.HasPrefix(target, "ws") {
			t.Errorf("%s: %s=%q is not a ws(s) URL", name, targetRelayEnv, target)
		}
	}
	if sidecars != 1 {
		t.Errorf("%d services set %s, want one graspd", sidecars, targetRelayEnv)
	}
}
