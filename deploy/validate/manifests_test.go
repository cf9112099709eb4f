package validate

import (
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/grasp-sync/grasp-sync/pkg/bus"
	"github.com/grasp-sync/grasp-sync/pkg/config"
	"github.com/grasp-sync/grasp-sync/pkg/obs"
	"github.com/grasp-sync/grasp-sync/services/ingester"
)

// imageRe splits an image reference into the name the Makefile builds and
// its tag.
var imageRe = regexp.MustCompile(`^([^:@]+)(?::([^@]+))?(?:@.+)?$`)

// makefileImages asks the Makefile which image names `make images` builds.
func makefileImages(t *testing.T) map[string]string {
	t.Helper()
	if _, err := exec.LookPath("make"); err != nil {
		t.Skip("SKIP: make is not installed; the image names come from `make print-images`")
	}
	out, err := exec.Command("make", "-s", "--no-print-directory", "-C", repoRoot, "print-images").Output()
	if err != nil {
		t.Fatalf("make print-images: %v", err)
	}
	images := map[string]string{} // image name → service
	for _, line := range strings.Fields(string(out)) {
		images[line] = line[strings.LastIndex(line, "/grasp-")+len("/grasp-"):]
	}
	if len(images) == 0 {
		t.Fatal("make print-images printed nothing")
	}
	return images
}

// secretValues returns a rendered Secret's values (generated Secrets carry
// base64 data, which the typed decode has already turned into bytes).
func secretValues(s *corev1.Secret) map[string]string {
	out := map[string]string{}
	for k, v := range s.Data {
		out[k] = string(v)
	}
	for k, v := range s.StringData {
		out[k] = v
	}
	return out
}

// operatorSecrets are the Secrets an overlay expects the operator to create
// (docs/deploy.md must explain each).
var operatorSecrets = []string{"grasp-nats-users", "grasp-store", "grasp-nats-tls", "grasp-relay-tls", "grasp-target-auth"}

// allowedPlainEnv are non-GRASP variables our images honour (Go runtime and
// crypto/x509).
var allowedPlainEnv = []string{"SSL_CERT_DIR", "SSL_CERT_FILE", "GOMAXPROCS", "GOMEMLIMIT"}

var refRe = regexp.MustCompile(`\$\(([A-Za-z_][A-Za-z0-9_]*)\)`)

type rendered struct {
	objs       []Object
	typed      []any
	configMaps map[string]*corev1.ConfigMap
	secrets    map[string]*corev1.Secret
}

func load(t *testing.T, objs []Object) rendered {
	t.Helper()
	r := rendered{objs: objs, configMaps: map[string]*corev1.ConfigMap{}, secrets: map[string]*corev1.Secret{}}
	for _, o := range objs {
		v, err := Decode(o)
		if err != nil {
			t.Error(err)
			continue
		}
		r.typed = append(r.typed, v)
		switch x := v.(type) {
		case *corev1.ConfigMap:
			r.configMaps[x.Name] = x
		case *corev1.Secret:
			r.secrets[x.Name] = x
		}
	}
	return r
}

// workload is a Deployment or StatefulSet's pod template.
type workload struct {
	kind, name string
	replicas   int32
	labels     map[string]string
	pod        corev1.PodSpec
}

func (r rendered) workloads() []workload {
	var out []workload
	for _, v := range r.typed {
		switch x := v.(type) {
		case *appsv1.Deployment:
			out = append(out, workload{"Deployment", x.Name, ptrOr(x.Spec.Replicas, 1), x.Spec.Template.Labels, x.Spec.Template.Spec})
		case *appsv1.StatefulSet:
			out = append(out, workload{"StatefulSet", x.Name, ptrOr(x.Spec.Replicas, 1), x.Spec.Template.Labels, x.Spec.Template.Spec})
		}
	}
	return out
}

func ptrOr[T any](p *T, d T) T {
	if p == nil {
		return d
	}
	return *p
}

