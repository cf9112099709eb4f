package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"

	"github.com/grasp-sync/grasp-sync/pkg/verify"
)

// The binaries a multi-process Deployment (multiproc.go) runs, built from
// this workspace once per test process.

// binaryPackages are the binaries a Deployment runs, by file name.
var binaryPackages = map[string]string{
	"relay":       "github.com/grasp-sync/grasp-sync/services/relay/cmd/relay",
	"discovery":   "github.com/grasp-sync/grasp-sync/services/discovery/cmd/discovery",
	"planner":     "github.com/grasp-sync/grasp-sync/services/planner/cmd/planner",
	"fetcher":     "github.com/grasp-sync/grasp-sync/services/fetcher/cmd/fetcher",
	"ingester":    "github.com/grasp-sync/grasp-sync/services/ingester/cmd/ingester",
	"graspctl":    "github.com/grasp-sync/grasp-sync/services/graspctl/cmd/graspctl",
	"graspd":      "github.com/grasp-sync/grasp-sync/services/graspd/cmd/graspd",
	"nats-server": "github.com/nats-io/nats-server/v2", // the module the workspace pins
}

var (
	buildOnce sync.Once
	buildDir  string
	buildErr  error
)

// BuildBinaries builds the service binaries and nats-server once per
// process (the first caller pays, about 10 s with a warm build cache) and
// returns their directory. They verify signatures the way this test binary
// does: with the libsecp256k1 tag when the test was built with it (make test,
// make bench), as `make build` ships them, and pure Go otherwise. It must run inside the workspace (go test runs
// in the package directory). RemoveBinaries deletes them.
func BuildBinaries() (string, error) {
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "grasp-e2e-bin-")
		if err != nil {
			buildErr = fmt.Errorf("build dir: %w", err)
			return
		}
		args := []string{"build", "-o", dir + string(os.PathSeparator)}
		if verify.Backend() == verify.Libsecp256k1 {
			args = append(args, "-tags", "libsecp256k1")
		}
		for _, pkg := range binaryPackages {
			args = append(args, pkg)
		}
		out, err := exec.Command("go", args...).CombinedOutput()
		if err != nil {
			_ = os.RemoveAll(dir)
			buildErr = fmt.Errorf("go %s: %w\n%s", strings.Join(args, " "), err, out)
			return
		}
		buildDir = dir
	})
	return buildDir, buildErr
}

// RemoveBinaries deletes what BuildBinaries built (TestMain calls it).
func RemoveBinaries() {
	if buildDir != "" {
		_ = os.RemoveAll(buildDir)
	}
}
