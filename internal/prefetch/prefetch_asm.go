//go:build amd64 || arm64

// Line on architectures with a prefetch instruction (assembly beside).

package prefetch

import "unsafe"

// Line asks for the cache line holding p. It never faults, whatever p is,
// and does not wait for the line to arrive.
//
//go:noescape
func Line(p unsafe.Pointer)
