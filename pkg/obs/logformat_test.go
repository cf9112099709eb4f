package obs_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"io"
	"os"
	"strings"
	"testing"

	"github.com/grasp-sync/grasp-sync/pkg/obs"
)

func TestParseLogFormat(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want obs.LogFormat
		bad  bool
	}{
		{"", obs.LogFormatAuto, false},
		{"text", obs.LogFormatText, false},
		{"json", obs.LogFormatJSON, false},
		{" JSON ", obs.LogFormatJSON, false},
		{"xml", "", true},
		{"logfmt", "", true},
	} {
		got, err := obs.ParseLogFormat(tc.in)
		if tc.bad {
			if err == nil || !strings.Contains(err.Error(), "GRASP_LOG_FORMAT") || strings.Contains(err.Error(), "\n") {
				t.Errorf("ParseLogFormat(%q) = %q, %v: want one line naming GRASP_LOG_FORMAT", tc.in, got, err)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("ParseLogFormat(%q) = %q, %v, want %q", tc.in, got, err, tc.want)
		}
	}
}

// isJSONLine says whether line is one JSON object (a JSON handler's record).
func isJSONLine(line string) bool {
	var m map[string]any
	return json.Unmarshal([]byte(line), &m) == nil
}

// The format follows GRASP_LOG_FORMAT, and without it whether the output is
// a terminal: a pipe (a log collector) gets JSON, a terminal gets text.
func TestLoggerFormat(t *testing.T) {
	logTo := func(t *testing.T, w io.Writer, format string) {
		t.Helper()
		log, err := obs.NewLoggerFor(w, "info", format)
		if err != nil {
			t.Fatal(err)
		}
		log.Info("started", "relay", "ws://127.0.0.1:7777")
	}
	for _, tc := range []struct {
		format string
		json   bool
	}{{"", true}, {"json", true}, {"text", false}} {
		t.Run("buffer/"+tc.format, func(t *testing.T) {
			var b bytes.Buffer
			logTo(t, &b, tc.format)
			if line := strings.TrimSpace(b.String()); isJSONLine(line) != tc.json {
				t.Errorf("GRASP_LOG_FORMAT=%q wrote %q, want JSON %v", tc.format, line, tc.json)
			}
		})
	}
	t.Run("pipe", func(t *testing.T) {
		r, w, err := os.Pipe()
		if err != nil {
			t.Fatal(err)
		}
		defer r.Close()
		logTo(t, w, "")
		w.Close()
		line, _ := bufio.NewReader(r).ReadString('\n')
		if !isJSONLine(line) {
			t.Errorf("a pipe got %q, want JSON", line)
		}
	})
	t.Run("terminal", func(t *testing.T) {
		tty := openTerminal(t) // skips where there is none
		logTo(t, tty.slave, "")
		line, err := bufio.NewReader(tty.master).ReadString('\n')
		if err != nil {
			t.Fatal(err)
		}
		line = strings.TrimSpace(line)
		if isJSONLine(line) || !strings.Contains(line, "level=INFO msg=started") {
			t.Errorf("a terminal got %q, want text", line)
		}
		var b bytes.Buffer
		if obs.IsTerminal(&b) {
			t.Error("a buffer is taken for a terminal")
		}
	})
}
