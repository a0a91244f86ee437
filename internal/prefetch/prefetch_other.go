//go:build !amd64 && !arm64

// Line elsewhere: a no-op.

package prefetch

import "unsafe"

// Line asks for the cache line holding p; on this architecture it does
// nothing.
func Line(p unsafe.Pointer) {}
