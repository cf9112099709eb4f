package testrelay

import (
	"context"
	"encoding/binary"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nbd-wtf/go-nostr"

	"github.com/grasp-sync/grasp-sync/pkg/testkit"
)

// frame builds one websocket frame (client frames masked).
func frame(op byte, payload []byte, mask bool) []byte {
	b := []byte{0x80 | op}
	mbit := byte(0)
	if mask {
		mbit = 0x80
	}
	switch n := len(payload); {
	case n < 126:
		b = append(b, mbit|byte(n))
	case n < 1<<16:
		b = append(b, mbit|126, 0, 0)
		binary.BigEndian.PutUint16(b[2:], uint16(n))
	default:
		b = append(b, mbit|127, 0, 0, 0, 0, 0, 0, 0, 0)
		binary.BigEndian.PutUint64(b[2:], uint64(n))
	}
	if !mask {
		return append(b, payload...)
	}
	key := [4]byte{0x12, 0x34, 0x56, 0x78}
	b = append(b, key[:]...)
	for i, c := range payload {
		b = append(b, c^key[i%4])
	}
	return b
}

// TestFrameSnifferLabels: the labels of masked and unmasked messages of
// every length class are read whatever the chunking of the stream, and
// control frames are not messages.
func TestFrameSnifferLabels(t *testing.T) {
	long := `["EVENT","s",{"content":"` + strings.Repeat("x", 70000) + `"}]`
	msgs := []struct {
		op      byte
		payload string
	}{
		{1, `["REQ","sub",{"kinds":[1]}]`},
		{9, ``}, // ping
		{1, `["NEG-OPEN","n",{},"61"]`},
		{1, `["EVENT","s",{"content":"` + strings.Repeat("y", 300) + `"}]`},
		{1, long},
		{1, `[]`},
		{1, `["CLOSE","sub"]`},
	}
	want := []string{"REQ", "NEG-OPEN", "EVENT", "EVENT", "", "CLOSE"}
	for _, mask := range []bool{true, false} {
		var stream []byte
		for _, m := range msgs {
			stream = append(stream, frame(m.op, []byte(m.payload), mask)...)
		}
		// The upgrade's HTTP request (or response) comes first on the socket.
		withHTTP := append([]byte("GET / HTTP/1.1\r\nUpgrade: websocket\r\n\r\n"), stream...)
		for _, chunk := range []int{1, 3, 7, 100, len(withHTTP)} {
			for _, http := range []bool{false, true} {
				in := stream
				if http {
					in = withHTTP
				}
				var got []string
				var first string
				s := frameSniffer{inHTTP: http, line: []byte{}, onLabel: func(l string) { got = append(got, l) }, onHeaders: func(l string) { first = l }}
				for b := range slices.Chunk(in, chunk) {
					s.feed(b)
				}
				if !slices.Equal(got, want) || (http && first != "GET / HTTP/1.1") {
					t.Errorf("mask %v, http %v, chunks of %d: labels %q (first line %q), want %q", mask, http, chunk, got, first, want)
				}
			}
		}
	}
}

// TestMemStoreQueries: newest first, limits, since/until, tag and author
// indexes, ids, and the tag-letter quirk.
func TestMemStoreQueries(t *testing.T) {
	ctx := context.Background()
	k := testkit.NewKey()
	repo := testkit.RepoRef(k.PubKey, "r")
	var issues []*nostr.Event
	for i := range 10 {
		issues = append(issues, k.Issue(repo, "i", testkit.At(nostr.Timestamp(1000+i))))
	}
	cmt := k.Comment(issues[0], issues[0], "c", testkit.At(2000))
	for _, quirk := range []bool{false, true} {
		st := &MemStore{IgnoreTagLetter: quirk}
		for _, e := range append(slices.Clone(issues), cmt) {
			if err := st.SaveEvent(ctx, e); err != nil {
				t.Fatal(err)
			}
		}
		if err := st.SaveEvent(ctx, cmt); err == nil {
			t.Fatal("duplicate saved")
		}
		q := func(f nostr.Filter) []string { return eventIDs(st.query(f)...) }
		since, until := nostr.Timestamp(1003), nostr.Timestamp(1006)
		if got, want := q(nostr.Filter{Tags: nostr.TagMap{"a": {repo}}, Limit: 3}), eventIDs(issues[9], issues[8], issues[7]); !slices.Equal(got, want) {
			t.Errorf("quirk %v: #a limit 3 = %v, want %v", quirk, got, want)
		}
		if got, want := q(nostr.Filter{Kinds: []int{testkit.KindIssue}, Since: &since, Until: &until}), eventIDs(issues[6], issues[5], issues[4], issues[3]); !slices.Equal(got, want) {
			t.Errorf("quirk %v: since/until = %v, want %v", quirk, got, want)
		}
		if got := q(nostr.Filter{Authors: []string{k.PubKey}}); len(got) != 11 || got[0] != cmt.ID {
			t.Errorf("quirk %v: by author = %d events, first %v", quirk, len(got), got)
		}
		if got := q(nostr.Filter{IDs: []string{issues[2].ID, cmt.ID, "nope"}}); !slices.Equal(got, eventIDs(cmt, issues[2])) {
			t.Errorf("quirk %v: by ids = %v", quirk, got)
		}
		// #e names issue 0, which the comment tags with both e and E.
		if got := q(nostr.Filter{Tags: nostr.TagMap{"E": {issues[0].ID}}}); !slices.Equal(got, eventIDs(cmt)) {
			t.Errorf("quirk %v: #E = %v", quirk, got)
		}
		// #A with the repository: only the quirk answers the a-tagged issues.
		got := q(nostr.Filter{Tags: nostr.TagMap{"A": {repo}}})
		if quirk != (len(got) == 10) || (!quirk && len(got) != 0) {
			t.Errorf("quirk %v: #A with an a-tagged value = %d events", quirk, len(got))
		}
	}
}

