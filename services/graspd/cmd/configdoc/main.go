// Command configdoc prints docs/configuration.md, generated from the
// configuration structs. Run from the repository root: `make docs`.
//
// With -env it prints graspd's environment file instead (the package's
// /etc/grasp-sync/graspd.env, `make dist`): the same variables from the
// same structs, so the two cannot drift. Each -set NAME=VALUE assigns a
// variable in that file; the rest stay commented out at their defaults.
package main

import (
	"flag"
	"fmt"
	"os"
	"strings"

	"github.com/grasp-sync/grasp-sync/services/graspd/configdoc"
)

// setFlags collects repeated -set NAME=VALUE.
type setFlags map[string]string

func (s setFlags) String() string { return fmt.Sprint(map[string]string(s)) }

func (s setFlags) Set(v string) error {
	name, val, ok := strings.Cut(v, "=")
	if !ok || name == "" {
		return fmt.Errorf("want NAME=VALUE, got %q", v)
	}
	s[name] = val
	return nil
}

func main() {
	env := flag.Bool("env", false, "print graspd's environment file instead of the configuration page")
	set := setFlags{}
	flag.Var(set, "set", "with -env: assign `NAME=VALUE` in the file (repeatable)")
	flag.Parse()
	root := "."
	if flag.NArg() > 0 {
		root = flag.Arg(0)
	}
	var (
		out []byte
		err error
	)
	if *env {
		out, err = configdoc.EnvFile(root, set)
	} else {
		if len(set) > 0 {
			err = fmt.Errorf("-set needs -env")
		} else {
			out, err = configdoc.Generate(root)
		}
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "configdoc: %v\n", err)
		os.Exit(1)
	}
	os.Stdout.Write(out)
}
