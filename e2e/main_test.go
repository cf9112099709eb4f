package e2e

import (
	"os"
	"testing"
)

// TestMain removes the binaries the multi-process tests built (once per
// run, shared by every test) when the run ends.
func TestMain(m *testing.M) {
	code := m.Run()
	RemoveBinaries()
	os.Exit(code)
}
