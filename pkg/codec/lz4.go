package codec

/*
#cgo LDFLAGS: -l:liblz4.a
#define LZ4_STATIC_LINKING_ONLY
#include <stdlib.h>
#include <lz4.h>

static int gz_lz4_compress(void *state, const char *src, char *dst, int n, int cap) {
	if (state == NULL) return LZ4_compress_default(src, dst, n, cap);
	return LZ4_compress_fast_extState_fastReset(state, src, dst, n, cap, 1);
}

// gz_lz4_compress_run compresses n consecutive pages of size page from in
// into out (page i at out+i*page) with one reusable state, so a batch costs
// one cgo crossing and the hash table is reset cheaply between pages.
static void gz_lz4_compress_run(void *state, const char *in, int n, int page, int limit, char *out, unsigned *lens) {
	for (int i = 0; i < n; i++) {
		int r = gz_lz4_compress(state, in + (size_t)i * page, out + (size_t)i * page, page, limit);
		lens[i] = r > 0 ? (unsigned)r : 0;
	}
}

// gz_lz4_new_states allocates n states in one block and initializes each,
// which also writes every page of the block: the states are resident before
// the first page is compressed.
static void *gz_lz4_new_states(int n) {
	size_t size = (size_t)LZ4_sizeofState();
	char *b = malloc(size * (size_t)n);
	if (b == NULL) return NULL;
	for (int i = 0; i < n; i++) LZ4_initStream(b + (size_t)i * size, size);
	return b;
}

static int gz_lz4_state_size(void) { return LZ4_sizeofState(); }
*/
import "C"

import (
	"runtime"
	"unsafe"
)

// LZ4 is liblz4's block compressor at acceleration 1, the codec kernel zram
// uses by default.
type LZ4 struct {
	// states holds the compression states (LZ4_stream_t, 16 KiB each),
	// all allocated and written by NewLZ4. A compression waits for a free
	// one rather than allocating: as a swap device, gzramd compresses
	// while the kernel is short of memory, and a fresh allocation there
	// would fault.
	states chan unsafe.Pointer
}

// NewLZ4 returns the liblz4 codec.
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
	size := uintptr(C.gz_lz4_state_size())
	for i := range n {
		c.states <- unsafe.Add(block, uintptr(i)*size)
	}
	runtime.AddCleanup(c, func(b unsafe.Pointer) { C.free(b) }, block)
	return c
}

// Name implements Codec.
func (*LZ4) Name() string { return "lz4" }

// getState waits for a free state; nil (NewLZ4 could not allocate) makes
// liblz4 use one on the stack.
func (c *LZ4) getState() unsafe.Pointer { return <-c.states }

func (c *LZ4) putState(s unsafe.Pointer) { c.states <- s }

// Compress implements Codec.
func (c *LZ4) Compress(dst, src []byte) int {
	if len(src) == 0 || len(dst) == 0 {
		return 0
	}
	s := c.getState()
	n := C.gz_lz4_compress(s, (*C.char)(unsafe.Pointer(&src[0])), (*C.char)(unsafe.Pointer(&dst[0])),
		C.int(len(src)), C.int(len(dst)))
	c.putState(s)
	if n <= 0 {
		return 0
	}
	return int(n)
}

// compressPages compresses n pages from in into out at page strides; a
// length of 0 means the page would not shrink below PageSize.
func (c *LZ4) compressPages(in, out []byte, lens []uint32, n, limit int) {
	if n == 0 {
		return
	}
	s := c.getState()
	C.gz_lz4_compress_run(s, (*C.char)(unsafe.Pointer(&in[0])), C.int(n), PageSize, C.int(limit),
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
