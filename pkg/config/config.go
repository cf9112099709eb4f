// Package config loads a service's configuration from GRASP_* environment
// variables into a struct (envconfig tags) and turns mistakes into one line
// that names the variable, so an operator can fix it without reading a stack
// trace.
package config

import (
	"errors"
	"fmt"

	"github.com/kelseyhightower/envconfig"
)

// Prefix is the environment prefix of every variable: GRASP_<NAME>.
const Prefix = "GRASP"

// Validator is implemented by config structs that check relations envconfig
// cannot express (a URL's scheme, one duration smaller than another…).
type Validator interface {
	Validate() error
}

// Load fills spec from the environment and validates it.
func Load(spec any) error {
	if err := envconfig.Process(Prefix, spec); err != nil {
		var pe *envconfig.ParseError
		if errors.As(err, &pe) {
			return fmt.Errorf("%s=%q: not a valid %s", pe.KeyName, pe.Value, pe.TypeName)
		}
		return fmt.Errorf("configuration: %w", err)
	}
	if v, ok := spec.(Validator); ok {
		if err := v.Validate(); err != nil {
			return err
		}
	}
	return nil
}

// Invalid builds a validation error naming the variable.
func Invalid(name string, value any, why string) error {
	return fmt.Errorf("%s_%s=%v: %s", Prefix, name, value, why)
}
