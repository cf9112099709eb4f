// Package relaylimits is what a remote relay allows of its clients and how
// our messages are made to fit it: the size of one message, the number of
// subscriptions open at once (NIP-77 sessions included), the filters of one
// REQ and the events one filter returns. Relays say some of it in their
// NIP-11 document (`limitation`) and enforce it whether they say it or not:
// strfry and nostr-rs-relay close the connection on a message over 128 KiB
// (websocket status 1009) and refuse the subscription over their count with
// a NOTICE or a CLOSED (docs/sync.md, "What relays allow").
//
// The package is pure: the budgets in force (Limits.Effective), reading a
// NIP-11 document (ParseNIP11) and knowing which software caps each filter
// apart (CapsEachFilter), recognising a refusal (Classify), learning a
// smaller budget from one (Learn) and packing filters into REQs that fit
// (Pack). Fetching the document and counting subscriptions are I/O and live
// with the connection (pkg/relayconn, services/fetcher).
package relaylimits

import (
	"encoding/json"
	"regexp"
	"strings"
)

// Defaults are the budgets used where a relay says nothing: values every
// common relay accepts (docs/sync.md, "What relays allow"). strfry and
// nostr-rs-relay accept 131,072-byte messages, 20 subscriptions (strfry's
// long-standing default; nostr-rs-relay 32) and 20 filters per REQ (strfry
// releases have used 20 and 200), and return at most 500 events per filter.
// The message budget is half of theirs, so a relay configured tighter than
// the defaults still takes most messages.
var Defaults = Limits{
	MaxMessageBytes:  64 << 10,
	MaxSubscriptions: 20,
	MaxFilters:       20,
	MaxLimit:         500,
}

// Floors are the smallest budgets learning goes down to: below them no
// message we must send fits (one REQ of 100 ids is ~7 KB; a NIP-77 frame is
// at least 4,096 bytes, hex-encoded twice that), so a relay refusing those
// is refusing us, not a size.
var Floors = Limits{
	MaxMessageBytes:  16 << 10,
	MaxSubscriptions: 2,
	MaxFilters:       1,
	MaxLimit:         1,
}

// Limits are a relay's budgets; 0 means not known (use the default).
type Limits struct {
	// MaxMessageBytes is the largest message we may send (NIP-11
	// max_message_length).
	MaxMessageBytes int
	// MaxSubscriptions is how many REQs and NIP-77 sessions may be open
	// at once on one connection (NIP-11 max_subscriptions).
	MaxSubscriptions int
	// MaxFilters is how many filters one REQ may carry (NIP-11
	// max_filters).
	MaxFilters int
	// MaxLimit is the most events one filter returns (NIP-11 max_limit).
	MaxLimit int
}

// IsZero reports whether nothing is known.
func (l Limits) IsZero() bool { return l == Limits{} }

// Min is the smaller of each known value (0 = unknown, never smaller).
func (l Limits) Min(o Limits) Limits {
	m := func(a, b int) int {
		switch {
		case a <= 0:
			return max(b, 0)
		case b <= 0:
			return a
		}
		return min(a, b)
	}
	return Limits{m(l.MaxMessageBytes, o.MaxMessageBytes), m(l.MaxSubscriptions, o.MaxSubscriptions),
		m(l.MaxFilters, o.MaxFilters), m(l.MaxLimit, o.MaxLimit)}
}

// Effective is the budget in force for a relay: what it advertised, or the
// default where it said nothing, lowered by what its refusals taught us.
// An advertised value larger than the default is used as it is (a relay
// that says 200 subscriptions means it); learned values only ever lower it.
func Effective(advertised, learned Limits) Limits {
	pick := func(adv, def int) int {
		if adv > 0 {
			return adv
		}
		return def
	}
	e := Limits{
		MaxMessageBytes:  pick(advertised.MaxMessageBytes, Defaults.MaxMessageBytes),
		MaxSubscriptions: pick(advertised.MaxSubscriptions, Defaults.MaxSubscriptions),
		MaxFilters:       pick(advertised.MaxFilters, Defaults.MaxFilters),
		MaxLimit:         pick(advertised.MaxLimit, Defaults.MaxLimit),
	}
	return e.Min(learned)
}

