//go:build libsecp256k1

package verify

const wantBackend = Libsecp256k1
