package config

import (
	"runtime/debug"
	"strconv"
	"strings"
)

// ByteSize is an amount of memory read from a variable such as
// GRASP_MEMORY_LIMIT: a whole number of bytes with an optional unit
// (B, KiB, MiB, GiB, TiB, or the decimal kB, MB, GB, TB; case-insensitive),
// "256MiB" or "1GiB". Zero means "not set".
type ByteSize int64

// byteUnits are the accepted suffixes, longest first so "MiB" is tried
// before "B".
var byteUnits = []struct {
	suffix string
	factor int64
}{
	{"kib", 1 << 10}, {"mib", 1 << 20}, {"gib", 1 << 30}, {"tib", 1 << 40},
	{"kb", 1e3}, {"mb", 1e6}, {"gb", 1e9}, {"tb", 1e12},
	{"b", 1},
}

// invalidValue says why a variable's value cannot be decoded; Load prints
// it after the variable's name.
type invalidValue struct{ why string }

func (e invalidValue) Error() string { return e.why }

// ParseByteSize parses s as a ByteSize.
func ParseByteSize(s string) (ByteSize, error) {
	t := strings.ToLower(strings.TrimSpace(s))
	if t == "" {
		return 0, nil
	}
	factor := int64(1)
	for _, u := range byteUnits {
		if rest, ok := strings.CutSuffix(t, u.suffix); ok {
			t, factor = strings.TrimSpace(rest), u.factor
			break
		}
	}
	n, err := strconv.ParseInt(t, 10, 64)
	if err != nil || n < 0 {
		return 0, invalidValue{"want a whole number of bytes with an optional unit, such as 256MiB or 1GiB"}
	}
	if n > 0 && factor > (1<<63-1)/n {
		return 0, invalidValue{"too large"}
	}
	return ByteSize(n * factor), nil
}

// Decode implements envconfig.Decoder.
func (b *ByteSize) Decode(s string) error {
	v, err := ParseByteSize(s)
	if err != nil {
		return err
	}
	*b = v
	return nil
}

// String prints the size in the largest binary unit that divides it.
func (b ByteSize) String() string {
	n := int64(b)
	for _, u := range []struct {
		name   string
		factor int64
	}{{"TiB", 1 << 40}, {"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}} {
		if n != 0 && n%u.factor == 0 {
			return strconv.FormatInt(n/u.factor, 10) + u.name
		}
	}
	return strconv.FormatInt(n, 10) + "B"
}

// ApplyMemoryLimit sets the Go runtime's soft memory limit
// (debug.SetMemoryLimit) to limit when it is set, and reports the limit now
// in force and where it came from: "GRASP_MEMORY_LIMIT", "GOMEMLIMIT" (the
// runtime read it at start) or "none". Why a soft limit and why no default:
// docs/decisions/0030-memory-on-a-small-machine.md.
func ApplyMemoryLimit(limit ByteSize) (inForce int64, source string) {
	if limit > 0 {
		debug.SetMemoryLimit(int64(limit))
		return int64(limit), Prefix + "_MEMORY_LIMIT"
	}
	cur := debug.SetMemoryLimit(-1) // -1 reads without changing
	if cur == 1<<63-1 {
		return 0, "none"
	}
	return cur, "GOMEMLIMIT"
}

// InvalidValue is the error a custom variable type's Decode returns for a
// value it cannot take: Load prints why after the variable's name, on one
// line, instead of a generic "not a valid <type>".
func InvalidValue(why string) error { return invalidValue{why} }
