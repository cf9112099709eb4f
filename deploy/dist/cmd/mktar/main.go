// Command mktar writes a reproducible .tar.gz of a directory for `make
// dist`: entries sorted by name under one top directory, owner 0/0 (root),
// modes normalised to 0755 (directories, executables) or 0644, every time
// SOURCE_DATE_EPOCH, and a gzip header without name or time. It adds a
// SHA256SUMS of the directory's files (sha256sum -c format) to the archive,
// so one commit gives the same bytes (docs/deploy.md, "On one host").
package main

import (
	"archive/tar"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"flag"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"
)

func main() {
	dir := flag.String("C", "", "the directory to archive; its name is the archive's top directory")
	out := flag.String("o", "", "output .tar.gz")
	flag.Parse()
	if *dir == "" || *out == "" {
		fail(fmt.Errorf("-C and -o are required"))
	}
	epoch := os.Getenv("SOURCE_DATE_EPOCH")
	sec, err := strconv.ParseInt(epoch, 10, 64)
	if err != nil {
		fail(fmt.Errorf("SOURCE_DATE_EPOCH=%q: want seconds since 1970 (make dist sets it to the commit time)", epoch))
	}
	if err := write(*dir, *out, time.Unix(sec, 0).UTC()); err != nil {
		fail(err)
	}
}

func fail(err error) {
	fmt.Fprintf(os.Stderr, "mktar: %v\n", err)
	os.Exit(1)
}

// entry is one file or directory of the archive.
type entry struct {
	rel  string // slash-separated, relative to the directory
	dir  bool
	exec bool
	data []byte
}

// collect reads the directory's regular files and subdirectories, sorted
// by path; anything else (a symlink, a device) is an error.
func collect(dir string) ([]entry, error) {
	var out []entry
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil || rel == "." {
			return err
		}
		rel = filepath.ToSlash(rel)
		switch {
		case d.IsDir():
			out = append(out, entry{rel: rel, dir: true})
		case d.Type().IsRegular():
			info, err := d.Info()
			if err != nil {
				return err
			}
			data, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			out = append(out, entry{rel: rel, exec: info.Mode()&0o111 != 0, data: data})
		default:
			return fmt.Errorf("%s: not a regular file or directory", p)
		}
		return nil
	})
	sort.Slice(out, func(i, j int) bool { return out[i].rel < out[j].rel })
	return out, err
}

// Sums is the SHA256SUMS of the files, in sha256sum's format.
func Sums(entries []entry) []byte {
	var b strings.Builder
	for _, e := range entries {
		if e.dir {
			continue
		}
		sum := sha256.Sum256(e.data)
		fmt.Fprintf(&b, "%s  %s\n", hex.EncodeToString(sum[:]), e.rel)
	}
	return []byte(b.String())
}

func write(dir, out string, mtime time.Time) error {
	entries, err := collect(dir)
	if err != nil {
		return err
	}
	for _, e := range entries {
		if e.rel == "SHA256SUMS" {
			return fmt.Errorf("%s already has a SHA256SUMS", dir)
		}
	}
	entries = append(entries, entry{rel: "SHA256SUMS", data: Sums(entries)})
	sort.SliceStable(entries, func(i, j int) bool { return entries[i].rel < entries[j].rel })

	tmp := out + ".tmp"
	f, err := os.Create(tmp)
	if err != nil {
		return err
	}
	defer os.Remove(tmp)
	gz, err := gzip.NewWriterLevel(f, gzip.DefaultCompression)
	if err != nil {
		return err
	}
	// gzip.Writer leaves the header's name empty and its time zero.
	tw := tar.NewWriter(gz)
	top := filepath.Base(filepath.Clean(dir))
	hdr := func(name string, mode int64, typ byte, size int64) *tar.Header {
		return &tar.Header{Name: name, Mode: mode, Typeflag: typ, Size: size, ModTime: mtime,
			Uid: 0, Gid: 0, Uname: "root", Gname: "root", Format: tar.FormatUSTAR}
	}
	if err := tw.WriteHeader(hdr(top+"/", 0o755, tar.TypeDir, 0)); err != nil {
		return err
	}
	for _, e := range entries {
		name := path.Join(top, e.rel)
		if e.dir {
			if err := tw.WriteHeader(hdr(name+"/", 0o755, tar.TypeDir, 0)); err != nil {
				return err
			}
			continue
		}
		mode := int64(0o644)
		if e.exec {
			mode = 0o755
		}
		if err := tw.WriteHeader(hdr(name, mode, tar.TypeReg, int64(len(e.data)))); err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		if _, err := tw.Write(e.data); err != nil {
			return err
		}
	}
	if err := tw.Close(); err != nil {
		return err
	}
	if err := gz.Close(); err != nil {
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(tmp, out)
}
