package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/grasp-sync/grasp-sync/pkg/bus"
	"github.com/grasp-sync/grasp-sync/services/graspctl"
)

// connFlags are how graspctl reaches NATS. Every command takes them,
// anywhere on the line (before or after the command word), as the nats CLI
// and kubectl do.
type connFlags struct {
	NATS, Creds, CA, Cert, Key, Prefix string
}

// invocation is one parsed command line.
type invocation struct {
	Conn    connFlags
	Command string
	// Help, when set, is printed to stdout and graspctl exits 0.
	Help string
	// Version: print the version and exit 0.
	Version bool

	Status  graspctl.StatusOptions
	Repos   reposOptions
	Explain graspctl.ExplainOptions
	RepoRef string // explain's argument
	Tap     graspctl.TapOptions
}

type reposOptions struct {
	Relay string
	JSON  bool
}

// command is one graspctl command: its flags and what it does with its
// positional arguments.
type command struct {
	name, synopsis, summary string
	flags                   func(fs *flag.FlagSet, inv *invocation, getenv func(string) string)
	// args takes the positional arguments; nil: the command takes none.
	args func(inv *invocation, args []string) error
}

var commands = []command{
	{
		name: "status", synopsis: "[--json] [--watch] [--interval 2s] [--metrics URL]",
		summary: "The relay table: each remote relay's sync state and progress.",
		flags: func(fs *flag.FlagSet, inv *invocation, getenv func(string) string) {
			fs.BoolVar(&inv.Status.JSON, "json", false, "print JSON")
			fs.BoolVar(&inv.Status.Watch, "watch", false, "refresh in place until interrupted")
			fs.DurationVar(&inv.Status.Interval, "interval", 2*time.Second, "--watch: refresh interval")
			fs.StringVar(&inv.Status.MetricsURL, "metrics", envOr(getenv, "GRASP_METRICS_URL", "http://127.0.0.1:9477/metrics"),
				"graspd's /metrics `URL`, for events stored and their rate (GRASP_METRICS_URL; empty skips)")
		},
	},
	{
		name: "repos", synopsis: "[--relay URL] [--json]",
		summary: "The RepoSyncIndex: every repository and the relays it is synced from.",
		flags: func(fs *flag.FlagSet, inv *invocation, getenv func(string) string) {
			fs.StringVar(&inv.Repos.Relay, "relay", "", "only this relay `URL`")
			fs.BoolVar(&inv.Repos.JSON, "json", false, "print JSON")
		},
	},
	{
		name: "explain", synopsis: "[--json] [--relay-url URL] [--service-url URL] REPO_REF|EVENT_ID",
		summary: "The relays of one repository (a coordinate 30617:<pubkey>:<identifier>; `graspctl repos` lists them) and why; or, for an event id, where the event went and what was answered (bolt-on mode: the target's refusal).",
		flags: func(fs *flag.FlagSet, inv *invocation, getenv func(string) string) {
			fs.BoolVar(&inv.Explain.JSON, "json", false, "print JSON")
			fs.StringVar(&inv.Explain.RelayURL, "relay-url", envOr(getenv, "GRASP_TARGET_RELAY", envOr(getenv, "GRASP_RELAY_URL", "ws://127.0.0.1:7777")),
				"this service's relay `URL`, to read the announcement or event from (GRASP_TARGET_RELAY in bolt-on mode, else GRASP_RELAY_URL; empty skips)")
			fs.StringVar(&inv.Explain.ServiceURL, "service-url", getenv("GRASP_PUBLIC_URL"),
				"this service's public `URL` as announcements list it (GRASP_PUBLIC_URL; default --relay-url)")
		},
		args: func(inv *invocation, args []string) error {
			if len(args) != 1 {
				return errors.New("want one REPO_REF (a coordinate 30617:<pubkey>:<identifier>; `graspctl repos` lists them) or EVENT_ID (64 hex)")
			}
			inv.RepoRef = args[0]
			return nil
		},
	},
	{
		name: "tap", synopsis: "[--pretty] [--from-start] [--relay URL] [--repo REF] [--kind N] [SUBJECT…]",
		summary: "Follow the messages on the bus (every subject of the prefix, or the SUBJECTs given).",
		flags: func(fs *flag.FlagSet, inv *invocation, getenv func(string) string) {
			fs.BoolVar(&inv.Tap.Pretty, "pretty", false, "indent each JSON object")
			fs.BoolVar(&inv.Tap.FromStart, "from-start", false, "replay what the streams hold first")
			fs.StringVar(&inv.Tap.Filter.Relay, "relay", "", "only messages about this relay `URL`")
			fs.StringVar(&inv.Tap.Filter.Repo, "repo", "", "only messages mentioning this repository coordinate `REF`")
			fs.IntVar(&inv.Tap.Filter.Kind, "kind", 0, "only nostr events of this `KIND`")
		},
		args: func(inv *invocation, args []string) error {
			inv.Tap.Subjects = args
			return nil
		},
	},
}

