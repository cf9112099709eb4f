package frameguard

import (
	"bytes"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"sync"

	"github.com/nbd-wtf/go-nostr"
	"github.com/nbd-wtf/go-nostr/nip77"
	"github.com/tidwall/gjson"

	"github.com/grasp-sync/grasp-sync/pkg/verify"
)

// What the guard (conn.go) decides on each complete client message, and
// the subscriptions of a connection it counts for that.

// connState is what the guard knows about one connection's protocol state.
type connState struct {
	mu   sync.Mutex
	subs map[string]struct{}
}

func newConnState() *connState { return &connState{subs: map[string]struct{}{}} }

// verdict is the guard's decision on one client message.
type verdict struct {
	forward bool   // hand the message to khatru
	reply   []byte // a message to send the client instead (JSON), if any
	what    string // why it was answered instead (metrics), with reply
	// await is how the guard learns that khatru has finished the message.
	await awaited
	// replaces: a REQ with the id of an open subscription, which khatru
	// would keep alongside the new one; the guard closes it first (NIP-01:
	// the new REQ replaces it).
	replaces bool
}

// inspect decides on one complete client message and, for a message khatru
// gets, says what ends khatru's work on it. eventAllowed is asked (and
// consumes a token) only for EVENT messages. Pure apart from st and
// eventAllowed, so it is table-tested without sockets.
//
// Messages other than EVENT are parsed here with the parser khatru uses
// (they are small), so the guard knows which envelope khatru will see: what
// khatru would answer only with a parse-failure NOTICE the guard answers
// itself, client-to-relay labels khatru ignores are dropped, and a message
// without a proper label never reaches khatru (whose NIP-77 fallback parser
// panics on some, e.g. `[","]`, taking the process down).
func inspect(msg []byte, st *connState, lim Limits, eventAllowed func() bool) verdict {
	l := label(msg)
	if !isLabel(l) {
		return malformed(errors.New("want a JSON array starting with a label"))
	}
	if l == "EVENT" {
		// khatru answers every EVENT with an OK, or a NOTICE if it cannot
		// parse it; parsing half a megabyte twice is not needed for that.
		if eventAllowed != nil && !eventAllowed() {
			return verdict{reply: okFalse(eventID(msg), "rate-limited: slow down, too many events from your address"), what: "event"}
		}
		if reason := badKeyOrSig(msg); reason != "" {
			return verdict{reply: okFalse(eventID(msg), reason), what: "malformed"}
		}
		return verdict{forward: true, await: answer("", "OK")}
	}
	if strings.HasPrefix(l, "NEG-") {
		switch env := nip77.ParseNegMessage(string(msg)).(type) {
		case *nip77.OpenEnvelope:
			return verdict{forward: true, await: answer(env.SubscriptionID, "NEG-MSG", "NEG-ERROR")}
		case *nip77.MessageEnvelope:
			return verdict{forward: true, await: answer(env.SubscriptionID, "NEG-MSG", "NEG-ERROR")}
		case *nip77.CloseEnvelope:
			return verdict{forward: true}
		case *nip77.ErrorEnvelope:
			return verdict{} // relay-to-client; khatru ignores it
		}
		return malformed(nostr.UnknownLabel)
	}
	env, err := nostr.NewMessageParser().ParseMessage(string(msg))
	if err != nil {
		return malformed(err)
	}
	switch env := env.(type) {
	case *nostr.ReqEnvelope:
		id := env.SubscriptionID
		if len(id) > lim.MaxSubIDLen {
			return verdict{reply: closed(id, fmt.Sprintf("invalid: subscription id longer than %d characters", lim.MaxSubIDLen)), what: "req"}
		}
		if n := len(env.Filters); n > lim.MaxFilters {
			return verdict{reply: closed(id, fmt.Sprintf("blocked: too many filters in one REQ (%d, limit %d)", n, lim.MaxFilters)), what: "req"}
		}
		for _, f := range env.Filters {
			if f.Search != "" {
				return verdict{reply: closed(id, SearchUnsupported), what: "req"}
			}
		}
		st.mu.Lock()
		defer st.mu.Unlock()
		_, open := st.subs[id]
		if !open && len(st.subs) >= lim.MaxSubs {
			return verdict{reply: closed(id, fmt.Sprintf("blocked: too many open subscriptions (limit %d); CLOSE one first", lim.MaxSubs)), what: "req"}
		}
		st.subs[id] = struct{}{}
		return verdict{forward: true, await: answer(id, "EOSE", "CLOSED"), replaces: open}
	case *nostr.CloseEnvelope:
		id := string(*env)
		st.mu.Lock()
		defer st.mu.Unlock()
		if _, open := st.subs[id]; !open {
			return verdict{} // khatru has nothing to close
		}
		delete(st.subs, id)
		return verdict{forward: true, await: awaited{kind: awaitClose, sub: id}}
	case *nostr.CountEnvelope:
		return verdict{forward: true, await: answer(env.SubscriptionID, "COUNT", "CLOSED")}
	case *nostr.AuthEnvelope:
		// khatru checks the AUTH event's signature (nip42) before anything
		// of ours sees it; see badKeyOrSig.
		if reason := keyOrSigReason(env.Event.PubKey, env.Event.Sig); reason != "" {
			return verdict{reply: okFalse(env.Event.ID, reason), what: "malformed"}
		}
		return verdict{forward: true, await: answer("", "OK")}
	}
	return verdict{} // NOTICE, EOSE, OK, CLOSED: relay-to-client, khatru ignores them
}