// TestManifests validates every overlay: strict decoding, configuration,
// probes, images, pod hardening, disruption budgets, scaling objects.
func TestManifests(t *testing.T) {
	images := makefileImages(t)
	docs, err := os.ReadFile(filepath.Join(repoRoot, "docs", "deploy.md"))
	if err != nil {
		t.Fatal(err)
	}
	for overlay, objs := range renderAll(t) {
		t.Run(overlay, func(t *testing.T) {
			r := load(t, objs)
			seen := map[string]bool{}
			envs := map[string]map[string]string{} // workload → its grasp container's variables
			for _, w := range r.workloads() {
				t.Run(w.name, func(t *testing.T) {
					envs[w.name] = checkPod(t, r, w, images, string(docs), seen)
				})
			}
			boltOn := isBoltOn(envs)
			for _, svc := range Services {
				if !seen[svc] && !(boltOn && svc == "relay") {
					t.Errorf("overlay %s deploys no %s", overlay, svc)
				}
			}
			if boltOn {
				checkBoltOn(t, r, envs, seen)
			}
			checkPDBs(t, r)
			checkScaling(t, r, overlay)
		})
	}
}

// checkPod checks one workload and returns the variables of its (last)
// grasp-sync container.
func checkPod(t *testing.T, r rendered, w workload, images map[string]string, docs string, seen map[string]bool) map[string]string {
	p := w.pod
	var podEnv map[string]string
	if p.SecurityContext == nil || !ptrOr(p.SecurityContext.RunAsNonRoot, false) {
		t.Error("pod securityContext.runAsNonRoot is not true")
	}
	if p.SecurityContext == nil || p.SecurityContext.SeccompProfile == nil {
		t.Error("pod has no seccompProfile")
	}
	grace := ptrOr(p.TerminationGracePeriodSeconds, 30)
	for _, c := range p.Containers {
		sc := c.SecurityContext
		switch {
		case sc == nil:
			t.Errorf("container %s has no securityContext", c.Name)
		case ptrOr(sc.AllowPrivilegeEscalation, true):
			t.Errorf("container %s may escalate privileges", c.Name)
		case !ptrOr(sc.ReadOnlyRootFilesystem, false):
			t.Errorf("container %s has a writable root filesystem", c.Name)
		case sc.Capabilities == nil || !slices.Contains(sc.Capabilities.Drop, "ALL"):
			t.Errorf("container %s does not drop all capabilities", c.Name)
		}
		for _, res := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
			if _, ok := c.Resources.Requests[res]; !ok {
				t.Errorf("container %s has no %s request", c.Name, res)
			}
			if _, ok := c.Resources.Limits[res]; !ok {
				t.Errorf("container %s has no %s limit", c.Name, res)
			}
		}
		if c.LivenessProbe == nil || c.ReadinessProbe == nil {
			t.Errorf("container %s lacks a liveness or readiness probe", c.Name)
		}
		m := imageRe.FindStringSubmatch(c.Image)
		svc, ours := images[m[1]]
		if !ours {
			if strings.Contains(c.Image, "grasp") {
				t.Errorf("image %s is not one `make images` builds", c.Image)
			}
			continue
		}
		if m[2] == "" {
			t.Errorf("image %s has no tag", c.Image)
		}
		seen[svc] = true
		env := checkEnv(t, r, c, svc, docs)
		podEnv = env
		checkProbes(t, c, env)
		// Longer than the service's own drain: the ingester finishes or NAKs
		// what it holds before AckWait ends; everyone gets at least 30 s.
		drain := 30 * time.Second
		if svc == "ingester" {
			var cfg ingester.Config
			loadEnv(t, env, &cfg)
			drain = cfg.AckWait
		}
		if time.Duration(grace)*time.Second <= drain {
			t.Errorf("terminationGracePeriodSeconds %d is not longer than the %s drain time %s", grace, svc, drain)
		}
		if svc == "fetcher" {
			checkFetcher(t, w, c)
		}
		if svc == "relay" {
			checkRelayTrustsProxy(t, env, podNetworkPeers)
		}
	}
	if w.name == "grasp-nats" && len(p.TopologySpreadConstraints) == 0 {
		t.Error("NATS pods have no topology spread")
	}
	return podEnv
}

