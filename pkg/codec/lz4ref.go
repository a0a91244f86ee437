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
*/
import "C"

import "unsafe"

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
