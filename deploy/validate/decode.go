package validate

import (
	"bytes"
	"encoding/json"
	"fmt"

	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
)

// newTyped returns an empty value of the Go type of apiVersion/kind: the
// Kubernetes API types for built-in kinds, the local minimal types below for
// the CRDs we use. Unknown kinds are an error: a new kind in the manifests
// needs a type here, so it is checked too.
func newTyped(apiVersion, kind string) (any, error) {
	switch apiVersion + " " + kind {
	case "v1 Namespace":
		return &corev1.Namespace{}, nil
	case "v1 Service":
		return &corev1.Service{}, nil
	case "v1 ConfigMap":
		return &corev1.ConfigMap{}, nil
	case "v1 Secret":
		return &corev1.Secret{}, nil
	case "apps/v1 Deployment":
		return &appsv1.Deployment{}, nil
	case "apps/v1 StatefulSet":
		return &appsv1.StatefulSet{}, nil
	case "policy/v1 PodDisruptionBudget":
		return &policyv1.PodDisruptionBudget{}, nil
	case "networking.k8s.io/v1 NetworkPolicy":
		return &networkingv1.NetworkPolicy{}, nil
	case "networking.k8s.io/v1 Ingress":
		return &networkingv1.Ingress{}, nil
	case "autoscaling/v2 HorizontalPodAutoscaler":
		return &autoscalingv2.HorizontalPodAutoscaler{}, nil
	case "keda.sh/v1alpha1 ScaledObject":
		return &ScaledObject{}, nil
	case "monitoring.coreos.com/v1 ServiceMonitor":
		return &ServiceMonitor{}, nil
	case "monitoring.coreos.com/v1 PrometheusRule":
		return &PrometheusRule{}, nil
	}
	return nil, fmt.Errorf("no Go type for %s %s: add it to deploy/validate newTyped", apiVersion, kind)
}

// Decode decodes an object strictly into its Go type: a field the type does
// not have (a typo, a wrong indentation, a field of a newer API) fails, as
// does trailing data.
func Decode(o Object) (any, error) {
	v, err := newTyped(o.APIVersion, o.Kind)
	if err != nil {
		return nil, err
	}
	dec := json.NewDecoder(bytes.NewReader(o.JSON))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return nil, fmt.Errorf("%s: %w", o.ID(), err)
	}
	if dec.More() {
		return nil, fmt.Errorf("%s: trailing data", o.ID())
	}
	return v, nil
}

// TypeMeta and ObjectMeta of the CRD types: the fields we set and nothing else.
type crdMeta struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Metadata   struct {
		Name        string            `json:"name"`
		Namespace   string            `json:"namespace,omitempty"`
		Labels      map[string]string `json:"labels,omitempty"`
		Annotations map[string]string `json:"annotations,omitempty"`
	} `json:"metadata"`
}

// ScaledObject is the subset of KEDA's keda.sh/v1alpha1 ScaledObject the
// manifests use (github.com/kedacore/keda apis/keda/v1alpha1).
type ScaledObject struct {
	crdMeta
	Spec struct {
		ScaleTargetRef struct {
			APIVersion string `json:"apiVersion"`
			Kind       string `json:"kind"`
			Name       string `json:"name"`
		} `json:"scaleTargetRef"`
		MinReplicaCount *int32 `json:"minReplicaCount"`
		MaxReplicaCount *int32 `json:"maxReplicaCount"`
		PollingInterval *int32 `json:"pollingInterval,omitempty"`
		CooldownPeriod  *int32 `json:"cooldownPeriod,omitempty"`
		Triggers        []struct {
			Type     string            `json:"type"`
			Metadata map[string]string `json:"metadata"`
		} `json:"triggers"`
	} `json:"spec"`
}

// ServiceMonitor is the subset of the Prometheus Operator's
// monitoring.coreos.com/v1 ServiceMonitor the manifests use.
type ServiceMonitor struct {
	crdMeta
	Spec struct {
		Selector struct {
			MatchLabels map[string]string `json:"matchLabels"`
		} `json:"selector"`
		Endpoints []struct {
			Port        string `json:"port"`
			Path        string `json:"path"`
			Interval    string `json:"interval,omitempty"`
			Relabelings []struct {
				SourceLabels []string `json:"sourceLabels"`
				TargetLabel  string   `json:"targetLabel"`
			} `json:"relabelings,omitempty"`
		} `json:"endpoints"`
	} `json:"spec"`
}

// PrometheusRule is the subset of monitoring.coreos.com/v1 PrometheusRule the
// manifests use.
type PrometheusRule struct {
	crdMeta
	Spec struct {
		Groups []struct {
			Name  string `json:"name"`
			Rules []struct {
				Alert       string            `json:"alert"`
				Expr        string            `json:"expr"`
				For         string            `json:"for,omitempty"`
				Labels      map[string]string `json:"labels,omitempty"`
				Annotations map[string]string `json:"annotations,omitempty"`
			} `json:"rules"`
		} `json:"groups"`
	} `json:"spec"`
}
