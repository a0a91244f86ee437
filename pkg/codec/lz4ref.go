package codec

/*
#include <lz4.h>

// gz_lz4_reference compresses n pages the way `lz4 -b1 -B4096` does, with
// the library's one-shot call in a C loop into one hot buffer: the baseline
// gzramd's compressor is measured against. Its output is bounded by limit,
// as gzramd's is, and a page that does not fit counts as stored raw.
static long gz_lz4_reference(const char *in, int n, int page, int limit, char *out) {
	long total = 0;
	for (int i = 0; i < n; i++) {
		int r = LZ4_compress_default(in + (size_t)i * page, out, page, limit);
		total += r > 0 ? r : page;
	}
	return total;
}

// gz_lz4_reference_decode decodes n blocks, block i lens[i] bytes at
// in+offs[i], each into the same page of out, with liblz4 in a C loop;
// -1 means one did not decode to a page.
static int gz_lz4_reference_decode(const char *in, const int *offs, const int *lens, int n, char *out, int page) {
	for (int i = 0; i < n; i++) {
		if (LZ4_decompress_safe(in + offs[i], out, lens[i], page) != page) return -1;
	}
	return 0;
}
*/
import "C"

import (
	"errors"
	"unsafe"
)

// referenceLZ4 compresses the pages in pages with liblz4's plain one-shot
// API in one C loop and returns the total stored size, counting pages that
// do not compress to limit bytes or fewer as PageSize. Benchmarks use it as
// the baseline.
func referenceLZ4(pages []byte, limit int) int64 {
	n := len(pages) / PageSize
	if n == 0 || limit <= 0 {
		return int64(n) * PageSize
	}
	out := make([]byte, limit)
	return int64(C.gz_lz4_reference((*C.char)(unsafe.Pointer(&pages[0])), C.int(n), PageSize, C.int(limit),
		(*C.char)(unsafe.Pointer(&out[0]))))
}

// referenceLZ4Page returns liblz4's compressed length of one page, not
// bounded by any limit.
func referenceLZ4Page(page []byte) int {
	out := make([]byte, C.LZ4_compressBound(C.int(len(page))))
	return int(C.LZ4_compress_default((*C.char)(unsafe.Pointer(&page[0])), (*C.char)(unsafe.Pointer(&out[0])),
		C.int(len(page)), C.int(len(out))))
}

// referenceLZ4Decode decodes the blocks of packed (block i is lens[i]
// bytes at offs[i]) with liblz4 in one C loop, the baseline of the
// decompression benchmark.
func referenceLZ4Decode(packed []byte, offs, lens []int32) error {
	if len(offs) == 0 {
		return nil
	}
	out := make([]byte, PageSize)
	if C.gz_lz4_reference_decode((*C.char)(unsafe.Pointer(&packed[0])), (*C.int)(unsafe.Pointer(&offs[0])),
		(*C.int)(unsafe.Pointer(&lens[0])), C.int(len(offs)), (*C.char)(unsafe.Pointer(&out[0])), PageSize) != 0 {
		return errors.New("codec: reference decode failed")
	}
	return nil
}