// ParseNIP11 reads the `limitation` object and the `software` of a NIP-11
// document. Values that are missing, not numbers or not positive are left
// unknown, as is a software that is not a string; a document that is not
// JSON is an error.
func ParseNIP11(doc []byte) (l Limits, software string, err error) {
	var d struct {
		Limitation map[string]json.RawMessage `json:"limitation"`
		Software   json.RawMessage            `json:"software"`
	}
	if err := json.Unmarshal(doc, &d); err != nil {
		return Limits{}, "", err
	}
	_ = json.Unmarshal(d.Software, &software) // not a string: unknown
	num := func(key string) int {
		raw, ok := d.Limitation[key]
		if !ok {
			return 0
		}
		var f float64
		if json.Unmarshal(raw, &f) != nil || f < 1 || f > 1<<31 {
			return 0
		}
		return int(f)
	}
	return Limits{
		MaxMessageBytes:  num("max_message_length"),
		MaxSubscriptions: num("max_subscriptions"),
		MaxFilters:       num("max_filters"),
		MaxLimit:         num("max_limit"),
	}, software, nil
}

// capsEachFilter are the NIP-11 software values of relays whose source
// applies each filter's limit on its own, with no cap on a whole REQ and a
// cap per filter of at least 100 events by default
// (docs/decisions/0086-history-limits-per-filter.md).
var capsEachFilter = map[string]bool{
	"github.com/hoytech/strfry":              true, // maxFilterLimit 500 per filter
	"git.sr.ht/~gheartsfield/nostr-rs-relay": true, // one LIMIT per filter's query (PostgreSQL: at most 1,000)
	"github.com/fiatjaf/khatru":              true, // each filter to its store; eventstore's stores cap at 100–1,500
}

// CapsEachFilter reports whether a relay saying software in NIP-11 is known
// to cap the events of each filter of a REQ on its own, never the REQ as a
// whole: every filter may then ask as many as the smallest cap assumed of
// one filter, where an unknown relay's filters must share it. The value is
// compared without its scheme, a "git+" prefix, a ".git" suffix, a
// trailing slash and case.
func CapsEachFilter(software string) bool {
	s := strings.ToLower(strings.TrimSpace(software))
	s = strings.TrimPrefix(s, "git+")
	if i := strings.Index(s, "://"); i >= 0 {
		s = s[i+3:]
	}
	s = strings.TrimSuffix(strings.TrimSuffix(s, "/"), ".git")
	return capsEachFilter[s]
}

// Refusal is what a relay's NOTICE or CLOSED text refuses.
type Refusal int

// The refusals Classify tells apart.
const (
	// NotARefusal is any other text.
	NotARefusal Refusal = iota
	// TooManySubscriptions: the REQ (or NEG-OPEN) was over the relay's
	// count of open subscriptions (strfry: NOTICE "ERROR: too many
	// concurrent REQs"; nostr-rs-relay: CLOSED "error: too many
	// subscriptions" style texts).
	TooManySubscriptions
	// TooManyFilters: the REQ carried more filters than the relay takes.
	TooManyFilters
	// MessageTooLarge: the message was over the relay's size limit (said
	// in words; most relays close the connection with status 1009 instead).
	MessageTooLarge
	// AuthRequired: the relay serves this read only to an authenticated
	// client (NIP-42, CLOSED "auth-required:").
	AuthRequired
	// Restricted: the relay does not serve this read to us (CLOSED
	// "restricted:").
	Restricted
)

func (r Refusal) String() string {
	switch r {
	case TooManySubscriptions:
		return "subscriptions"
	case TooManyFilters:
		return "filters"
	case MessageTooLarge:
		return "message_size"
	case AuthRequired:
		return "auth_required"
	case Restricted:
		return "restricted"
	}
	return "none"
}

