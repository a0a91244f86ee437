package codec

/*
#cgo LDFLAGS: -l:liblz4.a
#define LZ4_STATIC_LINKING_ONLY
#include <stdlib.h>
#include <string.h>
#include <lz4.h>
#include "lz4page.h"

// gz_lz4_state is what one compression needs: the page compressor's table
// and, for inputs of other sizes, liblz4's state.
typedef struct gz_lz4_state {
	gz_lz4_ctx page;
	LZ4_stream_t other;
} gz_lz4_state;

// gz_lz4_compress compresses a page with gzramd's page compressor and
// anything else with liblz4; with state NULL (NewLZ4 found no memory)
// everything goes to liblz4, its state on the stack. 0 means the result
// does not fit in cap bytes.
static int gz_lz4_compress(gz_lz4_state *state, const char *src, char *dst, int n, int cap) {
	if (state == NULL) return LZ4_compress_default(src, dst, n, cap);
	if (n == GZ_LZ4_PAGE) return gz_lz4_page(&state->page, (const uint8_t *)src, (uint8_t *)dst, cap);
	return LZ4_compress_fast_extState_fastReset(&state->other, src, dst, n, cap, 1);
}

// gz_lz4_compress_run compresses n consecutive pages from in into out
// (page i at out+i*GZ_LZ4_PAGE), so that a batch costs one cgo crossing.
static void gz_lz4_compress_run(gz_lz4_state *state, const char *in, int n, int limit, char *out, unsigned *lens) {
	for (int i = 0; i < n; i++) {
		size_t off = (size_t)i * GZ_LZ4_PAGE;
		int r = gz_lz4_compress(state, in + off, out + off, GZ_LZ4_PAGE, limit);
		lens[i] = r > 0 ? (unsigned)r : 0;
	}
}

// gz_lz4_new_states allocates n states in one block and initializes each,
// which also writes every page of the block: the states are resident before
// the first page is compressed.
static gz_lz4_state *gz_lz4_new_states(int n) {
	gz_lz4_state *b = malloc(sizeof(gz_lz4_state) * (size_t)n);
	if (b == NULL) return NULL;
	for (int i = 0; i < n; i++) {
		memset(&b[i].page, 0, sizeof b[i].page);
		LZ4_initStream(&b[i].other, sizeof b[i].other);
	}
	return b;
}
*/
import "C"

import (
	"runtime"
	"unsafe"
)

// LZ4 compresses into the standard LZ4 block format. Pages go to gzramd's
// own page compressor (lz4page.c), faster than liblz4's
// LZ4_compress_default, what kernel zram runs, at a better ratio on
// memory pages; inputs of other sizes go to liblz4. Decoding is liblz4's.
type LZ4 struct {
	// states holds the compression states (24 KiB each),
	// all allocated and written by NewLZ4. A compression waits for a free
	// one rather than allocating: as a swap device, gzramd compresses
	// while the kernel is short of memory, and a fresh allocation there
	// would fault.
	states chan unsafe.Pointer
}

// NewLZ4 returns the LZ4 codec.
func NewLZ4() *LZ4 {
	// More states than can run at once (one per thread running Go code),
	// with room for callers between getting one and entering C.
	n := min(2*runtime.GOMAXPROCS(0)+8, 64)
	c := &LZ4{states: make(chan unsafe.Pointer, n)}
	block := C.gz_lz4_new_states(C.int(n))
	if block == nil {
		// Out of memory at start: compress with a state on the C stack.
		for range n {
			c.states <- nil
		}
		return c
	}
	size := unsafe.Sizeof(C.gz_lz4_state{})
	for i := range n {
		c.states <- unsafe.Add(unsafe.Pointer(block), uintptr(i)*size)
	}
	runtime.AddCleanup(c, func(b unsafe.Pointer) { C.free(b) }, unsafe.Pointer(block))
	return c
}

// Name implements Codec.
func (*LZ4) Name() string { return "lz4" }

// getState waits for a free state; nil (NewLZ4 could not allocate) makes
// liblz4 compress, with its state on the stack.
func (c *LZ4) getState() unsafe.Pointer { return <-c.states }

func (c *LZ4) putState(s unsafe.Pointer) { c.states <- s }

// Compress implements Codec.
func (c *LZ4) Compress(dst, src []byte) int {
	if len(src) == 0 || len(dst) == 0 {
		return 0
	}
	s := c.getState()
	n := C.gz_lz4_compress((*C.gz_lz4_state)(s), (*C.char)(unsafe.Pointer(&src[0])), (*C.char)(unsafe.Pointer(&dst[0])),
		C.int(len(src)), C.int(len(dst)))
	c.putState(s)
	if n <= 0 {
		return 0
	}
	return int(n)
}

// compressPages compresses n pages from in into out at page strides; a
// length of 0 means the page did not compress to limit bytes or fewer.
func (c *LZ4) compressPages(in, out []byte, lens []uint32, n, limit int) {
	if n == 0 {
		return
	}
	s := c.getState()
	C.gz_lz4_compress_run((*C.gz_lz4_state)(s), (*C.char)(unsafe.Pointer(&in[0])), C.int(n), C.int(limit),
		(*C.char)(unsafe.Pointer(&out[0])), (*C.unsigned)(unsafe.Pointer(&lens[0])))
	c.putState(s)
}

// Decompress implements Codec.
func (*LZ4) Decompress(dst, src []byte) error {
	if len(src) == 0 || len(dst) == 0 {
		return ErrCorrupt
	}
	n := C.LZ4_decompress_safe((*C.char)(unsafe.Pointer(&src[0])), (*C.char)(unsafe.Pointer(&dst[0])),
		C.int(len(src)), C.int(len(dst)))
	if int(n) != len(dst) {
		return ErrCorrupt
	}
	return nil
}