func findCommand(name string) (command, bool) {
	i := slices.IndexFunc(commands, func(c command) bool { return c.name == name })
	if i < 0 {
		return command{}, false
	}
	return commands[i], true
}

// addConnFlags defines the connection flags, defaulting to the GRASP_*
// variables the services read.
func addConnFlags(fs *flag.FlagSet, c *connFlags, getenv func(string) string) {
	fs.StringVar(&c.NATS, "nats", envOr(getenv, "GRASP_NATS_URL", "nats://127.0.0.1:4233"), "NATS server `URL` (GRASP_NATS_URL)")
	fs.StringVar(&c.Creds, "creds", getenv("GRASP_NATS_CREDS"), "NATS credentials `FILE` (GRASP_NATS_CREDS)")
	fs.StringVar(&c.CA, "ca", getenv("GRASP_NATS_CA"), "PEM `FILE` of the CAs that sign the NATS servers' certificates (GRASP_NATS_CA)")
	fs.StringVar(&c.Cert, "cert", getenv("GRASP_NATS_CERT"), "client certificate `FILE` (PEM) when NATS asks for one (GRASP_NATS_CERT; with --key)")
	fs.StringVar(&c.Key, "key", getenv("GRASP_NATS_KEY"), "private key `FILE` of --cert (GRASP_NATS_KEY)")
	fs.StringVar(&c.Prefix, "prefix", envOr(getenv, "GRASP_PREFIX", bus.DefaultPrefix), "subject/bucket `PREFIX` (GRASP_PREFIX)")
}

func envOr(getenv func(string) string, name, def string) string {
	if v := getenv(name); v != "" {
		return v
	}
	return def
}

// newFlagSet is a flag set that prints nothing: parseArgs turns its errors
// into one line, and --help into the command's usage.
func newFlagSet(name string, inv *invocation, getenv func(string) string) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	addConnFlags(fs, &inv.Conn, getenv)
	fs.BoolVar(&inv.Version, "version", false, "print graspctl's version and exit")
	return fs
}

// commandFlagSet is the flag set of one command: its own flags and the
// connection flags.
func commandFlagSet(c command, inv *invocation, getenv func(string) string) *flag.FlagSet {
	fs := newFlagSet(c.name, inv, getenv)
	if c.flags != nil {
		c.flags(fs, inv, getenv)
	}
	return fs
}

// valueFlags names every flag, of any command, that takes a value, so the
// command word can be found behind flags given before it.
func valueFlags() map[string]bool {
	names := map[string]bool{}
	for _, c := range commands {
		var inv invocation
		commandFlagSet(c, &inv, func(string) string { return "" }).VisitAll(func(f *flag.Flag) {
			if b, ok := f.Value.(interface{ IsBoolFlag() bool }); !ok || !b.IsBoolFlag() {
				names[f.Name] = true
			}
		})
	}
	return names
}

// commandIndex finds the command word: the first argument that is neither
// a flag nor a flag's value. -1: none.
func commandIndex(args []string) int {
	takesValue := valueFlags()
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a == "--" {
			if i+1 < len(args) {
				return i + 1
			}
			return -1
		}
		if len(a) < 2 || a[0] != '-' {
			return i
		}
		name := strings.TrimLeft(a, "-")
		if _, _, hasValue := strings.Cut(name, "="); !hasValue && takesValue[name] {
			i++ // the flag's value
		}
	}
	return -1
}

// parseInterspersed parses flags wherever they are among the positional
// arguments, which it returns in order; "--" ends the flags.
func parseInterspersed(fs *flag.FlagSet, args []string) ([]string, error) {
	var positional []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		rest := fs.Args()
		if len(rest) == 0 {
			return positional, nil
		}
		if consumed := len(args) - len(rest); consumed > 0 && args[consumed-1] == "--" {
			return append(positional, rest...), nil
		}
		positional = append(positional, rest[0])
		args = rest[1:]
	}
}

// usageLine is a command-line mistake as one line, with where to look.
func usageLine(cmd string, err error) error {
	help := "graspctl --help"
	if cmd != "" {
		help = "graspctl " + cmd + " --help"
		cmd = cmd + ": "
	}
	// The flag package names flags with one dash; graspctl's usage and
	// help use two.
	msg := strings.NewReplacer(
		"flag provided but not defined: -", "unknown flag --",
		"flag needs an argument: -", "a value is needed by --",
		"for flag -", "for flag --",
	).Replace(err.Error())
	return &exitError{exitUsage, fmt.Errorf("%s%s (see %s)", cmd, msg, help)}
}

