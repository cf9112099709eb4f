package ingester

import (
	"strconv"

	"github.com/nbd-wtf/go-nostr"
)

// pendingSet indexes the accepted, not yet written events of a batch by id,
// author, kind and tag value, so that whether a policy lookup would see one
// of them costs a few map reads, not a match against each.
type pendingSet struct {
	items []*item
	index map[pendingKey][]*nostr.Event
}

// pendingKey is one index entry: an id ('i'), author ('p'), kind ('k', in
// name) or tag value ('t', tag name and value).
type pendingKey struct {
	field     byte
	name, val string
}

func newPendingSet() *pendingSet { return &pendingSet{index: map[pendingKey][]*nostr.Event{}} }

func (p *pendingSet) add(it *item) {
	e := it.evt
	p.items = append(p.items, it)
	p.put(pendingKey{'i', "", e.ID}, e)
	p.put(pendingKey{'p', "", e.PubKey}, e)
	p.put(pendingKey{'k', "", strconv.Itoa(e.Kind)}, e)
	for _, t := range e.Tags {
		if len(t) >= 2 {
			p.put(pendingKey{'t', t[0], t[1]}, e)
		}
	}
}

func (p *pendingSet) put(key pendingKey, e *nostr.Event) {
	list := p.index[key]
	if len(list) > 0 && list[len(list)-1] == e {
		return // the same tag twice on one event
	}
	p.index[key] = append(list, e)
}

// has reports whether an event with id is in p; a nil set holds nothing.
func (p *pendingSet) has(id string) bool {
	return p != nil && len(p.index[pendingKey{'i', "", id}]) > 0
}

// matches reports whether a pending event matches f. Candidates come from
// one field f constrains (every field must match, so any one of them finds
// all candidates); f.Matches decides. A nil set matches nothing.
func (p *pendingSet) matches(f nostr.Filter) bool {
	if p == nil || len(p.items) == 0 {
		return false
	}
	match := func(key pendingKey) bool {
		for _, e := range p.index[key] {
			if f.Matches(e) {
				return true
			}
		}
		return false
	}
	switch {
	case len(f.IDs) > 0:
		for _, id := range f.IDs {
			if match(pendingKey{'i', "", id}) {
				return true
			}
		}
	case len(f.Tags) > 0:
		for k, vals := range f.Tags {
			for _, v := range vals {
				if match(pendingKey{'t', k, v}) {
					return true
				}
			}
			return false // one tag name finds every candidate
		}
	case len(f.Authors) > 0:
		for _, a := range f.Authors {
			if match(pendingKey{'p', "", a}) {
				return true
			}
		}
	case len(f.Kinds) > 0:
		for _, k := range f.Kinds {
			if match(pendingKey{'k', "", strconv.Itoa(k)}) {
				return true
			}
		}
	default:
		for _, it := range p.items {
			if f.Matches(it.evt) {
				return true
			}
		}
	}
	return false
}