// eventIDs returns the ids of evts.
func eventIDs(evts ...*nostr.Event) []string {
	out := make([]string, len(evts))
	for i, e := range evts {
		out[i] = e.ID
	}
	return out
}

// TestFarmCountsAndCaps runs a farm of four relays and checks what a
// client sees (the REQ cap, NIP-77 on half, a NOTICE for NEG-OPEN on the
// others) and what the farm counts of it.
func TestFarmCountsAndCaps(t *testing.T) {
	f, err := StartFarm(FarmOptions{Relays: 4, NegentropyFraction: 0.5})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	k := testkit.NewKey()
	repo := testkit.RepoRef(k.PubKey, "r")
	for i := range 600 {
		if err := f.Add(ctx, k.Issue(repo, "i", testkit.At(nostr.Timestamp(1000+i))), []int{0, 1}); err != nil {
			t.Fatal(err)
		}
	}
	if f.Relays[0].Negentropy || !f.Relays[1].Negentropy || f.Relays[2].Negentropy || !f.Relays[3].Negentropy {
		t.Fatalf("NIP-77 on relays: %v %v %v %v, want every other one", f.Relays[0].Negentropy, f.Relays[1].Negentropy, f.Relays[2].Negentropy, f.Relays[3].Negentropy)
	}
	got, err := QueryAll(ctx, f.Relays[0].URL, nostr.Filter{Tags: nostr.TagMap{"a": {repo}}, Limit: 1000})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 500 {
		t.Errorf("REQ with limit 1000 answered %d events, want the cap of 500", len(got))
	}
	// NEG-OPEN to each of relays 0 (no NIP-77) and 1 (NIP-77).
	answers := map[int]string{}
	for _, i := range []int{0, 1} {
		c, err := Dial(ctx, f.Relays[i].URL)
		if err != nil {
			t.Fatal(err)
		}
		if err := c.Write(ctx, []any{"NEG-OPEN", "n", nostr.Filter{Tags: nostr.TagMap{"a": {repo}}}, "6100000200"}); err != nil {
			t.Fatal(err)
		}
		_, raw, err := c.Read(ctx)
		if err != nil {
			t.Fatal(err)
		}
		answers[i] = raw
		_ = c.Close()
	}
	if !strings.HasPrefix(answers[0], `["NOTICE"`) || !strings.HasPrefix(answers[1], `["NEG-MSG"`) {
		t.Errorf("NEG-OPEN answers: without NIP-77 %.40s, with %.40s", answers[0], answers[1])
	}
	// Counts settle once the relay goroutines ran.
	deadline := time.Now().Add(5 * time.Second)
	var st []RelayStats
	for {
		st = f.Stats()
		if st[0].WSOpen == 0 && st[1].WSOpen == 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	r0, r1 := st[0], st[1]
	if r0.Stored != 600 || r1.Stored != 600 || st[2].Stored != 0 {
		t.Errorf("stored %d %d %d, want 600 600 0", r0.Stored, r1.Stored, st[2].Stored)
	}
	if r0.WSOpened != 2 || r0.REQs != 1 || r0.NegOpens != 1 || r0.EventsSent != 500 || r0.EOSEs != 1 || r0.NegSessions != 0 || r0.Notices != 1 {
		t.Errorf("relay 0 counted %+v; want 2 sessions, 1 REQ, 1 NEG-OPEN, 500 events, 1 EOSE, no NIP-77 session, 1 NOTICE", r0)
	}
	if r1.WSOpened != 1 || r1.REQs != 0 || r1.NegOpens != 1 || r1.NegSessions != 1 || r1.NegSent != 1 || r1.EventsSent != 0 {
		t.Errorf("relay 1 counted %+v; want 1 session, 1 NEG-OPEN served, 1 NEG-MSG sent, no events", r1)
	}
	if r0.BytesOut < 500*200 || r0.BytesIn == 0 {
		t.Errorf("relay 0 bytes in %d out %d: out should hold 500 events", r0.BytesIn, r0.BytesOut)
	}
}
