// Package dist holds what turns the binaries into a release: the systemd
// unit of graspd (graspd.service), the Debian maintainer scripts (debian/),
// and the programs `make dist` runs, cmd/mktar (reproducible archives) and
// cmd/mkdeb (the .deb, with nfpm). It is its own module, outside go.work, so
// that nfpm's dependencies never change the versions the workspace's
// binaries are built with (docs/deploy.md, "On one host").
package dist

import (
	"bufio"
	"fmt"
	"io"
	"strings"
)

// Unit is a parsed systemd unit file: section → key → the values of every
// assignment of the key, in order (a key like SystemCallFilter may repeat;
// an empty assignment resets the list, which is kept as "").
type Unit map[string]map[string][]string

// ParseUnit reads a unit file in systemd's syntax (comments with # or ;,
// [Section] headers, Key=Value lines; no line continuations, which our unit
// does not use).
func ParseUnit(r io.Reader) (Unit, error) {
	u := Unit{}
	section := ""
	sc := bufio.NewScanner(r)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		switch {
		case line == "" || strings.HasPrefix(line, "#") || strings.HasPrefix(line, ";"):
		case strings.HasPrefix(line, "[") && strings.HasSuffix(line, "]"):
			section = line[1 : len(line)-1]
			if u[section] == nil {
				u[section] = map[string][]string{}
			}
		default:
			key, val, ok := strings.Cut(line, "=")
			if !ok || section == "" || strings.HasSuffix(line, "\\") {
				return nil, fmt.Errorf("line %d: %q is not a Key=Value in a section", n, line)
			}
			key = strings.TrimSpace(key)
			u[section][key] = append(u[section][key], strings.TrimSpace(val))
		}
	}
	return u, sc.Err()
}

// Get is the last value assigned to key in section ("" if none).
func (u Unit) Get(section, key string) string {
	v := u[section][key]
	if len(v) == 0 {
		return ""
	}
	return v[len(v)-1]
}
