//go:build !linux

package obs_test

import (
	"os"
	"testing"
)

type terminal struct{ master, slave *os.File }

// openTerminal: the pseudo-terminal test runs on Linux only.
func openTerminal(t *testing.T) terminal {
	t.Skip("SKIP: the pseudo-terminal test runs on Linux")
	return terminal{}
}
