//go:build !cgo

package config

// trimCHeap has nothing to return without cgo: no C allocator is in use.
func trimCHeap() {}
