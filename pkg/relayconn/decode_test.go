package relayconn

import (
	"testing"

	"github.com/nbd-wtf/go-nostr"
)

// decodeEvent accepts exactly what go-nostr's EventEnvelope accepts for a
// subscription's EVENT and decodes the same event.
func TestDecodeEventMatchesEnvelope(t *testing.T) {
	evt := `{"id":"` + hex64('a') + `","pubkey":"` + hex64('b') + `","created_at":1700000000,"kind":1,"tags":[["e","x"],["t","a\"b"]],"content":"hi \u00e9 \"q\"","sig":"` + hex64('c') + hex64('d') + `"}`
	cases := []string{
		`["EVENT","s1",` + evt + `]`,
		` ["EVENT", "s1" , ` + evt + ` ] `,
		"\n[\"EVENT\",\"s1\",\n" + evt + "]",
		`["EVENT","s1",` + evt + `,"extra"]`,
		`["EVENT","s1"]`,
		`["EVENT","s1",[1,2]]`,
		`["EVENT","s1","{}"]`,
		`["EVENT","s1",{"kind":"x"}]`,
		`["EVENT","s1",{}]`,
	}
	for _, c := range cases {
		var env nostr.EventEnvelope
		wantErr := env.FromJSON(c) != nil
		got, err := decodeEvent([]byte(c))
		if (err != nil) != wantErr {
			t.Fatalf("%s: error %v, envelope's error %v", c, err, wantErr)
		}
		if err == nil && got.String() != env.Event.String() {
			t.Fatalf("%s: decoded %s, envelope %s", c, got, &env.Event)
		}
	}
}

func hex64(c byte) string {
	b := make([]byte, 64)
	for i := range b {
		b[i] = c
	}
	return string(b)
}
