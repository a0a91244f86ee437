// The fast tier's zstd pages decoded on the GPU, so that the dense tier
// recompresses them without the CPU decoding them first: the host's own
// decoder (pkg/codec/zstddec_core.h), a warp a page, lane 0 decoding into
// the block's shared memory and the warp copying the page out.
//
// gz_zstd_decompress takes gz_lz4_decompress's arguments: page i's frame
// is in[offsets[i] : offsets[i]+lens[i]], its page out + i*4096. Pages with
// lens[i] == 0 are skipped. status[i] is 0 for a frame decoded to exactly
// 4096 bytes, 1 for one that was not (malformed, larger, or outside what
// the decoder takes: a dictionary, more literals than a page; the caller
// then leaves its group to the CPU, and the output page is undefined), 2
// for a skipped page.
//
// Built to PTX for compute_75 by kernels/build-ptx.sh, like zstd.cu.

#include <stdint.h>
#include <stddef.h>

#define ZD_PAGE 4096
// A page's frame has no more literals than the page.
#define ZD_LIT_MAX ZD_PAGE

#include "../pkg/codec/zstddec.h"
#include "../pkg/codec/zstddec_core.h"

extern "C" __global__ void __launch_bounds__(32)
gz_zstd_decompress(const uint8_t *__restrict__ in, const unsigned int *__restrict__ offsets,
		const unsigned int *__restrict__ lens, int n, uint8_t *__restrict__ out,
		unsigned int *__restrict__ status) {
	__shared__ gz_zdec z;
	__shared__ __align__(16) uint8_t page[ZD_PAGE + ZD_WILD];
	const int i = blockIdx.x;
	const int lane = threadIdx.x;
	if (i >= n) return;
	const unsigned int len = lens[i];
	if (len == 0) {
		if (lane == 0) status[i] = 2;
		return;
	}
	int ok = 0;
	if (lane == 0) {
		const ptrdiff_t r = zd_decode(&z, in + offsets[i], len, page, ZD_PAGE, ZD_PAGE);
		ok = r == ZD_PAGE;
		status[i] = ok ? 0 : 1;
	}
	ok = __shfl_sync(0xFFFFFFFFu, ok, 0);
	if (!ok) return;
	__syncwarp(); // lane 0's page is written before the lanes copy it
	uint4 *const dst = (uint4 *)(out + (size_t)i * ZD_PAGE);
	const uint4 *const src = (const uint4 *)page;
	for (int k = lane; k < ZD_PAGE / 16; k += 32) dst[k] = src[k];
}
