package store

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"

	"github.com/nbd-wtf/go-nostr"
)

// kvTagKey is one tag key to write: its prefix and, in format v3, the
// cases carrying the value (0 in format v2, which has no cases byte).
type kvTagKey struct {
	prefix []byte
	cases  byte
}

// kvTagKeys lists an event's tag keys: one per distinct letter and value,
// in format v3 both cases of a letter together (kvFold), in format v2
// (v2 true) each letter as given.
func kvTagKeys(evt *nostr.Event, v2 bool) []kvTagKey {
	var tags []kvTagKey
	for _, t := range evt.Tags {
		if len(t) < 2 || len(t[0]) != 1 {
			continue
		}
		letter, bit := t[0][0], byte(0)
		if !v2 {
			letter, bit = kvFold(letter)
		}
		p := kvTagPrefix(letter, t[1])
		if n := slices.IndexFunc(tags, func(q kvTagKey) bool { return bytes.Equal(p, q.prefix) }); n >= 0 {
			tags[n].cases |= bit
			continue
		}
		tags = append(tags, kvTagKey{prefix: p, cases: bit})
	}
	return tags
}

// kvIndexKeys are the index keys of evt stored under serial (tag keys as
// format v2 wrote them if v2). They share one allocation: a batch writes
// several per event.
func kvIndexKeys(evt *nostr.Event, pk []byte, serial uint64, v2 bool) [][]byte {
	tags := kvTagKeys(evt, v2)
	const sfx = 16 // ts, serial
	kind := flip(int64(evt.Kind))
	buf := make([]byte, 0, (1+8+sfx)+(1+len(pk)+8+sfx)+len(tags)*(10+sfx+1))
	keys := make([][]byte, 0, 2+len(tags))
	key := func(cases byte, parts ...[]byte) {
		start := len(buf)
		for _, p := range parts {
			buf = append(buf, p...)
		}
		buf = binary.BigEndian.AppendUint64(buf, flip(int64(evt.CreatedAt)))
		buf = binary.BigEndian.AppendUint64(buf, serial)
		if cases != 0 {
			buf = append(buf, cases)
		}
		keys = append(keys, buf[start:len(buf):len(buf)])
	}
	kb := binary.BigEndian.AppendUint64(nil, kind)
	key(0, []byte{kvKind}, kb)
	key(0, []byte{kvAuthKind}, pk, kb)
	for _, t := range tags {
		key(t.cases, t.prefix)
	}
	return keys
}

// kvPrepared is an event ready to write: its decoded id and pubkey.
type kvPrepared struct {
	n       int
	evt     *nostr.Event
	id, pk  []byte
	size    int
	payload []byte
}

func (k *kv) insert(ctx context.Context, evt *nostr.Event) (bool, error) {
	r := k.insertBatch(ctx, []*nostr.Event{evt})[0]
	return r.Stored, r.Err
}

// insertBatch writes regular events with distinct ids, as few engine
// writes as their size allows, holding the stripes of their ids.
func (k *kv) insertBatch(ctx context.Context, evts []*nostr.Event) []SaveResult {
	ids := make([]string, len(evts))
	for n, evt := range evts {
		ids[n] = evt.ID
	}
	unlock := k.locks.lockAll(ids)
	defer unlock()
	return k.write(ctx, evts)
}

// write stores the events not stored yet; the caller holds their stripes
// (or, for a replaceable event, its key's: only replace writes those ids).
func (k *kv) write(ctx context.Context, evts []*nostr.Event) []SaveResult {
	res := make([]SaveResult, len(evts))
	done, err := k.enter()
	if err != nil {
		for n := range res {
			res[n].Err = err
		}
		return res
	}
	defer done()
	var todo []kvPrepared
	for n, evt := range evts {
		p, err := kvPrepare(evt)
		if err != nil {
			res[n].Err = err
			continue
		}
		p.n = n
		todo = append(todo, p)
	}
	for len(todo) > 0 {
		if err := ctx.Err(); err != nil {
			for _, p := range todo {
				res[p.n].Err = err
			}
			break
		}
		size, end := 0, 0
		for end < len(todo) && (end == 0 || size+todo[end].size <= k.txnBytes) {
			size += todo[end].size
			end++
		}
		k.writeChunk(todo[:end], res)
		todo = todo[end:]
	}
	return res
}

func kvPrepare(evt *nostr.Event) (kvPrepared, error) {
	id, ok := decode32(evt.ID)
	if !ok {
		return kvPrepared{}, fmt.Errorf("%w: id %q is not 32 bytes of hex", ErrUnstorable, evt.ID)
	}
	pk, ok := decode32(evt.PubKey)
	if !ok {
		return kvPrepared{}, fmt.Errorf("%w: pubkey %q is not 32 bytes of hex", ErrUnstorable, evt.PubKey)
	}
	payload, err := evt.MarshalJSON()
	if err != nil {
		return kvPrepared{}, fmt.Errorf("%w: encode: %v", ErrUnstorable, err)
	}
	return kvPrepared{evt: evt, id: id, pk: pk, payload: payload, size: len(payload) + 64*(5+len(evt.Tags))}, nil
}

