package codec

/*
#include <lz4.h>

// gz_lz4_reference compresses n pages the way `lz4 -b1 -B4096` does, with
// the library's one-shot call in a C loop into one hot buffer: the baseline
// our path is measured against. It compresses every page fully, as kernel
// zram does before it compares the length with its huge-page threshold, and
// counts a page longer than limit as stored raw.
static long gz_lz4_reference(const char *in, int n, int page, int limit, char *out, int cap) {
	long total = 0;
	for (int i = 0; i < n; i++) {
		int r = LZ4_compress_default(in + (size_t)i * page, out, page, cap);
		total += r > 0 && r <= limit ? r : page;
	}
	return total;
}

// gz_lz4_reference_page compresses one page with liblz4 into out, which has
// room for the worst case.
static int gz_lz4_reference_page(const char *in, int page, char *out, int cap) {
	return LZ4_compress_default(in, out, page, cap);
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
	if n == 0 {
		return 0
	}
	out := make([]byte, C.LZ4_compressBound(PageSize))
	return int64(C.gz_lz4_reference((*C.char)(unsafe.Pointer(&pages[0])), C.int(n), PageSize, C.int(limit),
		(*C.char)(unsafe.Pointer(&out[0])), C.int(len(out))))
}

// referenceLZ4Page returns liblz4's compressed length of one page, not
// bounded by any limit.
func referenceLZ4Page(page []byte) int {
	out := make([]byte, C.LZ4_compressBound(PageSize))
	return int(C.gz_lz4_reference_page((*C.char)(unsafe.Pointer(&page[0])), C.int(len(page)),
		(*C.char)(unsafe.Pointer(&out[0])), C.int(len(out))))
}