// parseArgs reads graspctl's command line; getenv gives the variables the
// flags default to. It does no I/O: the caller prints inv.Help or the
// version, or runs inv.Command. Its errors are exit code 2.
func parseArgs(args []string, getenv func(string) string) (invocation, error) {
	var inv invocation
	i := commandIndex(args)
	if i < 0 || args[i] == "help" {
		fs := newFlagSet("graspctl", &inv, getenv)
		var rest []string
		if i >= 0 {
			rest = args[i+1:]
			args = args[:i]
		}
		err := fs.Parse(args)
		if errors.Is(err, flag.ErrHelp) || i >= 0 && err == nil && len(rest) == 0 {
			inv.Help = mainUsage(fs)
			return inv, nil
		}
		if err != nil {
			return inv, usageLine("", err)
		}
		if i >= 0 { // graspctl help COMMAND
			c, ok := findCommand(rest[0])
			if !ok {
				return inv, &exitError{exitUsage, fmt.Errorf("help: unknown command %q (commands: %s)", rest[0], commandNames())}
			}
			inv.Help = commandUsage(c, commandFlagSet(c, &invocation{}, getenv))
			return inv, nil
		}
		if inv.Version {
			return inv, nil
		}
		return inv, &exitError{exitUsage, errors.New(mainUsage(fs))}
	}
	c, ok := findCommand(args[i])
	if !ok {
		return inv, &exitError{exitUsage, fmt.Errorf("unknown command %q (commands: %s; graspctl --help)", args[i], commandNames())}
	}
	inv.Command = c.name
	fs := commandFlagSet(c, &inv, getenv)
	positional, err := parseInterspersed(fs, append(slices.Clone(args[:i]), args[i+1:]...))
	switch {
	case errors.Is(err, flag.ErrHelp):
		inv.Help = commandUsage(c, fs)
		return inv, nil
	case err != nil:
		return inv, usageLine(c.name, err)
	case inv.Version:
		return inv, nil
	}
	if c.args == nil {
		if len(positional) > 0 {
			return inv, usageLine(c.name, fmt.Errorf("unexpected argument %q", positional[0]))
		}
		return inv, nil
	}
	if err := c.args(&inv, positional); err != nil {
		return inv, usageLine(c.name, err)
	}
	return inv, nil
}

func commandNames() string {
	names := make([]string, len(commands))
	for i, c := range commands {
		names[i] = c.name
	}
	return strings.Join(names, ", ")
}

// mainUsage is `graspctl --help`.
func mainUsage(fs *flag.FlagSet) string {
	var b strings.Builder
	b.WriteString("usage: graspctl COMMAND [flags]\n\nCommands:\n")
	for _, c := range commands {
		fmt.Fprintf(&b, "  %-8s %s\n", c.name, c.summary)
	}
	b.WriteString("\nConnection flags (any command, anywhere on the line):\n")
	writeFlags(&b, fs, isConnFlag)
	writeFlags(&b, fs, func(name string) bool { return name == "version" })
	b.WriteString("\n`graspctl COMMAND --help` shows a command's flags.\n" + exitCodes)
	return b.String()
}

// commandUsage is `graspctl COMMAND --help`.
func commandUsage(c command, fs *flag.FlagSet) string {
	var b strings.Builder
	fmt.Fprintf(&b, "usage: graspctl %s %s\n%s\n\nFlags:\n", c.name, c.synopsis, c.summary)
	writeFlags(&b, fs, func(name string) bool { return !isConnFlag(name) && name != "version" })
	b.WriteString("\nConnection flags (anywhere on the line):\n")
	writeFlags(&b, fs, isConnFlag)
	b.WriteString("\n" + exitCodes)
	return b.String()
}

const exitCodes = "Exit codes: 0 ok, 1 other failure, 2 usage, 3 NATS unreachable, 4 bucket missing, 5 unknown repository.\n"

func isConnFlag(name string) bool {
	switch name {
	case "nats", "creds", "ca", "cert", "key", "prefix":
		return true
	}
	return false
}

func writeFlags(b *strings.Builder, fs *flag.FlagSet, keep func(name string) bool) {
	fs.VisitAll(func(f *flag.Flag) {
		if !keep(f.Name) {
			return
		}
		typ, usage := flag.UnquoteUsage(f)
		name := "--" + f.Name
		if typ != "" {
			name += " " + typ
		}
		if f.DefValue != "" && f.DefValue != "false" && f.DefValue != "0" {
			usage += fmt.Sprintf(" (default %s)", f.DefValue)
		}
		fmt.Fprintf(b, "  %-22s %s\n", name, usage)
	})
}
