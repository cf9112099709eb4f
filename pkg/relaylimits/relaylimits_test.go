package relaylimits

import (
	"fmt"
	"strings"
	"testing"

	"github.com/nbd-wtf/go-nostr"
)

func TestEffective(t *testing.T) {
	for _, tc := range []struct {
		name              string
		advertised, learn Limits
		want              Limits
	}{
		{"silent relay gets the defaults", Limits{}, Limits{}, Defaults},
		{"advertised values are used, larger ones too", Limits{MaxMessageBytes: 131072, MaxSubscriptions: 200}, Limits{},
			Limits{MaxMessageBytes: 131072, MaxSubscriptions: 200, MaxFilters: 20, MaxLimit: 500}},
		{"learned values lower the advertised", Limits{MaxMessageBytes: 131072}, Limits{MaxMessageBytes: 40000, MaxSubscriptions: 9},
			Limits{MaxMessageBytes: 40000, MaxSubscriptions: 9, MaxFilters: 20, MaxLimit: 500}},
		{"learned values never raise", Limits{MaxFilters: 10}, Limits{MaxFilters: 15}, Limits{MaxMessageBytes: 65536, MaxSubscriptions: 20, MaxFilters: 10, MaxLimit: 500}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := Effective(tc.advertised, tc.learn); got != tc.want {
				t.Fatalf("Effective = %+v, want %+v", got, tc.want)
			}
		})
	}
}

func TestParseNIP11(t *testing.T) {
	for _, tc := range []struct {
		doc  string
		want Limits
		err  bool
	}{
		// strfry's document: max_message_length, max_subscriptions, max_limit.
		{`{"name":"x","limitation":{"max_message_length":131072,"max_subscriptions":20,"max_limit":500,"max_filters":20}}`,
			Limits{131072, 20, 20, 500}, false},
		{`{"name":"silent"}`, Limits{}, false},
		{`{"limitation":{"max_message_length":"big","max_subscriptions":-1,"max_limit":0.5}}`, Limits{}, false},
		{`<html>`, Limits{}, true},
	} {
		got, _, err := ParseNIP11([]byte(tc.doc))
		if (err != nil) != tc.err || got != tc.want {
			t.Errorf("ParseNIP11(%s) = %+v, %v; want %+v, err %v", tc.doc, got, err, tc.want, tc.err)
		}
	}
}

func TestParseNIP11Software(t *testing.T) {
	for doc, want := range map[string]string{
		`{"software":"git+https://github.com/hoytech/strfry.git","version":"1.1.1"}`: "git+https://github.com/hoytech/strfry.git",
		`{"software":"https://git.sr.ht/~gheartsfield/nostr-rs-relay"}`:              "https://git.sr.ht/~gheartsfield/nostr-rs-relay",
		`{"name":"silent"}`: "",
		`{"software":42}`:   "",
		`{"software":null}`: "",
	} {
		if _, got, err := ParseNIP11([]byte(doc)); err != nil || got != want {
			t.Errorf("ParseNIP11(%s) software = %q, %v; want %q", doc, got, err, want)
		}
	}
}

func TestCapsEachFilter(t *testing.T) {
	for software, want := range map[string]bool{
		// What each relay's source puts in NIP-11 (decision 0086).
		"git+https://github.com/hoytech/strfry.git":      true,
		"https://git.sr.ht/~gheartsfield/nostr-rs-relay": true,
		"https://github.com/fiatjaf/khatru":              true,
		// The same names written otherwise.
		"https://github.com/hoytech/strfry":  true,
		"HTTPS://GitHub.com/fiatjaf/khatru/": true,
		// Unknown or absent: filters share the cap.
		"":                                       false,
		"https://github.com/Cameri/nostream":     false,
		"https://github.com/hoytech/strfry-fork": false,
		"https://github.com/fiatjaf/khatru/../relay29": false,
		"strfry": false,
	} {
		if got := CapsEachFilter(software); got != want {
			t.Errorf("CapsEachFilter(%q) = %v, want %v", software, got, want)
		}
	}
}

