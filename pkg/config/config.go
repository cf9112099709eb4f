// Package config loads a service's configuration from GRASP_* environment
// variables into a struct (envconfig tags) and turns mistakes into one line
// that names the variable, so an operator can fix it without reading a stack
// trace.
package config

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"reflect"
	"strings"

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
			var iv invalidValue
			if errors.As(pe.Err, &iv) {
				return fmt.Errorf("%s=%q: %s", pe.KeyName, pe.Value, iv.why)
			}
			return fmt.Errorf("%s=%q: not a valid %s", pe.KeyName, pe.Value, pe.TypeName)
		}
		return fmt.Errorf("configuration: %w", err)
	}
	if err := readFormerNames(reflect.ValueOf(spec), Prefix); err != nil {
		return err
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

// readFormerNames gives renamed variables a grace period: a field tagged
// formerly:"OLD_NAME" takes GRASP_OLD_NAME when its own variable is unset
// (with a warning to move to the new name), and setting both to different
// values is an error. It follows envconfig's naming: embedded structs add
// no prefix, named struct fields add their key.
func readFormerNames(v reflect.Value, prefix string) error {
	for v.Kind() == reflect.Pointer {
		if v.IsNil() {
			return nil
		}
		v = v.Elem()
	}
	if v.Kind() != reflect.Struct {
		return nil
	}
	t := v.Type()
	for i := range t.NumField() {
		f := t.Field(i)
		if !f.IsExported() {
			continue
		}
		key := f.Tag.Get("envconfig")
		if f.Type.Kind() == reflect.Struct && f.Type.PkgPath() != "time" {
			inner := prefix
			if !f.Anonymous || key != "" {
				if key == "" {
					key = f.Name
				}
				inner = prefix + "_" + strings.ToUpper(key)
			}
			if err := readFormerNames(v.Field(i), inner); err != nil {
				return err
			}
			continue
		}
		former := f.Tag.Get("formerly")
		if former == "" || key == "" {
			continue
		}
		name, oldName := prefix+"_"+key, Prefix+"_"+former
		oldValue, oldSet := os.LookupEnv(oldName)
		if !oldSet {
			continue
		}
		if value, set := os.LookupEnv(name); set {
			if value != oldValue {
				return fmt.Errorf("%s=%q and %s=%q disagree: %s is the former name of %s, remove it", name, value, oldName, oldValue, oldName, name)
			}
			continue
		}
		// Parse the former variable exactly as envconfig parses the field.
		tmp := reflect.New(reflect.StructOf([]reflect.StructField{{
			Name: "V", Type: f.Type, Tag: reflect.StructTag(`envconfig:"` + former + `"`),
		}}))
		if err := envconfig.Process(Prefix, tmp.Interface()); err != nil {
			return fmt.Errorf("%s=%q: not a valid %s", oldName, oldValue, f.Type)
		}
		v.Field(i).Set(tmp.Elem().Field(0))
		slog.Warn("configuration variable renamed: read "+oldName+", set "+name+" instead", "variable", oldName, "new_name", name)
	}
	return nil
}
