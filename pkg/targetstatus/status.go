// Package targetstatus is how writing to the target relay stands in bolt-on
// mode (services/ingester/target), in a package of its own without dependencies, so that
// graspctl can read it from the metrics without linking the publisher and
// the event store, and the ingester does not import pkg/syncstatus (whose
// bucket reads deploy/validate would grant it).
package targetstatus

import (
	"bufio"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
	"time"
)

// Status is how writing to the target relay stands: what graspctl status
// and the status page show beside the remote relays. The publisher fills it
// in process; graspctl reads the same numbers from the grasp_target_*
// metrics (ParseMetrics).
type Status struct {
	// URL is the target relay (GRASP_TARGET_RELAY).
	URL       string `json:"url"`
	Connected bool   `json:"connected"`
	// Rate, Burst and Concurrency are the configured publish limits.
	Rate        float64 `json:"rate"`
	Burst       int     `json:"burst"`
	Concurrency int     `json:"concurrency"`
	// Written counts OK true answers, Duplicates "duplicate:" answers,
	// Refused definitive refusals, RateLimited "rate-limited:" answers.
	Written     int64 `json:"written"`
	Duplicates  int64 `json:"duplicates"`
	Refused     int64 `json:"refused"`
	RateLimited int64 `json:"rate_limited"`
	// WriteRate is the measured rate of events the target took (written or
	// duplicate), per second.
	WriteRate float64 `json:"write_rate"`
	// Backlog is the events waiting to be decided and written (the
	// ingesters' consumer lag plus what they hold).
	Backlog int64 `json:"backlog"`
	// ETA is the time the backlog is expected to need at the measured rate
	// (the configured rate before anything was measured); 0 without backlog.
	ETA time.Duration `json:"eta"`
	// Paused is the rest of the pause after a "rate-limited:" answer or a
	// lost connection.
	Paused time.Duration `json:"paused"`
	// LastRefusal is the target's reason for the newest refusal.
	LastRefusal string `json:"last_refusal,omitempty"`
}

// String is the one-line summary graspctl status prints.
func (t Status) String() string {
	conn := "connected"
	if !t.Connected {
		conn = "not connected"
	}
	s := fmt.Sprintf("target %s (%s): %d written, %d duplicate, %d refused, %d rate-limited; %.2f events/s (limit %.4g/s, burst %d, %d in flight); backlog %d",
		t.URL, conn, t.Written, t.Duplicates, t.Refused, t.RateLimited, t.WriteRate, t.Rate, t.Burst, t.Concurrency, t.Backlog)
	if t.Backlog > 0 {
		s += ", about " + t.ETA.Round(time.Second).String() + " to go"
	}
	if t.Paused > 0 {
		s += "; paused " + t.Paused.Round(time.Second).String()
	}
	if t.LastRefusal != "" {
		s += "; last refusal: " + t.LastRefusal
	}
	return s
}

// ParseMetrics reads the grasp_target_* series of a Prometheus text page
// into a Status; ok is false when the page has none (not bolt-on).
func ParseMetrics(r io.Reader) (t Status, ok bool, err error) {
	sc := bufio.NewScanner(io.LimitReader(r, 16<<20))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "grasp_target_") {
			continue
		}
		name, labels, v, good := parseSample(line)
		if !good {
			continue
		}
		ok = true
		switch name {
		case "grasp_target_info":
			t.URL = labels["url"]
		case "grasp_target_connected":
			t.Connected = v == 1
		case "grasp_target_publish_rate":
			t.Rate = v
		case "grasp_target_publish_burst":
			t.Burst = int(v)
		case "grasp_target_publish_concurrency":
			t.Concurrency = int(v)
		case "grasp_target_write_rate":
			t.WriteRate = v
		case "grasp_target_backlog_events":
			t.Backlog = int64(v)
		case "grasp_target_eta_seconds":
			t.ETA = seconds(v)
		case "grasp_target_paused_seconds":
			t.Paused = seconds(v)
		case "grasp_target_answers_total":
			switch labels["answer"] {
			case "ok":
				t.Written = int64(v)
			case "duplicate":
				t.Duplicates = int64(v)
			case "refused":
				t.Refused = int64(v)
			case "rate_limited":
				t.RateLimited = int64(v)
			}
		}
	}
	return t, ok, sc.Err()
}

func seconds(v float64) time.Duration {
	if math.IsInf(v, 0) || math.IsNaN(v) || v < 0 {
		return 0
	}
	return time.Duration(v * float64(time.Second))
}

// parseSample splits `name{a="b",c="d"} value` (labels without escaped
// quotes or commas, which the grasp_target_* series do not have).
func parseSample(line string) (name string, labels map[string]string, v float64, ok bool) {
	f := strings.Fields(line)
	if len(f) < 2 {
		return "", nil, 0, false
	}
	v, err := strconv.ParseFloat(f[len(f)-1], 64)
	if err != nil {
		return "", nil, 0, false
	}
	head := strings.Join(f[:len(f)-1], " ")
	name = head
	labels = map[string]string{}
	if i := strings.IndexByte(head, '{'); i >= 0 && strings.HasSuffix(head, "}") {
		name = head[:i]
		for _, kv := range strings.Split(head[i+1:len(head)-1], ",") {
			k, val, found := strings.Cut(kv, "=")
			if found {
				labels[k] = strings.Trim(val, `"`)
			}
		}
	}
	return name, labels, v, true
}