func TestClassify(t *testing.T) {
	for text, want := range map[string]Refusal{
		"ERROR: too many concurrent REQs":                                   TooManySubscriptions, // strfry
		"ERROR: too many concurrent NEG requests":                           TooManySubscriptions, // strfry's NIP-77 pool
		"Subscription error: Maximum concurrent subscription count reached": TooManySubscriptions, // nostr-rs-relay
		"ERROR: bad req: arr too big":                                       TooManyFilters,       // strfry
		"message too large (140000 > 131072)":                               MessageTooLarge,      // nostr-rs-relay
		"ERROR: auth-required: requested filter requires authentication":    AuthRequired,         // strfry
		"NOTICE: ERROR: too many concurrent REQs":                           TooManySubscriptions,
		"error: too many subscriptions":                                     TooManySubscriptions,
		"blocked: max subscriptions reached":                                TooManySubscriptions,
		"ERROR: too many filters":                                           TooManyFilters,
		"error: filter count exceeds maximum":                               TooManyFilters,
		"invalid: message too large":                                        MessageTooLarge,
		"auth-required: we only serve this to members":                      AuthRequired,
		"restricted: not allowed":                                           Restricted,
		"rate-limited: slow down":                                           NotARefusal,
		"ERROR: bad msg: negentropy disabled":                               NotARefusal,
		"":                                                                  NotARefusal,
		"blocked: too many filters, and auth-required: is text":             TooManyFilters,
	} {
		if got := Classify(text); got != want {
			t.Errorf("Classify(%q) = %v, want %v", text, got, want)
		}
	}
}

func TestSizeLimitIn(t *testing.T) {
	for text, want := range map[string]int{
		"message too large (140000 > 131072)": 131072,
		"message too large":                   0,
		"(5 > x)":                             0,
	} {
		if got := SizeLimitIn(text); got != want {
			t.Errorf("SizeLimitIn(%q) = %d, want %d", text, got, want)
		}
	}
	if !SaysNegentropy("ERROR: too many concurrent NEG requests") || SaysNegentropy("ERROR: too many concurrent REQs") {
		t.Fatal("SaysNegentropy")
	}
}

func TestLearn(t *testing.T) {
	start := Effective(Limits{}, Limits{})
	for _, tc := range []struct {
		name                string
		r                   Refusal
		open, filters, size int
		want                Limits
		changed             bool
	}{
		{"strfry's NOTICE at the 21st subscription", TooManySubscriptions, 21, 0, 0, Limits{MaxSubscriptions: 20}, false},
		{"the 9th subscription refused", TooManySubscriptions, 9, 0, 0, Limits{MaxSubscriptions: 8}, true},
		{"filters halved", TooManyFilters, 0, 20, 0, Limits{MaxFilters: 10}, true},
		{"a 60 KB message refused", MessageTooLarge, 0, 0, 60000, Limits{MaxMessageBytes: 30000}, true},
		{"never below the floor", MessageTooLarge, 0, 0, 9000, Limits{MaxMessageBytes: Floors.MaxMessageBytes}, true},
		{"auth is not a limit", AuthRequired, 5, 5, 5, Limits{}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, _ := Learn(Limits{}, tc.r, tc.open, tc.filters, tc.size)
			if got != tc.want {
				t.Fatalf("Learn = %+v, want %+v", got, tc.want)
			}
			// Against the budget in force: changed says whether it went down.
			eff := Effective(Limits{}, got)
			if lowered := eff != start; lowered != tc.changed {
				t.Fatalf("effective %+v lowered = %v, want %v", eff, lowered, tc.changed)
			}
		})
	}
	// Learning never raises.
	l, _ := Learn(Limits{MaxSubscriptions: 5}, TooManySubscriptions, 12, 0, 0)
	if l.MaxSubscriptions != 5 {
		t.Fatalf("learning raised the budget to %d", l.MaxSubscriptions)
	}
}

func hexID(i int) string { return fmt.Sprintf("%064x", i) }

// layer3 is the planner's per-root filters: one chunk of ids under #e,
// #E and #q.
func layer3(from, n int) []nostr.Filter {
	ids := make([]string, n)
	for i := range ids {
		ids[i] = hexID(from + i)
	}
	var out []nostr.Filter
	for _, letter := range []string{"e", "E", "q"} {
		out = append(out, nostr.Filter{Tags: nostr.TagMap{letter: ids}, Limit: 0, LimitZero: true})
	}
	return out
}

