package obs

import (
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
)

// LogFormat is how log records are written, chosen by GRASP_LOG_FORMAT.
type LogFormat string

// The log formats. Auto is text for a person at a terminal and JSON for a
// log collector (docs/decisions/0025-command-lines-and-log-format.md).
const (
	LogFormatAuto LogFormat = ""
	LogFormatText LogFormat = "text"
	LogFormatJSON LogFormat = "json"
)

// LogFormatVar is the variable that forces a log format.
const LogFormatVar = "GRASP_LOG_FORMAT"

// ParseLogFormat reads a GRASP_LOG_FORMAT value: text, json, or empty for
// the automatic choice. The error is one line naming the variable.
func ParseLogFormat(s string) (LogFormat, error) {
	switch f := LogFormat(strings.ToLower(strings.TrimSpace(s))); f {
	case LogFormatAuto, LogFormatText, LogFormatJSON:
		return f, nil
	}
	return "", fmt.Errorf("%s=%q: want text or json (unset: text when stderr is a terminal, JSON otherwise)", LogFormatVar, s)
}

// NewLoggerFor is the logger of a grasp-sync binary: at level (as
// NewLogger), in format (a GRASP_LOG_FORMAT value), writing to w. The
// automatic format is text when w is a terminal and JSON otherwise.
func NewLoggerFor(w io.Writer, level, format string) (*slog.Logger, error) {
	f, err := ParseLogFormat(format)
	if err != nil {
		return nil, err
	}
	if f == LogFormatAuto {
		f = LogFormatJSON
		if IsTerminal(w) {
			f = LogFormatText
		}
	}
	opts := &slog.HandlerOptions{Level: parseLevel(level)}
	if f == LogFormatText {
		return slog.New(slog.NewTextHandler(w, opts)), nil
	}
	return slog.New(slog.NewJSONHandler(w, opts)), nil
}

// IsTerminal reports whether w is a terminal: a file that is a character
// device. It needs no dependency; a character device that is not a terminal
// (/dev/null) also counts, which only changes the format of lines nobody
// reads.
func IsTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}