// badKeyOrSig returns why an EVENT message's event must not reach khatru,
// or "": a pubkey or signature that is not 64 / 128 lower-case hex
// characters. khatru verifies the signature before any hook of ours runs,
// and go-nostr's libsecp256k1 verifier (the default build, docs/decisions/0027-signature-verification-libsecp256k1.md)
// panics on an oversized pubkey or signature, which would end the process.
// The event is split as go-nostr splits it (gjson, ["EVENT", ev] or
// ["EVENT", sub, ev]) and every "pubkey" and "sig" member is checked, so a
// duplicate key (the decoder keeps the last) cannot slip past. gjson scans
// without decoding the content, so a large event is not parsed twice.
func badKeyOrSig(msg []byte) string {
	arr := gjson.ParseBytes(msg).Array()
	if len(arr) < 2 || len(arr) > 3 {
		return "" // khatru refuses the envelope without verifying
	}
	reason := ""
	arr[len(arr)-1].ForEach(func(k, v gjson.Result) bool {
		if v.Type != gjson.String {
			return true // null is skipped by the decoder, other types fail it
		}
		switch k.String() {
		case "pubkey":
			if !verify.WellFormedPubKey(v.String()) {
				reason = badPubKey
			}
		case "sig":
			if !verify.WellFormedSig(v.String()) {
				reason = badSig
			}
		}
		return reason == ""
	})
	return reason
}

// keyOrSigReason is the refusal for pubkey and sig, or "" if both are well
// formed.
func keyOrSigReason(pubkey, sig string) string {
	switch {
	case !verify.WellFormedPubKey(pubkey):
		return badPubKey
	case !verify.WellFormedSig(sig):
		return badSig
	}
	return ""
}

// isLabel reports whether l can be a message label: letters and dashes.
func isLabel(l string) bool {
	if l == "" {
		return false
	}
	for _, r := range l {
		if (r < 'A' || r > 'Z') && (r < 'a' || r > 'z') && r != '-' {
			return false
		}
	}
	return true
}

func (st *connState) forget(id string) {
	st.mu.Lock()
	delete(st.subs, id)
	st.mu.Unlock()
}

// label returns the first element of a JSON array message if it is a
// string of letters and dashes, without parsing the rest (an EVENT can be
// half a megabyte).
func label(msg []byte) string {
	msg = bytes.TrimLeft(msg, " \t\r\n")
	if len(msg) < 2 || msg[0] != '[' {
		return ""
	}
	msg = bytes.TrimLeft(msg[1:], " \t\r\n")
	if len(msg) < 2 || msg[0] != '"' {
		return ""
	}
	end := bytes.IndexByte(msg[1:], '"')
	if end < 0 || end > 16 {
		return ""
	}
	return string(msg[1 : 1+end])
}

var idField = regexp.MustCompile(`"id"\s*:\s*"([0-9a-f]{64})"`)

// eventID finds the id of the event in an EVENT message (or its first
// bytes) without parsing it whole; "" if not found.
func eventID(msg []byte) string {
	if m := idField.FindSubmatch(msg); m != nil {
		return string(m[1])
	}
	return ""
}
