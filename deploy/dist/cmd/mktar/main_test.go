package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// The same directory archived twice, with different file times, owners'
// umasks and creation order, gives the same bytes: sorted entries, root
// 0/0, normalised modes, the fixed time, and a gzip header without time;
// the archive carries a SHA256SUMS of its files.
func TestArchiveIsReproducible(t *testing.T) {
	mtime := time.Unix(1700000000, 0).UTC()
	var archives [][]byte
	for i, order := range [][]string{{"b/x", "a", "bin/tool"}, {"bin/tool", "a", "b/x"}} {
		dir := filepath.Join(t.TempDir(), "pkg_1.0")
		for _, f := range order {
			p := filepath.Join(dir, f)
			if err := os.MkdirAll(filepath.Dir(p), 0o700+os.FileMode(i)*0o55); err != nil {
				t.Fatal(err)
			}
			mode := os.FileMode(0o600 + i*0o44)
			if strings.HasPrefix(f, "bin/") {
				mode |= 0o100
			}
			if err := os.WriteFile(p, []byte("content of "+f), mode); err != nil {
				t.Fatal(err)
			}
			old := time.Now().Add(-time.Duration(i+1) * time.Hour)
			if err := os.Chtimes(p, old, old); err != nil {
				t.Fatal(err)
			}
		}
		out := filepath.Join(t.TempDir(), "a.tar.gz")
		if err := write(dir, out, mtime); err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile(out)
		if err != nil {
			t.Fatal(err)
		}
		archives = append(archives, b)
	}
	if !bytes.Equal(archives[0], archives[1]) {
		t.Fatal("two archives of the same content differ")
	}
	zr, err := gzip.NewReader(bytes.NewReader(archives[0]))
	if err != nil {
		t.Fatal(err)
	}
	if !zr.ModTime.IsZero() || zr.Name != "" {
		t.Errorf("gzip header: time %v, name %q", zr.ModTime, zr.Name)
	}
	tr := tar.NewReader(zr)
	var names []string
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		names = append(names, h.Name)
		if h.Uid != 0 || h.Gid != 0 || !h.ModTime.Equal(mtime) {
			t.Errorf("%s: uid %d gid %d time %v", h.Name, h.Uid, h.Gid, h.ModTime)
		}
		wantMode := int64(0o644)
		if h.Typeflag == tar.TypeDir || strings.Contains(h.Name, "/bin/") {
			wantMode = 0o755
		}
		if h.Mode != wantMode {
			t.Errorf("%s: mode %o, want %o", h.Name, h.Mode, wantMode)
		}
		if h.Name == "pkg_1.0/SHA256SUMS" {
			sums, _ := io.ReadAll(tr)
			if !strings.Contains(string(sums), "  bin/tool\n") || strings.Count(string(sums), "\n") != 3 {
				t.Errorf("SHA256SUMS:\n%s", sums)
			}
		}
	}
	want := []string{"pkg_1.0/", "pkg_1.0/SHA256SUMS", "pkg_1.0/a", "pkg_1.0/b/", "pkg_1.0/b/x", "pkg_1.0/bin/", "pkg_1.0/bin/tool"}
	if strings.Join(names, " ") != strings.Join(want, " ") {
		t.Errorf("entries %v, want %v", names, want)
	}
}
