package prefetch

import (
	"testing"
	"unsafe"
)

// Prefetching is only a hint: a nil pointer is accepted as well as one
// to memory.
func TestLineAcceptsAnyAddress(t *testing.T) {
	b := make([]byte, 64)
	Line(unsafe.Pointer(&b[0]))
	Line(nil)
}