// checkEnv: every variable is real configuration of the service, its value
// loads, and every reference (ConfigMap, Secret, $(VAR)) resolves. It
// returns the effective values known without a cluster.
func checkEnv(t *testing.T, r rendered, c corev1.Container, svc, docs string) map[string]string {
	t.Helper()
	fields, err := AllEnvNames(repoRoot, svc)
	if err != nil {
		t.Fatal(err)
	}
	values := map[string]string{}
	referenced := map[string]bool{}
	for _, e := range c.Env {
		for _, m := range refRe.FindAllStringSubmatch(e.Value, -1) {
			referenced[m[1]] = true
		}
	}
	for _, e := range c.Env {
		switch {
		case strings.HasPrefix(e.Name, config.Prefix+"_"):
			if !fields[e.Name] && !boltOnPending(t, e.Name) {
				t.Errorf("%s is not a configuration field of %s (known: %v)", e.Name, svc, sorted(fields))
			}
		case slices.Contains(allowedPlainEnv, e.Name), referenced[e.Name]:
		default:
			t.Errorf("%s is set for %s but neither read by it nor referenced by another variable", e.Name, svc)
		}
		v := e.Value
		if e.ValueFrom != nil {
			switch {
			case e.ValueFrom.ConfigMapKeyRef != nil:
				ref := e.ValueFrom.ConfigMapKeyRef
				cm := r.configMaps[ref.Name]
				if cm == nil {
					t.Errorf("%s: ConfigMap %s is not in the overlay", e.Name, ref.Name)
					continue
				}
				var ok bool
				if v, ok = cm.Data[ref.Key]; !ok {
					t.Errorf("%s: ConfigMap %s has no key %s", e.Name, ref.Name, ref.Key)
				}
			case e.ValueFrom.SecretKeyRef != nil:
				ref := e.ValueFrom.SecretKeyRef
				if s := r.secrets[ref.Name]; s != nil {
					var ok bool
					if v, ok = secretValues(s)[ref.Key]; !ok {
						t.Errorf("%s: Secret %s has no key %s", e.Name, ref.Name, ref.Key)
					}
				} else if !slices.Contains(operatorSecrets, ref.Name) || !strings.Contains(docs, ref.Name) {
					t.Errorf("%s: Secret %s is neither in the overlay nor an operator Secret docs/deploy.md explains", e.Name, ref.Name)
				} else if ptrOr(ref.Optional, false) {
					// The operator may not create it: the service must
					// load without the variable (a placeholder value
					// could not pass a format check such as a key's).
					continue
				} else {
					v = "from-secret"
				}
			case e.ValueFrom.FieldRef != nil:
				v = "grasp-" + svc + "-0" // metadata.name of a pod
			}
		}
		v = refRe.ReplaceAllStringFunc(v, func(s string) string {
			name := refRe.FindStringSubmatch(s)[1]
			if x, ok := values[name]; ok {
				return x
			}
			t.Errorf("%s refers to $(%s), which is not defined before it", e.Name, name)
			return s
		})
		values[e.Name] = v
	}
	// The values parse: load them exactly as the binary does.
	specs, err := ServiceConfig(svc)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range specs {
		loadEnv(t, values, s)
	}
	return values
}

// loadEnv runs config.Load on spec with exactly the GRASP_* values given.
func loadEnv(t *testing.T, values map[string]string, spec any) {
	t.Helper()
	for _, kv := range os.Environ() {
		if k, _, _ := strings.Cut(kv, "="); strings.HasPrefix(k, config.Prefix+"_") {
			t.Setenv(k, "")
			os.Unsetenv(k)
		}
	}
	for k, v := range values {
		if strings.HasPrefix(k, config.Prefix+"_") {
			t.Setenv(k, v)
		}
	}
	if err := config.Load(spec); err != nil {
		t.Errorf("%T: %v", spec, err)
	}
}

