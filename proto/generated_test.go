package proto_test

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// TestGeneratedCodeIsCurrent regenerates the Go code from the .proto files
// into a temporary directory and compares it with the committed files, so a
// contract change that was not regenerated (make proto) fails the build.
func TestGeneratedCodeIsCurrent(t *testing.T) {
	buf, err := exec.LookPath("buf")
	if err != nil {
		t.Skip("SKIP: buf is not on PATH; `make test` installs it into ./bin and runs this check")
	}
	if _, err := exec.LookPath("protoc-gen-go"); err != nil {
		t.Skip("SKIP: protoc-gen-go is not on PATH; `make test` installs it into ./bin and runs this check")
	}
	out := t.TempDir()
	tmpl := "version: v2\nplugins:\n  - local: protoc-gen-go\n    out: " + out + "\n    opt: paths=source_relative\n"
	cmd := exec.Command(buf, "generate", "--template", tmpl)
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("buf generate: %v\n%s", err, b)
	}
	generated, err := filepath.Glob(filepath.Join(out, "grasp", "v1", "*.pb.go"))
	if err != nil || len(generated) == 0 {
		t.Fatalf("buf generate produced no files (err=%v)", err)
	}
	committed, _ := filepath.Glob(filepath.Join("grasp", "v1", "*.pb.go"))
	if len(committed) != len(generated) {
		t.Fatalf("committed %d generated files, buf generates %d: run `make proto`", len(committed), len(generated))
	}
	for _, g := range generated {
		want, err := os.ReadFile(g)
		if err != nil {
			t.Fatal(err)
		}
		name := filepath.Join("grasp", "v1", filepath.Base(g))
		got, err := os.ReadFile(name)
		if err != nil {
			t.Fatalf("%s is generated but not committed: run `make proto`", name)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("%s is stale: run `make proto`", name)
		}
	}
}
