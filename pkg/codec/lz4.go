// The LZ4 codec: pages to standard LZ4 blocks and back, in C (lz4page.c,
// lz4dec.c) called through cgo.

package codec

/*
#include <stdlib.h>
#include <string.h>
#include "lz4dec.h"
#include "lz4page.h"

// gz_lz4_compress compresses a page with gzramd's page compressor and
// other inputs of up to 64 KiB with the same code; with ctx NULL (NewLZ4
// found no memory) its table is on the stack. 0 means the result does not
// fit in cap bytes, or the input is longer.
static int gz_lz4_compress(gz_lz4_ctx *ctx, const uint8_t *src, uint8_t *dst, int n, int cap) {
	if (ctx == NULL) {
		gz_lz4_ctx local;
		return gz_lz4_block(&local, src, n, dst, cap);
	}
	if (n == GZ_LZ4_PAGE) return gz_lz4_page(ctx, src, dst, cap);
	return gz_lz4_block(ctx, src, n, dst, cap);
}

// gz_lz4_compress_run compresses n consecutive pages from in into out
// (page i at out+i*GZ_LZ4_PAGE), so that a batch costs one cgo crossing.
static void gz_lz4_compress_run(gz_lz4_ctx *ctx, const uint8_t *in, int n, int limit, uint8_t *out, unsigned *lens) {
	for (int i = 0; i < n; i++) {
		size_t off = (size_t)i * GZ_LZ4_PAGE;
		int r = gz_lz4_compress(ctx, in + off, out + off, GZ_LZ4_PAGE, limit);
		lens[i] = r > 0 ? (unsigned)r : 0;
	}
}

// gz_lz4_new_ctxs allocates n compression contexts in one block and clears
// them, which also writes every page of the block: the contexts are
// resident before the first page is compressed.
static gz_lz4_ctx *gz_lz4_new_ctxs(int n) {
	gz_lz4_ctx *b = malloc(sizeof(gz_lz4_ctx) * (size_t)n);
	if (b != NULL) memset(b, 0, sizeof(gz_lz4_ctx) * (size_t)n);
	return b;
}
*/
import "C"

import (
	"math"
	"runtime"
	"unsafe"
)

// LZ4 compresses into the standard LZ4 block format with gzramd's own
// compressor (lz4page.c), faster than liblz4's LZ4_compress_default, what
// kernel zram runs, at a better ratio on memory pages; inputs of other
// sizes go through the same code, up to 64 KiB: Compress returns 0 for a
// longer one, which the caller keeps raw. It decodes with gzramd's own
// decoder (lz4dec.c). Both are C without dependencies, so building gzramd
// needs no LZ4 library; the tests check them against liblz4.
type LZ4 struct {
	// ctxs holds the compression contexts (8 KiB each), all allocated
	// and written by NewLZ4. A compression waits for a free one rather
	// than allocating: as a swap device, gzramd compresses while the
	// kernel is short of memory, and a fresh allocation there would
	// fault. A nil context (NewLZ4 could not allocate) makes the
	// compressor use one on the C stack.
	ctxs *contextPool[*C.gz_lz4_ctx]
	held int64 // their bytes
}

// NewLZ4 returns the LZ4 codec.
func NewLZ4() *LZ4 {
	// More contexts than can run at once (one per thread running Go
	// code), so that a caller seldom finds them all taken.
	n := min(runtime.GOMAXPROCS(0)+8, 64)
	block := C.gz_lz4_new_ctxs(C.int(n))
	if block == nil {
		// Out of memory at start: compress with a context on the C stack.
		return &LZ4{ctxs: newContextPool(make([]*C.gz_lz4_ctx, n))}
	}
	all, ctxs := unsafe.Slice(block, n), make([]*C.gz_lz4_ctx, n)
	for i := range all {
		ctxs[i] = &all[i]
	}
	c := &LZ4{held: int64(n) * C.sizeof_gz_lz4_ctx, ctxs: newContextPool(ctxs)}
	runtime.AddCleanup(c, func(b unsafe.Pointer) { C.free(b) }, unsafe.Pointer(block))
	return c
}

// Name implements Codec.
func (*LZ4) Name() string { return "lz4" }

// HeldBytes implements Codec.
func (c *LZ4) HeldBytes() int64 { return c.held }

// Compress implements Codec.
func (c *LZ4) Compress(dst, src []byte) int {
	if len(src) == 0 || len(dst) == 0 || len(src) > C.GZ_LZ4_MAX_INPUT {
		return 0
	}
	s := c.ctxs.get()
	n := C.gz_lz4_compress(s.ctx, (*C.uint8_t)(&src[0]), (*C.uint8_t)(&dst[0]), C.int(len(src)), C.int(min(len(dst), math.MaxInt32)))
	s.put()
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
	s := c.ctxs.get()
	C.gz_lz4_compress_run(s.ctx, (*C.uint8_t)(&in[0]), C.int(n), C.int(limit),
		(*C.uint8_t)(&out[0]), (*C.unsigned)(unsafe.Pointer(&lens[0])))
	s.put()
}

// DecompressPrefix decodes src, a block of len(dst) bytes, into dst as far
// as its first n bytes at least, and checks it only that far: a reader of
// one page of an object of several pages decodes the pages up to it. It
// fails with ErrCorrupt on input malformed before that.
func (*LZ4) DecompressPrefix(dst, src []byte, n int) error {
	if len(src) == 0 || len(dst) == 0 || len(src) > math.MaxInt32 || len(dst) > math.MaxInt32 {
		return ErrCorrupt
	}
	if C.gz_lz4_decode_prefix((*C.uint8_t)(&src[0]), C.int(len(src)), (*C.uint8_t)(&dst[0]), C.int(len(dst)), C.int(n)) != 0 {
		return ErrCorrupt
	}
	return nil
}

// Decompress implements Codec.
func (*LZ4) Decompress(dst, src []byte) error {
	if len(src) == 0 || len(dst) == 0 || len(src) > math.MaxInt32 || len(dst) > math.MaxInt32 {
		return ErrCorrupt
	}
	if C.gz_lz4_decode((*C.uint8_t)(&src[0]), C.int(len(src)), (*C.uint8_t)(&dst[0]), C.int(len(dst))) != 0 {
		return ErrCorrupt
	}
	return nil
}
