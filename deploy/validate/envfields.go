package validate

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"

	"github.com/grasp-sync/grasp-sync/pkg/config"
	"github.com/grasp-sync/grasp-sync/pkg/service"
	"github.com/grasp-sync/grasp-sync/services/discovery"
	"github.com/grasp-sync/grasp-sync/services/fetcher"
	"github.com/grasp-sync/grasp-sync/services/graspd"
	"github.com/grasp-sync/grasp-sync/services/ingester"
	"github.com/grasp-sync/grasp-sync/services/planner"
	"github.com/grasp-sync/grasp-sync/services/relay"
)

// Services are the binaries deployed as long-running workloads, by the
// name of their module under services/ (which is also their image name,
// grasp-<name>, and their NATS user).
var Services = []string{"relay", "discovery", "planner", "fetcher", "ingester"}

// ServiceConfig returns fresh values of the configuration structs a service
// binary loads with config.Load: the common one of pkg/service and the
// service package's own Config (for "graspd", the all-in-one binary, its own
// Config and every service's). The binary's package main may add a few
// fields (see CmdEnvNames).
func ServiceConfig(name string) ([]any, error) {
	var own any
	switch name {
	case "relay":
		own = &relay.Config{}
	case "discovery":
		own = &discovery.Config{}
	case "planner":
		own = &planner.Config{}
	case "fetcher":
		own = &fetcher.Config{}
	case "ingester":
		own = &ingester.Config{}
	case "graspd":
		// graspd runs every service in one process and reads all their
		// configurations from one environment, plus its own.
		return []any{&graspd.Config{}, &relay.Config{}, &discovery.Config{}, &planner.Config{}, &fetcher.Config{}, &ingester.Config{}}, nil
	default:
		return nil, fmt.Errorf("unknown service %q", name)
	}
	return []any{&service.Common{}, own}, nil
}

// EnvNames lists the environment variables envconfig reads into spec (a
// pointer to a struct), following its rules: GRASP_ + the envconfig tag, or
// the upper-cased field name; embedded structs add no prefix.
func EnvNames(spec any) []string {
	var out []string
	walkEnv(reflect.TypeOf(spec).Elem(), config.Prefix+"_", &out)
	return out
}

func walkEnv(t reflect.Type, prefix string, out *[]string) {
	for i := range t.NumField() {
		f := t.Field(i)
		if !f.IsExported() || f.Tag.Get("ignored") == "true" {
			continue
		}
		key := f.Tag.Get("envconfig")
		ft := f.Type
		for ft.Kind() == reflect.Pointer {
			ft = ft.Elem()
		}
		isStruct := ft.Kind() == reflect.Struct && !isDecodable(ft)
		switch {
		case f.Anonymous && isStruct && key == "":
			walkEnv(ft, prefix, out)
		case isStruct:
			name := key
			if name == "" {
				name = strings.ToUpper(f.Name)
			}
			walkEnv(ft, prefix+name+"_", out)
		case key != "":
			*out = append(*out, prefix+key)
		default:
			*out = append(*out, prefix+strings.ToUpper(f.Name))
		}
	}
}

// isDecodable reports struct types envconfig decodes from one string
// (time.Time and friends) instead of descending into them.
func isDecodable(t reflect.Type) bool {
	return t.PkgPath() == "time" || reflect.PointerTo(t).Implements(reflect.TypeFor[interface{ UnmarshalText([]byte) error }]())
}

// CmdEnvNames reads the envconfig tags of the struct types declared in a
// binary's package main (services/<name>/cmd/<name>), which cannot be
// imported: fields such as GRASP_STORE_URL that only the binary needs.
// Embedded types of other packages are not followed here; ServiceConfig
// covers them.
func CmdEnvNames(repoRoot, name string) ([]string, error) {
	dir := filepath.Join(repoRoot, "services", name, "cmd", name)
	fset := token.NewFileSet()
	pkgs, err := parser.ParseDir(fset, dir, nil, parser.SkipObjectResolution)
	if err != nil {
		return nil, fmt.Errorf("parse %s: %w", dir, err)
	}
	var out []string
	for _, p := range pkgs {
		for fname, f := range p.Files {
			if strings.HasSuffix(fname, "_test.go") {
				continue
			}
			ast.Inspect(f, func(n ast.Node) bool {
				st, ok := n.(*ast.StructType)
				if !ok {
					return true
				}
				for _, fld := range st.Fields.List {
					if fld.Tag == nil {
						continue
					}
					tag, err := strconv.Unquote(fld.Tag.Value)
					if err != nil {
						continue
					}
					if key := reflect.StructTag(tag).Get("envconfig"); key != "" {
						out = append(out, config.Prefix+"_"+key)
					}
				}
				return true
			})
		}
	}
	return out, nil
}

// AllEnvNames is every GRASP_* variable the binary of service name reads.
func AllEnvNames(repoRoot, name string) (map[string]bool, error) {
	specs, err := ServiceConfig(name)
	if err != nil {
		return nil, err
	}
	out := map[string]bool{}
	for _, s := range specs {
		for _, n := range EnvNames(s) {
			out[n] = true
		}
	}
	cmd, err := CmdEnvNames(repoRoot, name)
	if err != nil {
		return nil, err
	}
	for _, n := range cmd {
		out[n] = true
	}
	return out, nil
}