// checkProbes: the probes use the paths the services' health server serves,
// on the port GRASP_METRICS_ADDR listens on.
func checkProbes(t *testing.T, c corev1.Container, env map[string]string) {
	t.Helper()
	srv := httptest.NewServer(obs.NewServer(obs.NewRegistry()).Handler())
	defer srv.Close()
	ports := map[string]int32{}
	for _, p := range c.Ports {
		ports[p.Name] = p.ContainerPort
	}
	_, metricsPort, err := net.SplitHostPort(env["GRASP_METRICS_ADDR"])
	if err != nil {
		t.Errorf("GRASP_METRICS_ADDR=%q: %v", env["GRASP_METRICS_ADDR"], err)
	}
	if host, _, _ := net.SplitHostPort(env["GRASP_METRICS_ADDR"]); host != "0.0.0.0" && host != "" {
		t.Errorf("GRASP_METRICS_ADDR=%s: the kubelet cannot probe a loopback address", env["GRASP_METRICS_ADDR"])
	}
	for what, p := range map[string]*corev1.Probe{"startup": c.StartupProbe, "liveness": c.LivenessProbe, "readiness": c.ReadinessProbe} {
		if p == nil {
			continue
		}
		if p.HTTPGet == nil {
			t.Errorf("%s probe is not an HTTP GET", what)
			continue
		}
		port := p.HTTPGet.Port.IntVal
		if p.HTTPGet.Port.StrVal != "" {
			var ok bool
			if port, ok = ports[p.HTTPGet.Port.StrVal]; !ok {
				t.Errorf("%s probe port %q is not a container port", what, p.HTTPGet.Port.StrVal)
			}
		}
		if strconv.Itoa(int(port)) != metricsPort {
			t.Errorf("%s probe on port %d, but the health server listens on %s", what, port, env["GRASP_METRICS_ADDR"])
		}
		resp, err := http.Get(srv.URL + p.HTTPGet.Path)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode == http.StatusNotFound {
			t.Errorf("%s probe path %s is not served by pkg/obs", what, p.HTTPGet.Path)
		}
		want := map[string]string{"startup": "/healthz", "liveness": "/healthz", "readiness": "/readyz"}[what]
		if p.HTTPGet.Path != want {
			t.Errorf("%s probe path %s, want %s", what, p.HTTPGet.Path, want)
		}
	}
	if addr, ok := env["GRASP_RELAY_ADDR"]; ok {
		_, port, _ := net.SplitHostPort(addr)
		if strconv.Itoa(int(ports["ws"])) != port {
			t.Errorf("container port ws=%d, but GRASP_RELAY_ADDR=%s", ports["ws"], addr)
		}
	}
}

// checkFetcher: ordinal names as fetcher ids, spread across nodes.
func checkFetcher(t *testing.T, w workload, c corev1.Container) {
	t.Helper()
	if w.kind != "StatefulSet" {
		t.Errorf("fetchers run as a %s, want a StatefulSet (stable ordinal ids)", w.kind)
	}
	if len(w.pod.TopologySpreadConstraints) == 0 {
		t.Error("fetcher pods have no topology spread")
	}
	for _, e := range c.Env {
		if e.Name == "GRASP_FETCHER_ID" && (e.ValueFrom == nil || e.ValueFrom.FieldRef == nil || e.ValueFrom.FieldRef.FieldPath != "metadata.name") {
			t.Error("GRASP_FETCHER_ID must be the pod name (grasp-fetcher-<ordinal>)")
		}
		if e.Name == "GRASP_FETCHER_SHARDS" {
			t.Error("GRASP_FETCHER_SHARDS in a StatefulSet gives every replica the same shards")
		}
	}
}

