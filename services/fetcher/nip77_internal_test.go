package fetcher

import (
	"context"
	"errors"
	"testing"

	"github.com/grasp-sync/grasp-sync/pkg/negsync"
)

func TestNIP77Verdict(t *testing.T) {
	tests := []struct {
		name     string
		rounds   int
		err      error
		answered bool
		refused  bool
	}{
		{"reconciled", 2, nil, true, false},
		{"an id fetch failed after NEG-MSGs", 1, errNoIDs, true, false},
		{"khatru without NIP-77", 0, &negsync.UnsupportedError{Reason: "NOTICE: failed to parse envelope: unknown envelope label"}, false, true},
		{"strfry with negentropy off", 0, &negsync.UnsupportedError{Reason: "NOTICE: ERROR: bad msg: negentropy disabled"}, false, true},
		{"NEG-ERR refusing the protocol", 0, &negsync.UnsupportedError{Reason: "NEG-ERR: negentropy disabled"}, false, true},
		{"NEG-ERR refusing the filter", 0, &negsync.UnsupportedError{Reason: "NEG-ERR: blocked: too many query results"}, true, false},
		{"no answer in time", 0, &negsync.UnsupportedError{Reason: "no answer within 30s"}, false, false},
		{"session ended", 0, context.Canceled, false, false},
		{"other error", 0, errors.New("write: broken pipe"), false, false},
	}
	for _, tc := range tests {
		answered, refusal := nip77Verdict(tc.rounds, tc.err)
		if answered != tc.answered || (refusal != "") != tc.refused {
			t.Errorf("%s: answered %v, refusal %q; want answered %v, refused %v", tc.name, answered, refusal, tc.answered, tc.refused)
		}
	}
}
