// Frames of several pages compressed hard, for the dense tier: zstd_deep.h's
// optimal parse and zstd_page.h's entropy stages, a warp a frame.
//
// gz_zstd_deep takes the kernels' usual arguments with n counting frames:
// offsets[f] on entry is frame f's first page in the batch (in) shifted
// left by 8, or'ed with its pages (1 to ZD_FRAME_PAGES); on return,
// offsets[f] and lens[f] locate its frame in packed (16-byte aligned, one
// atomicAdd on packed_size a frame), length 0 with offset ~0 for a frame
// that would not be smaller than its pages, and length 0 with offset 0 for
// an entry that names no frame of the batch. scratch holds ZD_SCRATCH
// bytes a frame: the parse's tables, the entropy stages' workspace and the
// frame as it is written.
//
// A warp a frame: its lanes find the match candidates of 32 positions at
// once, a lane a position (the hash-chain walks); lane 0 walks the parse,
// the lanes offering each match's lengths a lane a length; lane 0 codes
// the frame. The parse's ring, prices and offers are in the block's shared
// memory (12.2 KiB). The GPU is used for what
// the CPU cannot afford, level-19-class effort on pages that have gone
// idle, while it is otherwise idle. What the kernel costs is measured in
// pkg/gpu's deep_device_test.go.
//
// Built to PTX for compute_75 by kernels/build-ptx.sh, like zstd.cu.

#include <stdint.h>

#define ZD_FRAME_PAGES 4
#define ZP_PAGE (ZD_FRAME_PAGES * 4096)
#define ZP_MAX_SEQ 4096
#define ZP_NO_CHAIN_MF
#define ZP_WORKSPACE_LIMIT 65536

#include "zstd_page.h"
#include "zstd_deep.h"

#define ZD_ALIGN(x) (((x) + 255) & ~(size_t)255)
// A frame's scratch, fixed so that the host can size it (pkg/gpu's
// deepScratchBytes).
#define ZD_SCRATCH (320 << 10)
static_assert(ZD_ALIGN(sizeof(zp_workspace)) + ZD_ALIGN(sizeof(zd_scratch)) + ZP_PAGE <= ZD_SCRATCH,
	"a frame's scratch must hold its workspace, its parse and its frame");

extern "C" __global__ void __launch_bounds__(32)
gz_zstd_deep(const uint8_t *__restrict__ in, int n, uint8_t *__restrict__ scratch,
		uint8_t *__restrict__ packed, unsigned int *__restrict__ packed_size,
		unsigned int *__restrict__ offsets, unsigned int *__restrict__ lens) {
	const int f = blockIdx.x;
	const int lane = threadIdx.x;
	if (f >= n) return;
	const unsigned int entry = offsets[f];
	const int first = (int)(entry >> 8), pages = (int)(entry & 0xFF);
	__syncwarp(); // every lane has read the entry before lane 0 writes the result
	if (pages < 1 || pages > ZD_FRAME_PAGES) {
		if (lane == 0) offsets[f] = 0, lens[f] = 0;
		return;
	}
	uint8_t *const mine = scratch + (size_t)f * ZD_SCRATCH;
	zp_workspace *const ws = (zp_workspace *)mine;
	zd_scratch *const sc = (zd_scratch *)(mine + ZD_ALIGN(sizeof(zp_workspace)));
	uint8_t *const frame = mine + ZD_ALIGN(sizeof(zp_workspace)) + ZD_ALIGN(sizeof(zd_scratch));
	const int bytes = pages * 4096;
	const int len = zd_compress_frame(in + (size_t)first * 4096, bytes, frame, bytes - 1, ws, sc);
	if (len <= 0) {
		if (lane == 0) offsets[f] = 0xFFFFFFFFu, lens[f] = 0;
		return;
	}
	unsigned int at = 0;
	if (lane == 0) at = atomicAdd(packed_size, (unsigned int)(len + 15) & ~15u);
	at = __shfl_sync(0xFFFFFFFFu, at, 0);
	__syncwarp(); // lane 0's frame is written before the lanes copy it
	for (int i = lane; i < len; i += 32) packed[at + i] = frame[i];
	if (lane == 0) offsets[f] = at, lens[f] = (unsigned int)len;
}
