package policy_test

import (
	"reflect"
	"testing"

	"github.com/grasp-sync/grasp-sync/pkg/policy"
)

// TestWithDefaultsFillsEachField: WithDefaults returns limits whose every
// field is set without filling anything (a fast path); a field added to
// Limits and left out of that check would never get its default. Each field
// zeroed alone must come back as its default.
func TestWithDefaultsFillsEachField(t *testing.T) {
	def := policy.DefaultLimits()
	v := reflect.ValueOf(def)
	for n := range v.NumField() {
		if v.Field(n).IsZero() {
			t.Fatalf("default of %s is zero", v.Type().Field(n).Name)
		}
		l := def
		reflect.ValueOf(&l).Elem().Field(n).SetZero()
		if got := l.WithDefaults(); got != def {
			t.Errorf("%s zeroed: WithDefaults gives %+v, want %+v", v.Type().Field(n).Name, got, def)
		}
	}
	custom := def
	custom.MaxTags = 7
	if got := custom.WithDefaults(); got != custom {
		t.Errorf("set limits changed: %+v, want %+v", got, custom)
	}
}