// writeChunk stores the events of chunk that are not stored yet in one
// write, and splits the chunk when the engine finds it too big.
func (k *kv) writeChunk(chunk []kvPrepared, res []SaveResult) {
	w := k.eng.newWrite()
	defer w.discard()
	var wrote, newKinds []int
	var wroteIDs [][]byte
	var wroteTags [][4]uint64
	ids := k.ids.load()
	err := func() error {
		for _, p := range chunk {
			idKey := kvIDKey(p.id)
			// The filter has every id stored, and any writer of this
			// one holds its stripe: if it has not seen the id, the id
			// is not stored.
			if ids.mayHave(p.id) {
				found, err := w.get(idKey, func([]byte) error { return nil })
				if err != nil {
					return err
				}
				if found {
					continue // stored already: a duplicate
				}
			}
			serial, err := k.eng.nextSerial()
			if err != nil {
				return fmt.Errorf("next serial: %w", err)
			}
			if err := w.set(kvRawKey(serial), p.payload); err != nil {
				return err
			}
			if err := w.set(idKey, binary.BigEndian.AppendUint64(nil, serial)); err != nil {
				return err
			}
			if !k.noItemKeys {
				if err := w.set(kvItemKey(serial), kvItemValue(p.id, p.pk, p.evt.Kind)); err != nil {
					return err
				}
			}
			keys := kvIndexKeys(p.evt, p.pk, serial, k.tagsV2)
			n := len(wroteTags)
			wroteTags = tagKeyWords(wroteTags, keys)
			k.addTags(wroteTags[n:], false)
			for _, key := range keys {
				if err := w.set(key, nil); err != nil {
					return err
				}
			}
			if !k.kinds.isSaved(p.evt.Kind) && !slices.Contains(newKinds, p.evt.Kind) {
				if err := w.set(append([]byte{kvKnownKind}, kvKindBytes(p.evt.Kind)...), nil); err != nil {
					return err
				}
				newKinds = append(newKinds, p.evt.Kind)
			}
			wrote = append(wrote, p.n)
			wroteIDs = append(wroteIDs, p.id)
		}
		k.kinds.listKinds(newKinds...)
		return w.commit()
	}()
	switch {
	case err == nil:
		k.kinds.save(newKinds...)
		k.addIDs(wroteIDs)
		k.addTags(wroteTags, true)
		for _, n := range wrote {
			res[n].Stored = true
		}
	case errors.Is(err, errKVTooBig) && len(chunk) > 1:
		w.discard()
		k.writeChunk(chunk[:len(chunk)/2], res)
		k.writeChunk(chunk[len(chunk)/2:], res)
	case errors.Is(err, errKVTooBig):
		res[chunk[0].n].Err = fmt.Errorf("%w: %d bytes is more than one %s write holds", ErrUnstorable, chunk[0].size, k.eng.name())
	default:
		for _, p := range chunk {
			res[p.n].Err = err
		}
	}
}

func (k *kv) replace(ctx context.Context, evt *nostr.Event) (bool, error) {
	mu := k.locks.lock(ReplaceKey(evt))
	defer mu.Unlock()
	insert := func(ctx context.Context, evt *nostr.Event) (bool, error) {
		r := k.write(ctx, []*nostr.Event{evt})[0]
		return r.Stored, r.Err
	}
	return replaceVersions(ctx, evt, k.versions, insert, k.delete)
}

// versions returns every stored version of evt's replaceable key.
func (k *kv) versions(ctx context.Context, evt *nostr.Event) ([]*nostr.Event, error) {
	f := nostr.Filter{Kinds: []int{evt.Kind}, Authors: []string{evt.PubKey}, Limit: DefaultQueryLimit}
	if nostr.IsAddressableKind(evt.Kind) {
		f.Tags = nostr.TagMap{"d": {evt.Tags.GetD()}}
	}
	all, err := k.query(ctx, f)
	if err != nil {
		return nil, err
	}
	return sameKey(evt, all), nil
}

func (k *kv) delete(_ context.Context, evt *nostr.Event) error {
	id, ok := decode32(evt.ID)
	if !ok {
		return nil // never stored
	}
	done, err := k.enter()
	if err != nil {
		return err
	}
	defer done()
	var serial uint64
	var stored *nostr.Event
	err = k.eng.view(func(r kvReader) error {
		var err error
		serial, stored, err = kvLookup(r, id)
		return err
	})
	if err != nil || stored == nil {
		return err
	}
	pk, _ := decode32(stored.PubKey)
	w := k.eng.newWrite()
	defer w.discard()
	keys := append(kvIndexKeys(stored, pk, serial, k.tagsV2), kvRawKey(serial), kvIDKey(id), kvItemKey(serial))
	if k.legacyTags {
		// Written before format v3, its tag keys may be v2's.
		keys = append(keys, kvIndexKeys(stored, pk, serial, true)[2:]...)
	}
	for _, key := range keys {
		if err := w.delete(key); err != nil {
			return err
		}
	}
	return w.commit()
}
