package bus

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
)

// HeaderEvents marks an EventsSubject message that carries several events
// (a batch): its value is how many, and the data is their JSON, one event
// per line. A message without it carries one event's JSON, as every message
// did before batches, and is still accepted: an upgrade may find such
// messages in the stream (docs/decisions/0053-events-travel-in-batches.md).
const HeaderEvents = "Grasp-Events"

// EventBatchMaxBytes bounds the data of one batch message: far below the
// NATS default max payload (1 MiB), so an ingester's pull of FetchBatch
// messages stays a few tens of MiB. An event larger than this travels
// alone, in the one-event format.
const EventBatchMaxBytes = 128 << 10

// HeaderReadAt is when the fetcher read an EventsSubject message's event off
// its relay (of a batch, its first and oldest event), in Unix milliseconds.
// With the stream's own timestamp it splits an event's journey into the
// fetcher's part and the stream's, for the ingester's stage histogram
// (docs/metrics.md, "Where events wait"; decision 0059). Clocks of different hosts make it
// approximate there; nothing depends on it but the metric.
const HeaderReadAt = "Grasp-Read-At"

// SetReadAt records t as the message's HeaderReadAt.
func SetReadAt(header nats.Header, t time.Time) {
	header.Set(HeaderReadAt, strconv.FormatInt(t.UnixMilli(), 10))
}

// ReadAt is the message's HeaderReadAt; ok is false when it has none (a
// message from an older fetcher) or it does not parse.
func ReadAt(header nats.Header) (t time.Time, ok bool) {
	v := header.Get(HeaderReadAt)
	if v == "" {
		return time.Time{}, false
	}
	ms, err := strconv.ParseInt(v, 10, 64)
	if err != nil || ms <= 0 {
		return time.Time{}, false
	}
	return time.UnixMilli(ms), true
}

// EventCount is how many events an EventsSubject message carries: its
// HeaderEvents value, else 1.
func EventCount(header nats.Header) int {
	if v := header.Get(HeaderEvents); v != "" {
		if n, err := strconv.Atoi(v); err == nil && n > 0 {
			return n
		}
	}
	return 1
}

// IsEventBatch reports whether an EventsSubject message is a batch.
func IsEventBatch(header nats.Header) bool { return header.Get(HeaderEvents) != "" }

// SplitEvents returns the event JSON an EventsSubject message carries: the
// non-empty lines of a batch, else the whole data as one event. The slices
// alias data. Event JSON as the fetcher encodes it has no line break (JSON
// escapes them inside strings), so a line is one event.
func SplitEvents(header nats.Header, data []byte) [][]byte {
	if !IsEventBatch(header) {
		return [][]byte{data}
	}
	out := make([][]byte, 0, EventCount(header))
	for len(data) > 0 {
		line := data
		if n := bytes.IndexByte(data, '\n'); n >= 0 {
			line, data = data[:n], data[n+1:]
		} else {
			data = nil
		}
		if len(line) > 0 {
			out = append(out, line)
		}
	}
	return out
}

// EventBatchMsgID is the Nats-Msg-Id of a batch whose events carry the
// given EventMsgIDs: a hash of them in order, so a publish retried after a
// lost acknowledgement is stored once (per-event de-duplication is the
// fetcher's and the store's, see docs/decisions/0053-events-travel-in-batches.md).
func EventBatchMsgID(eventMsgIDs []string) string {
	h := sha256.New()
	for _, id := range eventMsgIDs {
		h.Write([]byte(id))
		h.Write([]byte{'\n'})
	}
	return "batch:" + hex.EncodeToString(h.Sum(nil))
}
