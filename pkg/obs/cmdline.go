package obs

import (
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/grasp-sync/grasp-sync/pkg/verify"
)

// VersionLine is what `<binary> --version` prints: the binary's name, the
// version and the commit stamped by the build (Makefile LDFLAGS), and the
// signature verifier the build carries, which the build tags choose
// (docs/decisions/0027-signature-verification-libsecp256k1.md): an operator holding a release binary can tell which it is.
func VersionLine(name string) string {
	return fmt.Sprintf("%s %s (commit %s, verifier %s)", name, Version, Commit, verify.Backend())
}

// ErrUsage marks a command line the binary does not understand; the
// binary exits 2 with the error's one line.
var ErrUsage = errors.New("usage")

// CommandLine answers the command line of a binary configured by GRASP_*
// environment variables alone: --version prints VersionLine, --help (or
// -h) prints help, each to stdout, and done says the binary should exit 0.
// Anything else is an error wrapping ErrUsage. No arguments: the binary
// runs.
func CommandLine(name, help string, args []string, stdout io.Writer) (done bool, err error) {
	if len(args) == 0 {
		return false, nil
	}
	switch args[0] {
	case "--version", "-version":
		fmt.Fprintln(stdout, VersionLine(name))
		return true, nil
	case "--help", "-help", "-h", "help":
		fmt.Fprintln(stdout, strings.TrimRight(help, "\n"))
		return true, nil
	}
	return false, fmt.Errorf("%w: unexpected argument %q: %s takes no arguments but --version and --help; its configuration is GRASP_* environment variables (docs/configuration.md)", ErrUsage, args[0], name)
}

// ServiceHelp is the --help text of a binary configured by the
// environment alone.
func ServiceHelp(name, what string) string {
	return fmt.Sprintf(`usage: %[1]s [--version | --help]
%[2]s
Configured by GRASP_* environment variables (docs/configuration.md lists them).
Logs go to stderr: text when it is a terminal, JSON otherwise; GRASP_LOG_FORMAT=text|json forces one.`, name, what)
}
