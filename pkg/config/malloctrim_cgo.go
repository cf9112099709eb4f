//go:build cgo

package config

/*
#include <stdlib.h>
#ifdef __GLIBC__
#include <malloc.h>
static void grasp_malloc_trim(void) { malloc_trim(0); }
#else
static void grasp_malloc_trim(void) {}
#endif
*/
import "C"

// trimCHeap returns the C allocator's free memory to the system: glibc
// keeps what cgo code frees (pebble's block cache and memtables in cgo
// builds) in its per-thread arenas, so an idle graspd held tens of MB the
// store no longer used (docs/decisions/0065-work-in-flight-bounded-by-bytes.md).
// A no-op with another C library.
func trimCHeap() { C.grasp_malloc_trim() }
