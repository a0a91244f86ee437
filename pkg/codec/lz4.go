package codec

/*
#cgo CFLAGS: -O2
#cgo LDFLAGS: -l:liblz4.a
#include <stdlib.h>
#include <lz4.h>
#include "lz4page.h"

// gz_lz4_compress compresses one page with gzramd's page compressor, or
// anything else with liblz4; 0 means it does not fit in cap bytes.
static int gz_lz4_compress(gz_lz4_ctx *ctx, const char *src, char *dst, int n, int cap) {
	if (n == GZ_LZ4_PAGE) return gz_lz4_page(ctx, (const uint8_t *)src, (uint8_t *)dst, cap);
	return LZ4_compress_default(src, dst, n, cap);
}

// gz_lz4_compress_run compresses n consecutive pages from in into out (page
// i at out+i*GZ_LZ4_PAGE), so that a batch costs one cgo crossing.
static void gz_lz4_compress_run(gz_lz4_ctx *ctx, const char *in, int n, int limit, char *out, unsigned *lens) {
	for (int i = 0; i < n; i++) {
		size_t off = (size_t)i * GZ_LZ4_PAGE;
		lens[i] = (unsigned)gz_lz4_page(ctx, (const uint8_t *)in + off, (uint8_t *)out + off, limit);
	}
}
*/
import "C"

import (
	"unsafe"
)

// LZ4 compresses pages into the standard LZ4 block format with gzramd's own
// page compressor (lz4page.c), which beats liblz4's LZ4_compress_default,
// what kernel zram uses, at a ratio at least as good; inputs of other sizes
// go to liblz4. Decoding is liblz4's.
type LZ4 struct {
	ctxs chan *C.gz_lz4_ctx // reusable hash tables, allocated in C
}

// NewLZ4 returns the LZ4 codec.
func NewLZ4() *LZ4 { return &LZ4{ctxs: make(chan *C.gz_lz4_ctx, 64)} }

// Name implements Codec.
func (*LZ4) Name() string { return "lz4" }

// getCtx returns a hash table from the pool or a new one. Tables live in C
// memory so that cgo need not check them; a 8 KiB malloc failing is as
// fatal as the Go allocator failing.
func (c *LZ4) getCtx() *C.gz_lz4_ctx {
	select {
	case x := <-c.ctxs:
		return x
	default:
		x := (*C.gz_lz4_ctx)(C.malloc(C.sizeof_gz_lz4_ctx))
		if x == nil {
			panic("codec: out of C memory for an LZ4 hash table")
		}
		return x
	}
}

func (c *LZ4) putCtx(x *C.gz_lz4_ctx) {
	select {
	case c.ctxs <- x:
	default:
		C.free(unsafe.Pointer(x))
	}
}

// Compress implements Codec.
func (c *LZ4) Compress(dst, src []byte) int {
	if len(src) == 0 || len(dst) == 0 {
		return 0
	}
	x := c.getCtx()
	n := C.gz_lz4_compress(x, (*C.char)(unsafe.Pointer(&src[0])), (*C.char)(unsafe.Pointer(&dst[0])),
		C.int(len(src)), C.int(min(len(dst), 1<<30)))
	c.putCtx(x)
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
	x := c.getCtx()
	C.gz_lz4_compress_run(x, (*C.char)(unsafe.Pointer(&in[0])), C.int(n), C.int(limit),
		(*C.char)(unsafe.Pointer(&out[0])), (*C.unsigned)(unsafe.Pointer(&lens[0])))
	c.putCtx(x)
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
