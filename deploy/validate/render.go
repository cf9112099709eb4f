// Package validate checks the deployment files of grasp-sync — the
// kustomize overlays of k8s/ and deploy/compose — against the code they
// deploy: every object decodes strictly into its API type, every GRASP_*
// variable is a real configuration field of the service it is given to,
// probes hit the paths and ports the services serve, images are the ones the
// Makefile builds, and the NATS users' permissions are exactly what the code
// publishes and consumes. It runs in `make test`, without a cluster.
package validate

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"

	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
)

// Object is one rendered Kubernetes object: its identity and its JSON.
type Object struct {
	APIVersion string
	Kind       string
	Name       string
	Namespace  string
	// JSON is the object as kustomize rendered it.
	JSON []byte
}

// ID names the object in test messages, e.g. "apps/v1 Deployment grasp/grasp-relay".
func (o Object) ID() string {
	return fmt.Sprintf("%s %s %s/%s", o.APIVersion, o.Kind, o.Namespace, o.Name)
}

// Render builds one kustomization directory (an overlay) exactly as
// `kubectl apply -k dir` would, with kustomize's Go API.
func Render(dir string) ([]Object, error) {
	k := krusty.MakeKustomizer(krusty.MakeDefaultOptions())
	m, err := k.Run(filesys.MakeFsOnDisk(), dir)
	if err != nil {
		return nil, fmt.Errorf("kustomize build %s: %w", dir, err)
	}
	var out []Object
	for _, r := range m.Resources() {
		js, err := r.MarshalJSON()
		if err != nil {
			return nil, fmt.Errorf("%s: %s %s: %w", dir, r.GetKind(), r.GetName(), err)
		}
		out = append(out, Object{
			APIVersion: r.GetApiVersion(),
			Kind:       r.GetKind(),
			Name:       r.GetName(),
			Namespace:  r.GetNamespace(),
			JSON:       js,
		})
	}
	return out, nil
}

// Overlays lists the overlay directories under k8sDir/overlays: every one is
// something an operator may apply, so every one is validated.
func Overlays(k8sDir string) ([]string, error) {
	entries, err := os.ReadDir(filepath.Join(k8sDir, "overlays"))
	if err != nil {
		return nil, fmt.Errorf("list overlays: %w", err)
	}
	var dirs []string
	for _, e := range entries {
		if e.IsDir() {
			dirs = append(dirs, filepath.Join(k8sDir, "overlays", e.Name()))
		}
	}
	sort.Strings(dirs)
	return dirs, nil
}