// checkPDBs: every workload has a disruption budget that selects it.
func checkPDBs(t *testing.T, r rendered) {
	t.Helper()
	var pdbs []*policyv1.PodDisruptionBudget
	for _, v := range r.typed {
		if p, ok := v.(*policyv1.PodDisruptionBudget); ok {
			pdbs = append(pdbs, p)
		}
	}
	for _, w := range r.workloads() {
		found := false
		for _, p := range pdbs {
			sel := labels.SelectorFromSet(p.Spec.Selector.MatchLabels)
			if sel.Matches(labels.Set(w.labels)) {
				found = true
			}
		}
		if !found {
			t.Errorf("%s %s has no PodDisruptionBudget", w.kind, w.name)
		}
	}
}

// checkScaling: replicas of production, and the ingester autoscaler points
// at the stream and consumer the code uses.
func checkScaling(t *testing.T, r rendered, overlay string) {
	t.Helper()
	prefix := r.configMaps[findByPrefix(r.configMaps, "grasp-config")].Data["prefix"]
	names := bus.Names{Prefix: prefix}
	var ing ingester.Config
	loadEnv(t, nil, &ing)
	config.FillDefaults(&ing) // the consumer's name is a default, not a variable
	autoscalers := 0
	for _, v := range r.typed {
		switch x := v.(type) {
		case *ScaledObject:
			autoscalers++
			if x.Spec.ScaleTargetRef.Name != "grasp-ingester" {
				t.Errorf("ScaledObject scales %s", x.Spec.ScaleTargetRef.Name)
			}
			for _, tr := range x.Spec.Triggers {
				md := tr.Metadata
				if tr.Type != "nats-jetstream" {
					t.Errorf("ScaledObject trigger %s, want nats-jetstream", tr.Type)
				}
				if md["stream"] != names.EventsStream() || md["consumer"] != ing.Consumer || md["account"] != AccountName {
					t.Errorf("ScaledObject watches %s/%s/%s, the ingesters consume %s/%s/%s", md["account"], md["stream"], md["consumer"], AccountName, names.EventsStream(), ing.Consumer)
				}
				want := fmt.Sprintf("grasp-nats-headless.%s.svc.cluster.local:8222", x.Metadata.Namespace)
				if md["natsServerMonitoringEndpoint"] != want {
					t.Errorf("natsServerMonitoringEndpoint %s, want %s", md["natsServerMonitoringEndpoint"], want)
				}
			}
		case *autoscalingv2.HorizontalPodAutoscaler:
			autoscalers++
			if x.Spec.ScaleTargetRef.Name != "grasp-ingester" {
				t.Errorf("HPA scales %s", x.Spec.ScaleTargetRef.Name)
			}
		}
	}
	if !strings.HasPrefix(overlay, "production") {
		return
	}
	if autoscalers != 1 {
		t.Errorf("%d ingester autoscalers, want exactly 1 (KEDA or HPA, never both)", autoscalers)
	}
	want := map[string]int32{"grasp-nats": 3, "grasp-discovery": 2, "grasp-planner": 2}
	for _, w := range r.workloads() {
		if n, ok := want[w.name]; ok && w.replicas != n {
			t.Errorf("%s has %d replicas, want %d", w.name, w.replicas, n)
		}
		if w.name == "grasp-fetcher" && w.replicas < 2 {
			t.Errorf("production runs %d fetchers", w.replicas)
		}
	}
	if got := r.configMaps[findByPrefix(r.configMaps, "grasp-config")].Data["nats-replicas"]; got != "3" {
		t.Errorf("GRASP_NATS_REPLICAS=%s in production, want 3 (R3 streams and KV)", got)
	}
}

func findByPrefix[T any](m map[string]T, prefix string) string {
	for k := range m {
		if strings.HasPrefix(k, prefix) {
			return k
		}
	}
	return ""
}