// IsLimit reports whether the refusal is of a budget (size, count): the
// relay takes the same request once it fits. Auth and restriction refusals
// are not limits: they refuse the read itself.
func (r Refusal) IsLimit() bool {
	return r == TooManySubscriptions || r == TooManyFilters || r == MessageTooLarge
}

var (
	tooManySubs    = regexp.MustCompile(`(?i)too many (concurrent |open |active )?(subscriptions|subs|reqs)\b|too many concurrent (neg |negentropy )?requests|max(imum)?[ _-]?(number of )?(concurrent |open )?(subscriptions|subs)|subscription (limit|count)`)
	tooManyFilters = regexp.MustCompile(`(?i)too many filters|max(imum)?[ _-]?(number of )?filters|filter (count|limit)|filters? (is|are) too (many|large)|bad req: arr too big`)
	tooLarge       = regexp.MustCompile(`(?i)(message|payload|frame|event|req(uest)?) (is |was )?too (big|large|long)|max(imum)?[ _-]?message[ _-]?(length|size)|exceeds? (the )?(max|maximum|size)`)
	// sizeInText is nostr-rs-relay's "message too large (N > LIMIT)".
	sizeInText = regexp.MustCompile(`\(\s*\d+\s*>\s*(\d+)\s*\)`)
)

// Classify says what a NOTICE or CLOSED text refuses. Machine-readable
// prefixes (NIP-01: "auth-required:", "restricted:") are read first, after
// the "ERROR: " strfry puts before every error it sends; limits are
// recognised by the words strfry, nostr-rs-relay and khatru use
// (docs/dependencies.md, "Public relays' limits").
func Classify(text string) Refusal {
	t := strings.TrimSpace(text)
	t = strings.TrimPrefix(t, "NOTICE: ")
	t = strings.TrimPrefix(t, "ERROR: ")
	switch {
	case strings.HasPrefix(t, "auth-required:"):
		return AuthRequired
	case strings.HasPrefix(t, "restricted:"):
		return Restricted
	case tooManySubs.MatchString(t):
		return TooManySubscriptions
	case tooManyFilters.MatchString(t):
		return TooManyFilters
	case tooLarge.MatchString(t):
		return MessageTooLarge
	}
	return NotARefusal
}

// SaysNegentropy reports whether a refusal of the subscription count is of
// NIP-77 sessions (strfry counts them apart: "too many concurrent NEG
// requests"), so it refuses the NEG-OPEN sent last, not a REQ.
func SaysNegentropy(text string) bool {
	l := strings.ToLower(text)
	return strings.Contains(l, " neg ") || strings.Contains(l, "negentropy")
}

// SizeLimitIn reads the limit a refusal of a message's size names, as
// nostr-rs-relay's "message too large (N > LIMIT)" does (0 when none).
func SizeLimitIn(text string) int {
	m := sizeInText.FindStringSubmatch(text)
	if m == nil {
		return 0
	}
	n := 0
	for _, c := range m[1] {
		n = n*10 + int(c-'0')
		if n > 1<<31 {
			return 0
		}
	}
	return n
}

// Learn lowers l after a refusal of kind r. openSubs is how many
// subscriptions were open, the refused one included, when it was refused;
// filters how many filters the refused REQ carried; size the size of the
// refused (or largest recent) message. The result never goes below Floors
// and never rises. changed says whether anything was lowered.
func Learn(l Limits, r Refusal, openSubs, filters, size int) (out Limits, changed bool) {
	out = l
	lower := func(cur *int, to, floor int) {
		to = max(to, floor)
		if *cur == 0 || to < *cur {
			*cur, changed = to, true
		}
	}
	switch r {
	case TooManySubscriptions:
		if openSubs > 0 {
			lower(&out.MaxSubscriptions, openSubs-1, Floors.MaxSubscriptions)
		}
	case TooManyFilters:
		if filters > 0 {
			lower(&out.MaxFilters, filters/2, Floors.MaxFilters)
		}
	case MessageTooLarge:
		if size > 0 {
			lower(&out.MaxMessageBytes, size/2, Floors.MaxMessageBytes)
		}
	}
	return out, changed
}
