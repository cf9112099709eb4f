package ingester

import (
	"slices"
	"strconv"
	"strings"

	"github.com/nbd-wtf/go-nostr"
)

// filterKey identifies a filter for the lookup cache: every field the
// policy sets, cheaper than its JSON form.
func filterKey(f nostr.Filter) string {
	var sb strings.Builder
	sb.Grow(80 * (1 + len(f.IDs) + len(f.Authors)))
	for _, id := range f.IDs {
		sb.WriteString(id)
		sb.WriteByte(',')
	}
	sb.WriteByte('|')
	for _, a := range f.Authors {
		sb.WriteString(a)
		sb.WriteByte(',')
	}
	sb.WriteByte('|')
	for _, k := range f.Kinds {
		sb.WriteString(strconv.Itoa(k))
		sb.WriteByte(',')
	}
	sb.WriteByte('|')
	tags := make([]string, 0, len(f.Tags))
	for k := range f.Tags {
		tags = append(tags, k)
	}
	slices.Sort(tags)
	for _, k := range tags {
		sb.WriteString(strconv.Itoa(len(k)))
		sb.WriteByte(':')
		sb.WriteString(k)
		sb.WriteByte('=')
		for _, v := range f.Tags[k] {
			// Length-prefixed: any byte may follow, none is escaped.
			sb.WriteString(strconv.Itoa(len(v)))
			sb.WriteByte(':')
			sb.WriteString(v)
		}
		sb.WriteByte(';')
	}
	sb.WriteByte('|')
	if f.Since != nil {
		sb.WriteString(strconv.FormatInt(int64(*f.Since), 10))
	}
	sb.WriteByte('|')
	if f.Until != nil {
		sb.WriteString(strconv.FormatInt(int64(*f.Until), 10))
	}
	sb.WriteByte('|')
	sb.WriteString(strconv.Itoa(f.Limit))
	if f.LimitZero {
		sb.WriteString("z")
	}
	sb.WriteByte('|')
	sb.WriteString(f.Search)
	return sb.String()
}