func TestPackFitsAndLosesNothing(t *testing.T) {
	var fs []nostr.Filter
	for c := 0; c < 20; c++ { // 60 filters of 100 ids: ~400 KB
		fs = append(fs, layer3(c*100, 100)...)
	}
	fs = append(fs, nostr.Filter{Kinds: []int{30617, 10317}})
	huge := layer3(10_000, 3000)[0] // one filter of ~200 KB: must be split
	fs = append(fs, huge)
	for _, l := range []Limits{Defaults, {MaxMessageBytes: 131072, MaxFilters: 20}, {MaxMessageBytes: 20000, MaxFilters: 3}, {MaxFilters: 7}} {
		t.Run(fmt.Sprintf("%d bytes, %d filters", l.MaxMessageBytes, l.MaxFilters), func(t *testing.T) {
			reqs := Pack(fs, l)
			for i, r := range reqs {
				// The size as go-nostr encodes the whole REQ: an oracle
				// apart from FilterSize.
				msg, err := nostr.ReqEnvelope{SubscriptionID: "g" + strings.Repeat("z", 13), Filters: r}.MarshalJSON()
				if err != nil {
					t.Fatal(err)
				}
				if l.MaxMessageBytes > 0 && len(msg) > l.MaxMessageBytes {
					t.Fatalf("REQ %d is %d bytes, over %d", i, len(msg), l.MaxMessageBytes)
				}
				if l.MaxFilters > 0 && len(r) > l.MaxFilters {
					t.Fatalf("REQ %d has %d filters, over %d", i, len(r), l.MaxFilters)
				}
			}
			// Every event any original filter matches, some packed filter
			// matches, and nothing else.
			matchesAny := func(evt *nostr.Event, set []nostr.Filter) bool {
				for _, f := range set {
					if f.Matches(evt) {
						return true
					}
				}
				return false
			}
			var packed []nostr.Filter
			for _, r := range reqs {
				packed = append(packed, r...)
			}
			for i := 0; i < 13_100; i += 7 {
				for _, letter := range []string{"e", "E", "q", "p"} {
					evt := &nostr.Event{Kind: 1111, Tags: nostr.Tags{{letter, hexID(i)}}}
					if matchesAny(evt, fs) != matchesAny(evt, packed) {
						t.Fatalf("event tagging %s %d: original %v, packed %v", letter, i, matchesAny(evt, fs), matchesAny(evt, packed))
					}
				}
			}
			if !matchesAny(&nostr.Event{Kind: 30617}, packed) {
				t.Fatal("the layer-1 filter was lost")
			}
		})
	}
	// Without limits, one REQ.
	if n := len(Pack(fs, Limits{})); n != 1 {
		t.Fatalf("no limits: %d REQs, want 1", n)
	}
}

func TestPackDense(t *testing.T) {
	// 75 filters of 100 ids (a target-world relay's roots) in 64 KiB:
	// each REQ holds 9 (~6.9 KB each), so 9 REQs, not one per few.
	var fs []nostr.Filter
	for c := 0; c < 25; c++ {
		fs = append(fs, layer3(c*100, 100)...)
	}
	reqs := Pack(fs, Defaults)
	if len(reqs) > 9 {
		t.Fatalf("%d REQs for 75 filters in 64 KiB, want at most 9", len(reqs))
	}
}

// FilterSize agrees with go-nostr's own encoding of the filter, escapes and
// all, for filters of every size a REQ carries, again and again in any
// order (it keeps its buffer between calls; over 16 KiB the buffer grows,
// over 1 MiB it is not kept).
func TestFilterSizeIsTheEncodedLength(t *testing.T) {
	ids := func(n int) []string {
		out := make([]string, n)
		for i := range out {
			out[i] = fmt.Sprintf("%064x", i*7919)
		}
		return out
	}
	since, until := nostr.Timestamp(1700000000), nostr.Timestamp(1800000000)
	for _, f := range []nostr.Filter{
		{},
		{Kinds: []int{30617, 10317}},
		{Kinds: []int{1}, Limit: 0, LimitZero: true},
		{IDs: ids(1000), Since: &since, Until: &until, Limit: 500},
		{Tags: nostr.TagMap{"e": ids(100), "E": ids(100), "q": ids(100)}},
		{Tags: nostr.TagMap{"a": {`30617:` + fmt.Sprintf("%064x", 1) + `:<repo> & "quotes" \ ünïcode ☃`}}, Search: "a\nb\u2028"},
		{Authors: ids(3), Kinds: []int{30618}, Tags: nostr.TagMap{"d": {"x</script>"}}},
		{IDs: ids(20000)},
		{Kinds: []int{1}},
		{IDs: ids(1000)},
		{IDs: ids(3)},
	} {
		b, err := f.MarshalJSON()
		if err != nil {
			t.Fatal(err)
		}
		for range 2 {
			if got := FilterSize(f); got != len(b) {
				t.Errorf("FilterSize %d, encoded %d bytes: %s", got, len(b), b[:min(len(b), 120)])
			}
		}
	}
}
