package codec

/*
#include <lz4.h>

// gz_lz4_reference compresses n pages the way `lz4 -b1 -B4096` does, with
// the library's one-shot call in a C loop: the baseline our path is
// measured against.
static long gz_lz4_reference(const char *in, int n, int page, char *out, int cap) {
	long total = 0;
	for (int i = 0; i < n; i++) {
		int r = LZ4_compress_default(in + (size_t)i * page, out, page, cap);
		total += r > 0 ? r : page;
	}
	return total;
}
*/
import "C"

import "unsafe"

// referenceLZ4 compresses the pages in pages with liblz4's plain one-shot
// API in one C loop and returns the total compressed size (incompressible
// pages count as PageSize). Benchmarks use it as the baseline.
func referenceLZ4(pages []byte) int64 {
	n := len(pages) / PageSize
	if n == 0 {
		return 0
	}
	out := make([]byte, C.LZ4_compressBound(PageSize))
	return int64(C.gz_lz4_reference((*C.char)(unsafe.Pointer(&pages[0])), C.int(n), PageSize,
		(*C.char)(unsafe.Pointer(&out[0])), C.int(len(out))))
}
