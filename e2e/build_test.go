package e2e

import (
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/grasp-sync/grasp-sync/pkg/verify"
)

// TestBinariesVerifyLikeTheShippedBuild: the binaries the multi-process tests
// and TestBenchGraspdMemory run are built with the libsecp256k1 tag whenever
// this test binary is (make test, make bench), as make build ships them; the
// Go toolchain's own record of the build settings says which.
func TestBinariesVerifyLikeTheShippedBuild(t *testing.T) {
	dir, err := BuildBinaries()
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"graspd", "ingester", "relay"} {
		out, err := exec.Command("go", "version", "-m", filepath.Join(dir, name)).CombinedOutput()
		if err != nil {
			t.Fatalf("go version -m %s: %v\n%s", name, err, out)
		}
		tagged := strings.Contains(string(out), "-tags=libsecp256k1")
		if want := verify.Backend() == verify.Libsecp256k1; tagged != want {
			t.Errorf("%s built with the libsecp256k1 tag: %v; this test binary verifies with %s", name, tagged, verify.Backend())
		}
	}
}
