package relaylimits

import (
	"slices"
	"sync"

	"github.com/mailru/easyjson/jwriter"
	"github.com/nbd-wtf/go-nostr"
)

// ReqOverhead is what a REQ message adds around its filters:
// `["REQ","<subscription id>",` and `]`, with room for the longest
// subscription id we make and the commas between filters.
const ReqOverhead = 64

// FilterSize is the size of f encoded as a REQ carries it (as
// f.MarshalJSON encodes it). It encodes into a buffer kept for the next
// call instead of building a fresh copy: live sets are packed by size at
// every change, and those copies were 3 % of what graspd allocated in a sync
// at 1,000 relays (docs/measurements/2026-12-07-issue32-growth-profiles.md).
func FilterSize(f nostr.Filter) int {
	bp := encodeBufs.Get().(*[]byte)
	defer encodeBufs.Put(bp)
	w := jwriter.Writer{NoEscapeHTML: true} // as Filter.MarshalJSON
	w.Buffer.Buf = (*bp)[:0]
	f.MarshalEasyJSON(&w)
	// b is the kept buffer when the encoding fitted; otherwise a larger
	// one, and the kept buffer went to easyjson's chunk pool with the
	// rest of the encoding, so it is no longer ours.
	b := w.Buffer.BuildBytes()
	if cap(b) <= maxEncodeBuf {
		*bp = b[:0]
	} else {
		*bp = make([]byte, 0, encodeBufSize)
	}
	if w.Error != nil {
		return 0
	}
	return len(b)
}

// encodeBufs are FilterSize's buffers, at first encodeBufSize and grown to
// the largest filter encoded, up to maxEncodeBuf.
var encodeBufs = sync.Pool{New: func() any {
	b := make([]byte, 0, encodeBufSize)
	return &b
}}

const (
	encodeBufSize = 16 << 10
	maxEncodeBuf  = 1 << 20
)

// Pack divides fs into REQs that fit l: at most l.MaxFilters filters and
// l.MaxMessageBytes bytes each (0: unbounded), in order, as few REQs as a
// greedy fill gives. A filter too large for one message on its own is split
// into filters over halves of its longest value list (ids, authors or a
// tag's values) until each fits: the union of the parts matches exactly
// what the filter matched, so nothing asked for is lost. A filter that
// cannot be split further (no list with two values) is sent as it is.
func Pack(fs []nostr.Filter, l Limits) [][]nostr.Filter {
	budget := 0
	if l.MaxMessageBytes > 0 {
		budget = max(l.MaxMessageBytes-ReqOverhead, 1)
	}
	var out [][]nostr.Filter
	var cur []nostr.Filter
	used := 0
	flush := func() {
		if len(cur) > 0 {
			out = append(out, cur)
			cur, used = nil, 0
		}
	}
	for _, f := range fs {
		for _, part := range splitToFit(f, budget) {
			size := FilterSize(part) + 1 // its comma
			if len(cur) > 0 && ((l.MaxFilters > 0 && len(cur) >= l.MaxFilters) || (budget > 0 && used+size > budget)) {
				flush()
			}
			cur = append(cur, part)
			used += size
		}
	}
	flush()
	return out
}

// splitToFit returns f, or the halves of its longest list recursively,
// each at most budget bytes encoded (budget 0: f as it is).
func splitToFit(f nostr.Filter, budget int) []nostr.Filter {
	if budget <= 0 || FilterSize(f) <= budget {
		return []nostr.Filter{f}
	}
	a, b, ok := halve(f)
	if !ok {
		return []nostr.Filter{f}
	}
	return append(splitToFit(a, budget), splitToFit(b, budget)...)
}

// halve splits f's longest value list (ids, authors, a tag's values) in
// two; ok is false when no list has two values.
func halve(f nostr.Filter) (a, b nostr.Filter, ok bool) {
	longest, which := 1, ""
	if len(f.IDs) > longest {
		longest, which = len(f.IDs), "ids"
	}
	if len(f.Authors) > longest {
		longest, which = len(f.Authors), "authors"
	}
	names := make([]string, 0, len(f.Tags))
	for name := range f.Tags {
		names = append(names, name)
	}
	slices.Sort(names) // a stable choice among equal lists
	for _, name := range names {
		if n := len(f.Tags[name]); n > longest {
			longest, which = n, "#"+name
		}
	}
	if which == "" {
		return f, f, false
	}
	a, b = f, f
	switch which {
	case "ids":
		mid := len(f.IDs) / 2
		a.IDs, b.IDs = slices.Clone(f.IDs[:mid]), slices.Clone(f.IDs[mid:])
	case "authors":
		mid := len(f.Authors) / 2
		a.Authors, b.Authors = slices.Clone(f.Authors[:mid]), slices.Clone(f.Authors[mid:])
	default:
		name := which[1:]
		vs := f.Tags[name]
		mid := len(vs) / 2
		a.Tags, b.Tags = cloneTags(f.Tags), cloneTags(f.Tags)
		a.Tags[name], b.Tags[name] = slices.Clone(vs[:mid]), slices.Clone(vs[mid:])
	}
	if f.Limit > 0 {
		// Each half may hold as many as the whole: a limit is a cap, not
		// a share.
		a.Limit, b.Limit = f.Limit, f.Limit
	}
	return a, b, true
}

func cloneTags(t nostr.TagMap) nostr.TagMap {
	out := make(nostr.TagMap, len(t))
	for k, v := range t {
		out[k] = v
	}
	return out
}
