// Command mkdeb builds the grasp-sync .deb of one architecture from the
// binaries `make dist` built, with nfpm's Go API (no Docker, no dpkg-deb):
// graspd and graspctl in /usr/bin, the separate service binaries in
// /usr/libexec/grasp-sync, the systemd unit, the env file as a conffile,
// the docs, and the maintainer scripts of deploy/dist/debian. Every file's
// time is SOURCE_DATE_EPOCH, so one commit gives the same bytes
// (docs/deploy.md, "On one host").
package main

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"time"

	"github.com/goreleaser/nfpm/v2"
	_ "github.com/goreleaser/nfpm/v2/deb" // registers the deb packager
	"github.com/goreleaser/nfpm/v2/files"
)

// Binaries on the PATH; the service binaries' generic names (relay,
// planner…) would collide with other packages', so they live in LibexecDir.
var (
	PathBinaries    = []string{"graspd", "graspctl"}
	ServiceBinaries = []string{"relay", "discovery", "planner", "fetcher", "ingester"}
)

// Where the package puts things.
const (
	LibexecDir = "/usr/libexec/grasp-sync"
	UnitPath   = "/lib/systemd/system/graspd.service"
	EnvPath    = "/etc/grasp-sync/graspd.env"
	DocDir     = "/usr/share/doc/grasp-sync"
)

type options struct {
	arch, version, binDir, envFile, unit, scripts, docDir, readme, out string
	mtime                                                              time.Time
}

func main() {
	var o options
	flag.StringVar(&o.arch, "arch", "", "Debian architecture: amd64 or arm64")
	flag.StringVar(&o.version, "version", "", "package version (Debian syntax, starts with a digit)")
	flag.StringVar(&o.binDir, "bin", "", "directory holding the binaries")
	flag.StringVar(&o.envFile, "env", "", "the generated graspd.env")
	flag.StringVar(&o.unit, "unit", "", "graspd.service")
	flag.StringVar(&o.scripts, "scripts", "", "directory of postinst, prerm, postrm")
	flag.StringVar(&o.docDir, "docs", "", "directory of the docs (*.md)")
	flag.StringVar(&o.readme, "readme", "", "README.md")
	flag.StringVar(&o.out, "o", "", "output .deb")
	flag.Parse()
	epoch := os.Getenv("SOURCE_DATE_EPOCH")
	sec, err := strconv.ParseInt(epoch, 10, 64)
	if err != nil {
		fail(fmt.Errorf("SOURCE_DATE_EPOCH=%q: want seconds since 1970 (make dist sets it to the commit time)", epoch))
	}
	o.mtime = time.Unix(sec, 0).UTC()
	for name, v := range map[string]string{"-arch": o.arch, "-version": o.version, "-bin": o.binDir, "-env": o.envFile, "-unit": o.unit, "-scripts": o.scripts, "-docs": o.docDir, "-readme": o.readme, "-o": o.out} {
		if v == "" {
			fail(fmt.Errorf("%s is required", name))
		}
	}
	if err := build(o); err != nil {
		fail(err)
	}
}

func fail(err error) {
	fmt.Fprintf(os.Stderr, "mkdeb: %v\n", err)
	os.Exit(1)
}

func file(src, dst string, mode os.FileMode, mtime time.Time, typ string) *files.Content {
	return &files.Content{Source: src, Destination: dst, Type: typ,
		FileInfo: &files.ContentFileInfo{Owner: "root", Group: "root", Mode: mode, MTime: mtime}}
}

// Contents lists what the package installs.
func Contents(o options) (files.Contents, error) {
	var c files.Contents
	for _, b := range PathBinaries {
		c = append(c, file(filepath.Join(o.binDir, b), "/usr/bin/"+b, 0o755, o.mtime, ""))
	}
	for _, b := range ServiceBinaries {
		c = append(c, file(filepath.Join(o.binDir, b), LibexecDir+"/"+b, 0o755, o.mtime, ""))
	}
	c = append(c,
		file(o.unit, UnitPath, 0o644, o.mtime, ""),
		// 0640: the file may hold secrets (GRASP_FETCHER_AUTH_KEY);
		// systemd reads it as root before starting graspd.
		file(o.envFile, EnvPath, 0o640, o.mtime, files.TypeConfig),
		file(o.readme, DocDir+"/README.md", 0o644, o.mtime, ""),
	)
	docs, err := filepath.Glob(filepath.Join(o.docDir, "*.md"))
	if err != nil {
		return nil, err
	}
	sort.Strings(docs)
	for _, d := range docs {
		c = append(c, file(d, DocDir+"/"+filepath.Base(d), 0o644, o.mtime, ""))
	}
	for _, p := range c {
		if _, err := os.Stat(p.Source); err != nil {
			return nil, fmt.Errorf("package content: %w", err)
		}
	}
	return c, nil
}

func build(o options) error {
	contents, err := Contents(o)
	if err != nil {
		return err
	}
	info := &nfpm.Info{
		Name:          "grasp-sync",
		Arch:          o.arch,
		Platform:      "linux",
		Version:       o.version,
		VersionSchema: "none", // Debian syntax as given (make dist: 0.0.0+git<time>.<commit>)
		Section:       "net",
		Priority:      "optional",
		Maintainer:    "grasp-sync developers <grasp-sync@invalid>",
		Description: "GRASP relay with proactive sync of NIP-34 events\n" +
			"graspd runs the relay, discovery, planner, fetcher and ingester in one\n" +
			"process over an embedded NATS and event store, as a systemd service\n" +
			"configured by /etc/grasp-sync/graspd.env.",
		MTime: o.mtime,
		Overridables: nfpm.Overridables{
			// The cgo builds (libsecp256k1) link glibc dynamically.
			Depends:  []string{"libc6"},
			Contents: contents,
			Umask:    0o022,
			Scripts: nfpm.Scripts{
				PostInstall: filepath.Join(o.scripts, "postinst"),
				PreRemove:   filepath.Join(o.scripts, "prerm"),
				PostRemove:  filepath.Join(o.scripts, "postrm"),
			},
		},
	}
	info = nfpm.WithDefaults(info)
	if err := nfpm.PrepareForPackager(info, "deb"); err != nil {
		return fmt.Errorf("prepare: %w", err)
	}
	pkg, err := nfpm.Get("deb")
	if err != nil {
		return err
	}
	tmp := o.out + ".tmp"
	f, err := os.Create(tmp)
	if err != nil {
		return err
	}
	if err := pkg.Package(info, f); err != nil {
		f.Close()
		os.Remove(tmp)
		return fmt.Errorf("package: %w", err)
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(tmp, o.out)
}
