//go:build liblz4

// The oracle itself: liblz4, linked statically through cgo.

package lz4oracle

/*
#cgo LDFLAGS: -l:liblz4.a
#include <lz4.h>

// gz_oracle_compress_pages compresses n pages the way `lz4 -b1 -B4096`
// does, with the library's one-shot call in a C loop into one hot buffer,
// each bounded by limit, and returns the total stored size, counting a page
// that does not fit as stored raw.
static long gz_oracle_compress_pages(const char *in, int n, int page, int limit, char *out) {
	long total = 0;
	for (int i = 0; i < n; i++) {
		int r = LZ4_compress_default(in + (size_t)i * page, out, page, limit);
		total += r > 0 ? r : page;
	}
	return total;
}

// gz_oracle_decode_pages decodes n blocks, block i lens[i] bytes at
// in+offs[i], each into the same page of out, in a C loop; -1 means one did
// not decode to a page.
static int gz_oracle_decode_pages(const char *in, const int *offs, const int *lens, int n, char *out, int page) {
	for (int i = 0; i < n; i++) {
		if (LZ4_decompress_safe(in + offs[i], out, lens[i], page) != page) return -1;
	}
	return 0;
}
*/
import "C"

import (
	"math"
	"unsafe"
)

// Available reports whether the oracle is built in.
const Available = true

// CompressBound is LZ4_compressBound: the longest block an input of n
// bytes compresses to.
func CompressBound(n int) int { return int(C.LZ4_compressBound(C.int(n))) }

// Compress compresses src into dst with LZ4_compress_default, liblz4's
// one-shot call, and returns the block's length, or 0 when it does not fit.
func Compress(dst, src []byte) int {
	if len(src) == 0 || len(dst) == 0 || len(src) > math.MaxInt32 {
		return 0
	}
	return int(C.LZ4_compress_default((*C.char)(unsafe.Pointer(&src[0])), (*C.char)(unsafe.Pointer(&dst[0])),
		C.int(len(src)), C.int(min(len(dst), math.MaxInt32))))
}

// Decompress decodes the block src into dst with LZ4_decompress_safe and
// fails with ErrDecode unless it fills dst exactly.
func Decompress(dst, src []byte) error {
	if len(src) == 0 || len(dst) == 0 || len(src) > math.MaxInt32 || len(dst) > math.MaxInt32 {
		return ErrDecode
	}
	n := C.LZ4_decompress_safe((*C.char)(unsafe.Pointer(&src[0])), (*C.char)(unsafe.Pointer(&dst[0])),
		C.int(len(src)), C.int(len(dst)))
	if int(n) != len(dst) {
		return ErrDecode
	}
	return nil
}

// CompressPages compresses the pages of pageSize bytes in pages with
// LZ4_compress_default in one C loop, each bounded by limit, and returns
// the total stored size, a page that does not fit counting as pageSize:
// the baseline gzramd's compressor is measured against.
func CompressPages(pages []byte, pageSize, limit int) int64 {
	n := len(pages) / pageSize
	if n == 0 || limit <= 0 {
		return int64(n) * int64(pageSize)
	}
	out := make([]byte, limit)
	return int64(C.gz_oracle_compress_pages((*C.char)(unsafe.Pointer(&pages[0])), C.int(n), C.int(pageSize), C.int(limit),
		(*C.char)(unsafe.Pointer(&out[0]))))
}

// DecompressPages decodes the blocks of packed (block i is lens[i] bytes
// at offs[i]), each to one page of pageSize bytes, with
// LZ4_decompress_safe in one C loop: the baseline of the decompression
// benchmark.
func DecompressPages(packed []byte, offs, lens []int32, pageSize int) error {
	if len(offs) == 0 {
		return nil
	}
	out := make([]byte, pageSize)
	if C.gz_oracle_decode_pages((*C.char)(unsafe.Pointer(&packed[0])), (*C.int)(unsafe.Pointer(&offs[0])),
		(*C.int)(unsafe.Pointer(&lens[0])), C.int(len(offs)), (*C.char)(unsafe.Pointer(&out[0])), C.int(pageSize)) != 0 {
		return ErrDecode
	}
	return nil
}
