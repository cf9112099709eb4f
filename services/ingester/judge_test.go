package ingester

import (
	"testing"

	"github.com/grasp-sync/grasp-sync/pkg/policy"
)

func TestJudge(t *testing.T) {
	for _, tc := range []struct {
		name string
		d    policy.Decision
		want verdict
	}{
		{"accepted", policy.Decision{Accept: true, Reason: policy.ReasonAccepted}, verdictStore},
		{"store error retries", policy.Decision{Reason: policy.ReasonStoreError}, verdictRetry},
		{"duplicate", policy.Decision{Reason: policy.ReasonDuplicate}, verdictDuplicate},
		{"no reference parks", policy.Decision{Reason: policy.ReasonNoReference}, verdictPark},
		{"not maintainer with missing parks", policy.Decision{Reason: policy.ReasonNotMaintainer, Missing: []string{"30617:x:y"}}, verdictPark},
		{"not maintainer, nothing missing, refused", policy.Decision{Reason: policy.ReasonNotMaintainer}, verdictRefuse},
		{"bad signature refused", policy.Decision{Reason: policy.ReasonBadSignature}, verdictRefuse},
		{"bad id refused", policy.Decision{Reason: policy.ReasonBadID}, verdictRefuse},
		{"too large refused", policy.Decision{Reason: policy.ReasonTooLarge}, verdictRefuse},
		{"deleted refused", policy.Decision{Reason: policy.ReasonDeleted}, verdictRefuse},
	} {
		if got := judge(tc.d); got != tc.want {
			t.Errorf("%s: judge = %d, want %d", tc.name, got, tc.want)
		}
	}
}

func TestVerified(t *testing.T) {
	for r, want := range map[policy.Reason]bool{
		policy.ReasonAccepted: true, policy.ReasonDuplicate: true, policy.ReasonNoReference: true,
		policy.ReasonDeleted: true, policy.ReasonStoreError: true,
		policy.ReasonBadID: false, policy.ReasonBadSignature: false, policy.ReasonTooLarge: false,
		policy.ReasonMalformed: false, policy.ReasonFuture: false, policy.ReasonExpired: false, policy.ReasonTooManyTags: false,
	} {
		if got := verified(r); got != want {
			t.Errorf("verified(%s) = %v, want %v", r, got, want)
		}
	}
}

func TestRememberable(t *testing.T) {
	for r, want := range map[policy.Reason]bool{
		policy.ReasonTooLarge: true, policy.ReasonDeleted: true, policy.ReasonOlderVersion: true, policy.ReasonExpired: true,
		policy.ReasonBadID: false, policy.ReasonBadSignature: false, policy.ReasonStoreError: false,
		policy.ReasonFuture: false, policy.ReasonNoReference: false, policy.ReasonNotListed: true,
		policy.ReasonNotMaintainer: true, policy.ReasonDuplicate: false, policy.ReasonAccepted: false,
	} {
		if got := rememberable(r); got != want {
			t.Errorf("rememberable(%s) = %v, want %v", r, got, want)
		}
	}
}
