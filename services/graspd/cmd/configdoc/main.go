// Command configdoc prints docs/configuration.md, generated from the
// configuration structs. Run from the repository root: `make docs`.
package main

import (
	"fmt"
	"os"

	"github.com/grasp-sync/grasp-sync/services/graspd/configdoc"
)

func main() {
	root := "."
	if len(os.Args) > 1 {
		root = os.Args[1]
	}
	page, err := configdoc.Generate(root)
	if err != nil {
		fmt.Fprintf(os.Stderr, "configdoc: %v\n", err)
		os.Exit(1)
	}
	os.Stdout.Write(page)
}
