// Package zstddeep runs kernels/zstd_deep.h, the dense tier's encoder of
// frames of several pages written for the GPU, on the host through cgo:
// the tests check its frames with libzstd and measure its ratio against
// libzstd's levels on the memory-page corpus.
package zstddeep

/*
#cgo CFLAGS: -O2 -DZP_PAGE=16384 -DZP_MAX_SEQ=4096 -DZP_NO_CHAIN_MF -DZP_WORKSPACE_LIMIT=65536
#include <stdlib.h>
#include "zstd_deep.h"

static int zd_go_compress(const uint8_t *src, int n, uint8_t *dst, int cap, zp_workspace *ws, zd_scratch *sc) {
	return zd_compress_frame(src, n, dst, cap, ws, sc);
}
*/
import "C"

import (
	"sync"
	"unsafe"
)

// MaxFrame is the largest frame's content: 4 pages.
const MaxFrame = C.ZP_PAGE

type state struct {
	ws *C.zp_workspace
	sc *C.zd_scratch
}

// The encoder's state is C memory: its scratch holds pointers to nothing,
// and at 300 KiB it is better kept off the Go heap's scans.
var states = sync.Pool{New: func() any {
	return &state{
		ws: (*C.zp_workspace)(C.calloc(1, C.sizeof_zp_workspace)),
		sc: (*C.zd_scratch)(C.calloc(1, C.sizeof_zd_scratch)),
	}
}}

// Compress writes src, 256 to MaxFrame bytes, as one zstd frame into dst
// and returns its length; 0 means the frame would not be smaller than src
// or would not fit dst.
func Compress(dst, src []byte) int {
	if len(src) < 256 || len(src) > MaxFrame || len(dst) == 0 {
		return 0
	}
	st := states.Get().(*state)
	n := C.zd_go_compress((*C.uint8_t)(unsafe.Pointer(&src[0])), C.int(len(src)),
		(*C.uint8_t)(unsafe.Pointer(&dst[0])), C.int(min(len(dst), 1<<30)), st.ws, st.sc)
	states.Put(st)
	return int(n)
}
