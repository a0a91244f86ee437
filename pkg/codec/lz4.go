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

static void *gz_lz4_new_state(void) {
	void *s = malloc(LZ4_sizeofState());
	if (s) LZ4_initStream(s, LZ4_sizeofState());
	return s;
}
*/
import "C"

import (
	"unsafe"
)

// LZ4 is liblz4's block compressor at acceleration 1, the codec kernel zram
// uses by default.
type LZ4 struct {
	states chan unsafe.Pointer // reusable LZ4_stream_t, allocated in C
}

// NewLZ4 returns the liblz4 codec.
func NewLZ4() *LZ4 { return &LZ4{states: make(chan unsafe.Pointer, 64)} }

// Name implements Codec.
func (*LZ4) Name() string { return "lz4" }

func (c *LZ4) getState() unsafe.Pointer {
	select {
	case s := <-c.states:
		return s
	default:
		// nil (malloc failed) is handled by the callers' fallback to
		// a stack state.
		return C.gz_lz4_new_state()
	}
}

func (c *LZ4) putState(s unsafe.Pointer) {
	if s == nil {
		return
	}
	select {
	case c.states <- s:
	default:
		C.free(s)
	}
}

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
