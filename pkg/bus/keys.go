package bus

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"regexp"
	"strconv"
)

// Key layouts of the KV buckets Names declares. The writer and every reader
// of a bucket (another service, graspctl, pkg/syncstatus) build its keys
// here, so they agree by construction.

// RelayStateKeyPrefix starts every relay record's key in RelayStateBucket
// (written by the planner, read by pkg/syncstatus).
const RelayStateKeyPrefix = "relay."

// RelayStateKey is the RelayStateBucket key of a relay's record: the prefix
// and the relay URL in unpadded base64url, which only uses characters KV
// keys allow.
func RelayStateKey(url string) string {
	return RelayStateKeyPrefix + base64.RawURLEncoding.EncodeToString([]byte(url))
}

// RelayLimitsKeyPrefix starts every key of RelayLimitsBucket.
const RelayLimitsKeyPrefix = "limits."

// RelayLimitsKey is the RelayLimitsBucket key of a relay: the prefix and
// the URL in unpadded base64url, as RelayStateKey.
func RelayLimitsKey(url string) string {
	return RelayLimitsKeyPrefix + base64.RawURLEncoding.EncodeToString([]byte(url))
}

// FetcherShardKeys matches every FetcherShardKey (a KV key filter).
const FetcherShardKeys = "s.*"

// FetcherShardKey is the FetcherLeaseBucket key of one shard's lease.
func FetcherShardKey(shard int) string { return "s." + strconv.Itoa(shard) }

// FetcherMemberKeys matches every FetcherMemberKey (a KV key filter).
const FetcherMemberKeys = "m.*"

// FetcherMemberKey is the FetcherLeaseBucket key by which fetcher replica id
// announces itself (one KV token: characters keys do not allow become _).
func FetcherMemberKey(id string) string { return "m." + kvToken(id) }

// FetcherRelayKey is the FetcherRelayBucket key of a relay of a shard: the
// shard, then a hash of the URL (KV keys allow few characters).
func FetcherRelayKey(shard int, url string) string {
	h := sha256.Sum256([]byte(url))
	return "r." + strconv.Itoa(shard) + "." + hex.EncodeToString(h[:12])
}

// FetcherRelayKeys matches every FetcherRelayKey of a shard (a KV key
// filter).
func FetcherRelayKeys(shard int) string { return "r." + strconv.Itoa(shard) + ".*" }

var keyUnsafe = regexp.MustCompile(`[^-_=a-zA-Z0-9]`)

// kvToken makes a string safe as one KV key token.
func kvToken(s string) string { return keyUnsafe.ReplaceAllString(s, "_") }
