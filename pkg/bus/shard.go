package bus

import "hash/fnv"

// DefaultShards is how many shards relays are spread over by default.
const DefaultShards = 16

// ShardOf returns the shard a relay belongs to: FNV-1a of its normalised URL
// modulo the shard count. Every component must use this one function so a
// relay's commands, reports and events meet at the same fetcher.
func ShardOf(normalizedURL string, shards int) int {
	if shards <= 1 {
		return 0
	}
	h := fnv.New32a()
	h.Write([]byte(normalizedURL))
	return int(h.Sum32() % uint32(shards))
}
