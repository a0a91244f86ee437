// Batched zstd compression of 4 KiB pages: each page becomes a standard
// zstd frame (RFC 8878) that libzstd decodes. And of groups of 16 pages,
// each group one frame, for the dense tier (at the end of this file).
//
// A batch is two kernels, a warp a page in each, so that an SM runs one
// kind of code at a time: with both in one kernel, a page's warp went from
// the match finder to the entropy coders while its neighbours went the
// other way, and half of every warp's stalls were instruction-cache misses
// (Nsight Compute); and the match finder, which needs only its table in
// shared memory, ran at the occupancy the entropy coders' workspace left.
//
// gz_zstd_parse finds a page's sequences, as lz4.cu does: the page is
// walked in windows of 32 positions, one a lane; each lane takes the best
// of the nearest earlier lane with the same four bytes, the two positions
// its hash bucket holds (the last two of earlier windows with that hash)
// and the three repeat offsets; the window's matches are then chosen in
// order, with a lazy look-ahead of up to two positions (every lane
// computes the same choice from shuffles, so the warp never diverges), the
// chosen match extended back over equal literals, its literals copied out
// by the warp, and its offset coded as a repeat offset where it is one.
// The next window starts where the last match ends. The literals and the
// sequences go to the page's part of scratch (zw_parsed).
//
// gz_zstd_encode codes them with zstd_page.h's stages 2 and 3 (Huffman
// literals, FSE sequence tables, whichever of raw, RLE, predefined or
// compressed is smallest), spread over the warp where the work allows,
// with the same C the host tests check against libzstd for the rest. The
// frame is written to the page's part of scratch and packed as the LZ4
// kernel packs its blocks (one atomicAdd reserves a 16-byte aligned
// place). A page whose frame would not be smaller than a page gets length
// 0: the caller stores it raw. Both kernels take the LZ4 kernel's
// arguments; scratch holds ZW_SCRATCH_PAGE bytes a page.
//
// Built to PTX for compute_75 by kernels/build-ptx.sh, like lz4.cu.

#include <stdint.h>

// Fewer tries of the entropy stages' choices than the host encoder makes:
// they run on one lane, and on the corpus these cost 0.13 % of ratio for
// 20 % of the kernel's speed (bench/results/zstd-gpu-h100-2026-11-23.md).
#define ZP_FSE_TRIES 2
#define ZP_HUF_TRIES 1
#define ZP_HUF_WEIGHT_LOG5 0
// The entropy stages' larger functions stay calls (the lane running them
// stalled on instruction fetch more than half the time, Nsight Compute),
// and at most 512 sequences a page (the rest of a page with more stays
// literals: 0.1 % of ratio) leave a smaller workspace, 16 warps an SM
// rather than 13. Together 3.54 GB/s from 3.17.
#define ZP_NOINLINE_BIG
#define ZP_MAX_SEQ 512
#define ZP_NO_CHAIN_MF // the kernel finds its own sequences

#ifdef ZW_PROFILE // zstdbench: lane 0's cycles between checkpoints, summed over pages
__device__ unsigned long long zw_prof[32];
static __shared__ long long zw_t[32]; // a warp's last checkpoint
#define ZP_PROF(k)                                                                               \
	do {                                                                                         \
		if ((threadIdx.x & 31) == 0) {                                                           \
			long long t_ = clock64();                                                            \
			atomicAdd(&zw_prof[k], (unsigned long long)(t_ - zw_t[threadIdx.x >> 5]));          \
			zw_t[threadIdx.x >> 5] = t_;                                                         \
		}                                                                                        \
	} while (0)
#endif

#include "zstd_page.h"

#ifndef ZW_HASH_BITS
#define ZW_HASH_BITS 9
#endif
#define ZW_MIN_MATCH 4 // a new offset's shortest match (the hashed length)
#ifndef ZW_REPS
#define ZW_REPS 3 // repeat offsets tried at every position
#endif
#define ZW_REP_MIN 3   // a repeat offset's (at most 3: checked in one word)

// A page's part of scratch: its literals in the first ZP_PAGE bytes (then
// its frame, once gz_zstd_encode has read them), then what the parse
// found.
#define ZW_SCRATCH_PAGE (2 * ZP_PAGE)
typedef struct zw_parsed {
	int32_t nlit; // literals; -1: a page of one byte, rle
	int32_t nseq;
	uint32_t rle, pad;
	uint16_t ll[ZP_MAX_SEQ], ml[ZP_MAX_SEQ], of[ZP_MAX_SEQ]; // as zp_workspace's seq_*
} zw_parsed;
static_assert(sizeof(zw_parsed) <= ZW_SCRATCH_PAGE - ZP_PAGE, "the parse must fit its part of scratch");

// Pages (warps) a block of gz_zstd_parse; pkg/gpu launches it so.
#ifndef ZW_PARSE_WARPS
#define ZW_PARSE_WARPS 4
#endif
// Blocks of gz_zstd_parse an SM holds at least: its registers are what
// limits them (10 blocks of 4 warps: 48 registers a thread, none
// spilled; at 12 blocks some spill, and the parse is no faster).
#ifndef ZW_PARSE_BLOCKS
#define ZW_PARSE_BLOCKS 10
#endif

static __device__ __forceinline__ uint32_t zw_hash(uint32_t v, int bits) { return (v * 2654435761u) >> (32 - bits); }

static __device__ __forceinline__ int zw_gain(int ml, uint32_t ov) { return ml * ZP_GAIN_BYTE - zp_highbit(ov); }

// Each lane compares a candidate up to ZW_CAP bytes; the warp extends the
// match it chooses (zw_extend). Without the cap, lanes in a long run of
// equal bytes each walk the whole run.
#ifndef ZW_CAP
#define ZW_CAP 64
#endif

// The page is read as aligned 32-bit words: a byte-wise load of four
// bytes (zp_rd32 on the device) costs four loads and the shifts that join
// them, and the parse is bound by the instructions it issues.

// zw_word returns word i of the words w, 0 past the nw of them: a page's,
// or a group's.
static __device__ __forceinline__ uint32_t zw_word(const uint32_t *w, int i, int nw) { return i < nw ? w[i] : 0u; }

// zw_rd32 is zp_rd32 (bytes p..p+3, 0 past the words) from the words.
static __device__ __forceinline__ uint32_t zw_rd32(const uint32_t *w, int p, int nw) {
	return __funnelshift_r(zw_word(w, p >> 2, nw), zw_word(w, (p >> 2) + 1, nw), (p & 3) * 8);
}

// zw_match_len is zp_match_len stopped at ZW_CAP bytes and at end (the
// end of b's block), from the n bytes (0 or 4) already known equal: four
// bytes at a time, each side's words loaded once.
static __device__ __forceinline__ int zw_match_len(const uint32_t *w, int nw, int a, int b, int n, int end) {
	const int sa = (a & 3) * 8, sb = (b & 3) * 8;
	int ia = (a + n) >> 2, ib = (b + n) >> 2;
	uint32_t a0 = zw_word(w, ia, nw), b0 = zw_word(w, ib, nw);
	while (n < ZW_CAP) {
		const uint32_t a1 = zw_word(w, ++ia, nw), b1 = zw_word(w, ++ib, nw);
		const uint32_t x = __funnelshift_r(a0, a1, sa) ^ __funnelshift_r(b0, b1, sb);
		if (x) {
			n += (__ffs(x) - 1) >> 3;
			break;
		}
		n += 4;
		a0 = a1;
		b0 = b1;
	}
	// A match ends with its block: a block's sequences make its bytes.
	return min(n, end - b);
}

// zw_extend returns the length of the match of b against a, known to be at
// least n, compared by the whole warp 128 bytes at a time, up to end.
static __device__ __forceinline__ int zw_extend(const uint32_t *w, int nw, int a, int b, int n, int end, int lane) {
	const uint8_t *s = (const uint8_t *)w;
	for (;;) {
		const int i = n + 4 * lane;
		bool eq = b + i + 4 <= end && zw_rd32(w, a + i, nw) == zw_rd32(w, b + i, nw);
		const unsigned ne = __ballot_sync(0xFFFFFFFFu, !eq);
		if (ne == 0) {
			n += 128;
			continue;
		}
		n += 4 * (__ffs(ne) - 1);
		while (b + n < end && s[a + n] == s[b + n]) n++;
		return n;
	}
}

// zw_scan returns the sum of v over the lanes up to and including this one.
static __device__ __forceinline__ uint32_t zw_scan(uint32_t v, int lane) {
	for (int d = 1; d < 32; d <<= 1) {
		const uint32_t y = __shfl_up_sync(0xFFFFFFFFu, v, d);
		if (lane >= d) v += y;
	}
	return v;
}

static __device__ __forceinline__ uint32_t zw_sum(uint32_t v) {
	for (int d = 16; d > 0; d >>= 1) v += __shfl_xor_sync(0xFFFFFFFFu, v, d);
	return v;
}

static_assert(offsetof(zp_workspace, u.lit.wcount) % 4 == 0 && offsetof(zp_workspace, u.lit.hist) % 4 == 0 &&
		offsetof(zp_workspace, u.lit.hcode) % 4 == 0 && offsetof(zp_workspace, u.lit.hlen) % 4 == 0,
	"the warp adds to and clears these in 32-bit words");

// zw_huf_sort sets ws->u.lit.sym as zp_huf_sort does (the present symbols
// by ascending count, ties by symbol) with the warp: two stable counting
// passes, on the count's low 6 and high 7 bits, placing 32 symbols at a
// time in order. It returns their number.
static __device__ int zw_huf_sort(zp_workspace *ws, int lane) {
	const unsigned full = 0xFFFFFFFFu, lt = (1u << lane) - 1;
	const uint16_t *hist = ws->u.lit.hist;
	uint16_t *sym = ws->u.lit.sym, *tmp = ws->u.lit.depth;
	uint32_t *bucket = (uint32_t *)ws->u.lit.hcode; // 128 buckets
	int n = 0;
	for (int pass = 0; pass < 2; pass++) {
		const int items = pass == 0 ? 256 : n;
		uint16_t *to = pass == 0 ? tmp : sym;
		for (int i = lane; i < 128; i += 32) bucket[i] = 0;
		__syncwarp();
		for (int i = lane; i < items; i += 32) {
			const uint32_t c = hist[pass == 0 ? i : tmp[i]];
			if (c) atomicAdd(&bucket[pass == 0 ? c & 63 : c >> 6], 1u);
		}
		__syncwarp();
		const uint32_t b0 = bucket[4 * lane], b1 = bucket[4 * lane + 1], b2 = bucket[4 * lane + 2], b3 = bucket[4 * lane + 3];
		const uint32_t own = b0 + b1 + b2 + b3;
		const uint32_t incl = zw_scan(own, lane);
		const uint32_t ex = incl - own;
		__syncwarp();
		bucket[4 * lane] = ex;
		bucket[4 * lane + 1] = ex + b0;
		bucket[4 * lane + 2] = ex + b0 + b1;
		bucket[4 * lane + 3] = ex + b0 + b1 + b2;
		if (pass == 0) n = (int)__shfl_sync(full, incl, 31);
		__syncwarp();
		for (int i0 = 0; i0 < items; i0 += 32) {
			const int i = i0 + lane;
			int s = -1;
			uint32_t key = 1024 + lane; // matches no other lane
			if (i < items) {
				s = pass == 0 ? i : tmp[i];
				const uint32_t c = hist[s];
				if (c) key = pass == 0 ? c & 63 : c >> 6;
				else s = -1;
			}
			const unsigned peers = __match_any_sync(full, key);
			uint32_t at = 0;
			if (s >= 0) at = bucket[key] + __popc(peers & lt);
			__syncwarp();
			if (s >= 0) {
				to[at] = (uint16_t)s;
				if (lane == 31 - __clz(peers)) bucket[key] += __popc(peers);
			}
			__syncwarp();
		}
	}
	return n;
}

// zw_huf_depths is zp_huf_depths with the warp around lane 0's
// Moffat-Katajainen passes (zp_huf_mk): the counts loaded and the depths
// counted across lanes, into dc (shared).
static __device__ void zw_huf_depths(zp_workspace *ws, int n, int *dc, int lane) {
	const unsigned full = 0xFFFFFFFFu, lt = (1u << lane) - 1;
	const uint16_t *hist = ws->u.lit.hist, *sym = ws->u.lit.sym;
	uint16_t *A = ws->u.lit.depth;
	for (int i = lane; i < n; i += 32) A[i] = hist[sym[i]];
	for (int i = lane; i <= 32; i += 32) dc[i] = 0;
	__syncwarp();
	if (lane == 0) zp_huf_mk(A, n);
	__syncwarp();
	for (int i0 = 0; i0 < n; i0 += 32) {
		const int i = i0 + lane;
		const int d = i < n ? min((int)A[i], 32) : -1 - lane;
		const unsigned peers = __match_any_sync(full, d);
		if (i < n && (peers & lt) == 0) dc[d] += __popc(peers);
		__syncwarp();
	}
}

// The code-length counts of the last zw_huf_lengths (a warp a block), and
// the longest length at ZP_HUF_MAX_BITS + 1.
static __shared__ int zw_blc[ZP_HUF_MAX_BITS + 2];

// zw_huf_lengths is zp_huf_lengths with the warp, from the unlimited
// lengths' counts dc that zp_huf_depths gave lane 0.
static __device__ int zw_huf_lengths(zp_workspace *ws, int n, const int *dc, int limit, int lane) {
	const uint16_t *sym = ws->u.lit.sym;
	uint8_t *hlen = ws->u.lit.hlen;
	if (lane == 0) {
		int blc[33];
		zw_blc[ZP_HUF_MAX_BITS + 1] = zp_huf_limit(dc, limit, blc);
		for (int i = 0; i <= ZP_HUF_MAX_BITS; i++) zw_blc[i] = i <= limit ? blc[i] : 0;
	}
	for (int i = lane; i < 64; i += 32) ((uint32_t *)hlen)[i] = 0;
	__syncwarp();
	for (int k = lane; k < n; k += 32) {
		int len = limit, cum = 0;
		for (; len > 1; len--) {
			cum += zw_blc[len];
			if (k < cum) break;
		}
		hlen[sym[k]] = (uint8_t)len;
	}
	__syncwarp();
	return zw_blc[ZP_HUF_MAX_BITS + 1];
}

// zw_put ORs the low nb bits of v into the bit stream out at bit pos.
static __device__ __forceinline__ void zw_put(uint32_t *out, uint32_t pos, uint32_t v, int nb) {
	if (nb == 0) return;
	v &= (1u << nb) - 1;
	const uint32_t w = pos >> 5, sh = pos & 31;
	atomicOr(&out[w], v << sh);
	if (sh + nb > 32) atomicOr(&out[w + 1], v >> (32 - sh));
}

// zw_put64 ORs v, nb < 64 bits, into the bit stream out at bit pos.
static __device__ __forceinline__ void zw_put64(uint32_t *out, uint32_t pos, uint64_t v, int nb) {
	if (nb == 0) return;
	const uint32_t w = pos >> 5, sh = pos & 31;
	const uint64_t lo = v << sh;
	atomicOr(&out[w], (uint32_t)lo);
	if (sh + nb > 32) atomicOr(&out[w + 1], (uint32_t)(lo >> 32));
	if (sh + nb > 64) atomicOr(&out[w + 2], (uint32_t)(v >> (64 - sh)));
}

// zw_scan64 gives a lane the exclusive prefix sums of two per-symbol
// values, a for symbol lane and b for lane + 32, and their total.
static __device__ __forceinline__ void zw_scan64(int a, int b, int lane, int *exA, int *exB, int *total) {
	const unsigned full = 0xFFFFFFFFu;
	const int ia = (int)zw_scan((uint32_t)a, lane), ib = (int)zw_scan((uint32_t)b, lane);
	const int ta = __shfl_sync(full, ia, 31), tb = __shfl_sync(full, ib, 31);
	*exA = ia - a;
	*exB = ta + ib - b;
	*total = ta + tb;
}

// zw_fse_build is zp_fse_build (maxSym < 64) with the warp, the same
// table: each cell of the spread is where the k-th step of the walk lands
// (k times step, the cells above high skipped), holding the symbol whose
// share of the walk's valid cells the cell's rank falls in; each state is
// the next of its symbol's, in cell order.
static __device__ void zw_fse_build(uint16_t *state, int16_t *dfs, uint32_t *dnb, const int16_t *norm, int maxSym, int tableLog,
	uint8_t *tsym, int lane) {
	const unsigned full = 0xFFFFFFFFu, lt = (1u << lane) - 1;
	__shared__ uint16_t start[64], cell[64], seen[64];
	const int T = 1 << tableLog, mask = T - 1, step = (T >> 1) + (T >> 3) + 3;
	const int n0 = lane <= maxSym ? norm[lane] : 0, n1 = lane + 32 <= maxSym ? norm[lane + 32] : 0;
	// Low-probability symbols (-1) take the top cells, in symbol order.
	const unsigned low0 = __ballot_sync(full, n0 == -1), low1 = __ballot_sync(full, n1 == -1);
	const int high = T - 1 - __popc(low0) - __popc(low1);
	if (n0 == -1) tsym[T - 1 - __popc(low0 & lt)] = (uint8_t)lane;
	if (n1 == -1) tsym[T - 1 - __popc(low0) - __popc(low1 & lt)] = (uint8_t)(lane + 32);
	int c0, c1, r0, r1, total;
	zw_scan64(n0 == -1 ? 1 : n0, n1 == -1 ? 1 : n1, lane, &c0, &c1, &total); // each symbol's first state
	zw_scan64(n0 > 0 ? n0 : 0, n1 > 0 ? n1 : 0, lane, &r0, &r1, &total);     // its first rank in the walk
	cell[lane] = (uint16_t)c0;
	cell[lane + 32] = (uint16_t)c1;
	start[lane] = (uint16_t)r0;
	start[lane + 32] = (uint16_t)r1;
	seen[lane] = seen[lane + 32] = 0;
	__syncwarp();
	int rank = 0;
	for (int k0 = 0; k0 < T; k0 += 32) {
		const int pos = ((k0 + lane) * step) & mask;
		const bool valid = k0 + lane < T && pos <= high;
		const unsigned vb = __ballot_sync(full, valid);
		if (valid) {
			const int r = rank + __popc(vb & lt);
			int lo = 0, hi = maxSym; // the last symbol whose first rank is r or less
			while (lo < hi) {
				const int mid = (lo + hi + 1) >> 1;
				if (start[mid] <= r) lo = mid;
				else hi = mid - 1;
			}
			tsym[pos] = (uint8_t)lo;
		}
		rank += __popc(vb);
	}
	__syncwarp();
	for (int u0 = 0; u0 < T; u0 += 32) {
		const int u = u0 + lane;
		const int s = u < T ? tsym[u] : 64 + lane;
		const unsigned peers = __match_any_sync(full, s);
		if (u < T) {
			state[cell[s] + seen[s] + __popc(peers & lt)] = (uint16_t)(T + u);
		}
		__syncwarp();
		if (u < T && (peers & lt) == 0) seen[s] += (uint16_t)__popc(peers);
		__syncwarp();
	}
	for (int k = 0; k < 2; k++) {
		const int s = lane + 32 * k, n = k ? n1 : n0, before = k ? c1 : c0;
		if (s <= maxSym) zp_fse_symbol(n, tableLog, before, &dnb[s], &dfs[s]);
	}
	__syncwarp();
}

// zw_huf_weights_fse is zp_huf_weights_fse (exact, the weights counted)
// with the warp: the table on lane 0, the two interleaved states' chains
// on lanes 0 and 1 (each weight's bits kept in ws->u.lit.depth, free once
// the code lengths are known), and the bitstream laid out by a prefix sum
// in ws->u.lit.hcode (free until the codes are assigned). The same bytes;
// the same result on every lane.
static __device__ int zw_huf_weights_fse(zp_workspace *ws, const uint8_t *w, int n, int tl, uint8_t *out, int cap, int lane) {
	const unsigned full = 0xFFFFFFFFu;
	const zp_fse_ct_small *ct = &ws->u.lit.wct;
	__shared__ int head, maxW;
	__shared__ uint32_t fin[2];
	if (lane == 0) {
		const uint16_t *cnt = ws->u.lit.wcount;
		int top = 0, distinct = 0;
		for (int i = 0; i < 16; i++) {
			if (cnt[i]) {
				top = i;
				distinct++;
			}
		}
		int h = -1;
		if (n >= 2 && distinct >= 2) {
			int16_t *norm = ws->u.lit.wnorm;
			zp_fse_normalize(cnt, top, (uint32_t)n, tl, norm);
			h = zp_fse_write_ncount(out, cap, norm, top, tl);
		}
		head = h;
		maxW = top;
	}
	__syncwarp();
	const int h = head;
	if (h < 0) return -1;
	zw_fse_build(ws->u.lit.wct.state, ws->u.lit.wct.dfs, ws->u.lit.wct.dnb, ws->u.lit.wnorm, maxW, tl, ws->u.lit.tsym, lane);
	uint16_t *fb = ws->u.lit.depth;
	if (lane < 2) {
		const int i0 = ((n - 1) & 1) == lane ? n - 1 : n - 2;
		uint32_t st = zp_fse_init(ct->state, ct->dfs, ct->dnb, w[i0]);
		for (int i = i0 - 2; i >= 0; i -= 2) {
			const int c = w[i];
			const uint32_t nb = (st + ct->dnb[c]) >> 16;
			fb[i] = (uint16_t)((st & ((1u << nb) - 1)) << 4 | nb);
			st = ct->state[(int)(st >> nb) + ct->dfs[c]];
		}
		fin[lane] = st;
	}
	uint32_t *buf = (uint32_t *)ws->u.lit.hcode;
	const uint32_t capBits = (uint32_t)sizeof(ws->u.lit.hcode) * 8;
	for (int i = lane; i < (int)(sizeof(ws->u.lit.hcode) / 4); i += 32) buf[i] = 0;
	__syncwarp();
	uint32_t base = 0;
	for (int r0 = 0; r0 < n - 2; r0 += 32) {
		const int i = n - 3 - (r0 + lane);
		const uint32_t f = i >= 0 ? fb[i] : 0, nb = f & 15;
		const uint32_t sum = zw_scan(nb, lane);
		const uint32_t pos = base + sum - nb;
		base += __shfl_sync(full, sum, 31);
		if (pos + nb <= capBits) zw_put(buf, pos, f >> 4, (int)nb);
	}
	const uint32_t total = base + 2 * (uint32_t)tl + 1;
	const int bytes = (int)((total + 7) >> 3);
	if (total > capBits || bytes > cap - h) return -1;
	if (lane == 0) {
		zw_put(buf, base, fin[1], tl);
		zw_put(buf, base + tl, fin[0], tl);
		zw_put(buf, base + 2 * tl, 1, 1);
	}
	__syncwarp();
	const uint8_t *b8 = (const uint8_t *)buf;
	for (int j = lane; j < bytes; j += 32) out[h + j] = b8[j];
	__syncwarp();
	return h + bytes;
}

// zw_huf_tree is zp_huf_tree (exact, the weights counted, FSE weights at
// table log 6 only) with the warp; the same on every lane.
static __device__ int zw_huf_tree(zp_workspace *ws, int maxSym, int lane) {
	static_assert(!ZP_HUF_WEIGHT_LOG5, "the GPU tries the weights' FSE table at log 6 only");
	const int direct = maxSym <= 128 ? 1 + (maxSym + 1) / 2 : 0x7FFF;
	const int f6 = zw_huf_weights_fse(ws, ws->u.lit.weight, maxSym, 6, ws->u.lit.tree + 128, 127, lane);
	const int fse = f6 > 0 && f6 < 128 ? f6 : 0x7FFF;
	int treeSize = direct;
	if (lane == 0) ws->u.lit.treeFse = -1;
	if (1 + fse < direct) {
		treeSize = 1 + fse;
		if (lane == 0) {
			ws->u.lit.treeFse = 128;
			ws->u.lit.treeLen = (int16_t)fse;
		}
	}
	return treeSize >= 0x7FFF ? 0x7FFF : treeSize;
}

// zw_huf_plan is zp_huf_plan with the warp (the tree's description on lane
// 0); exact, it also gives each stream's bits in sbits.
static __device__ __noinline__ int zw_huf_plan(zp_workspace *ws, int n, int nsorted, int maxSym, int limit, int exact, const int *dc,
	int *maxBitsOut, uint32_t *sbits, int lane) {
	const unsigned full = 0xFFFFFFFFu;
	const uint8_t *lit = ws->u.lit.lit, *hlen = ws->u.lit.hlen;
	const uint16_t *hist = ws->u.lit.hist;
	uint8_t *w = ws->u.lit.weight;
	uint32_t *wc2 = (uint32_t *)ws->u.lit.wcount;
	const int maxBits = zw_huf_lengths(ws, nsorted, dc, limit, lane);
	*maxBitsOut = maxBits;
	if (lane < 8) wc2[lane] = 0;
	__syncwarp();
	for (int s = lane; s < maxSym; s += 32) {
		const int wt = hlen[s] ? maxBits + 1 - hlen[s] : 0;
		w[s] = (uint8_t)wt;
		atomicAdd(&wc2[wt >> 1], 1u << (16 * (wt & 1)));
	}
	__syncwarp();
	int treeSize = 0;
	if (lane == 0) ws->u.lit.maxBits = (uint8_t)maxBits;
	if (exact) {
		treeSize = zw_huf_tree(ws, maxSym, lane);
	} else {
		if (lane == 0) treeSize = zp_huf_tree(ws, maxSym, 0, 1);
		treeSize = __shfl_sync(full, treeSize, 0);
	}
	__syncwarp();
	if (treeSize >= 0x7FFF) return 0x7FFF;
	const int four = n > 1023, seg = (n + 3) / 4;
	if (!exact) {
		uint32_t bits = 0;
		for (int s = lane; s <= maxSym; s += 32) bits += (uint32_t)hist[s] * hlen[s];
		bits = zw_sum(bits);
		return treeSize + (four ? 6 : 0) + (int)((2 * bits + (four ? 36 : 9)) >> 4);
	}
	int streams = 0;
	for (int k = 0; k < (four ? 4 : 1); k++) {
		const int from = four ? k * seg : 0, to = !four || k == 3 ? n : from + seg;
		uint32_t bits = 0;
		for (int i = from + lane; i < to; i += 32) bits += hlen[lit[i]];
		bits = zw_sum(bits);
		sbits[k] = bits;
		streams += (int)((bits + 8) >> 3);
	}
	return treeSize + (four ? 6 : 0) + streams;
}

// zw_huf_codes is zp_huf_codes with the warp: a symbol's code is the next
// of its length's, 32 symbols at a time in order.
static __device__ void zw_huf_codes(zp_workspace *ws, int maxBits, int lane) {
	const unsigned full = 0xFFFFFFFFu, lt = (1u << lane) - 1;
	__shared__ uint32_t next[ZP_HUF_MAX_BITS + 2];
	const uint8_t *hlen = ws->u.lit.hlen;
	if (lane == 0) {
		uint32_t min = 0;
		for (int l = maxBits; l > 0; l--) {
			next[l] = min;
			min += (uint32_t)zw_blc[l];
			min >>= 1;
		}
	}
	__syncwarp();
	for (int s0 = 0; s0 < 256; s0 += 32) {
		const int s = s0 + lane, l = hlen[s];
		const unsigned peers = __match_any_sync(full, l);
		const uint32_t code = l ? next[l] + __popc(peers & lt) : 0;
		__syncwarp();
		if (l && lane == 31 - __clz(peers)) next[l] += __popc(peers);
		ws->u.lit.hcode[s] = (uint16_t)code;
		__syncwarp();
	}
}

// zw_plan_literals is zp_plan_literals (Huffman allowed, the histogram
// counted) with the warp: the same section, or the same plan of it. It
// returns the same on every lane.
static __device__ int zw_plan_literals(zp_workspace *ws, int n, uint8_t *op, uint8_t *oend, zp_lit_plan *pl, int lane) {
	const unsigned full = 0xFFFFFFFFu;
	const uint16_t *hist = ws->u.lit.hist;
	const uint8_t *lit = ws->u.lit.lit;
	int distinct = 0, maxSym = 0;
	for (int s0 = 0; s0 < 256; s0 += 32) {
		const unsigned b = __ballot_sync(full, hist[s0 + lane] != 0);
		distinct += __popc(b);
		if (b) maxSym = s0 + 31 - __clz(b);
	}
	if (lane == 0) {
		pl->streams = 0;
		pl->n = n;
		pl->op = op;
	}
	const int rawh = zp_lit_header_raw_size(n);
	ZP_PROF(10);
	if (distinct == 1) {
		if (oend - op < rawh + 1) return 0;
		if (lane == 0) {
			zp_lit_header_raw(op, 1, n);
			op[rawh] = lit[0];
			pl->end = op + rawh + 1;
		}
		return 1;
	}
	if (distinct >= 2) {
		const int nsorted = zw_huf_sort(ws, lane);
		ZP_PROF(11);
		__shared__ int dc[33];
		zw_huf_depths(ws, nsorted, dc, lane);
		__syncwarp();
		ZP_PROF(16);
		int bestLimit = 0, lo = zp_highbit((uint32_t)distinct - 1) + 1;
		if (lo < ZP_HUF_MIN_LIMIT) lo = ZP_HUF_MIN_LIMIT;
		int top = ZP_HUF_MAX_BITS, maxBits = 0;
		uint32_t sbits[4];
#if ZP_HUF_SRC_BITS
		if (zp_highbit((uint32_t)n - 1) - 1 < top) top = zp_highbit((uint32_t)n - 1) - 1;
		if (top < lo) top = lo;
#endif
#if ZP_HUF_TRIES > 1
		int bestComp = 0x7FFF, tries = 0;
		for (int limit = top; limit >= lo && tries < ZP_HUF_TRIES; limit--, tries++) {
			const int c = zw_huf_plan(ws, n, nsorted, maxSym, limit, 0, dc, &maxBits, sbits, lane);
			if (c >= bestComp) break;
			bestComp = c;
			bestLimit = limit;
			if (maxBits < limit) limit = maxBits;
		}
#else
		// One limit, the deepest: nothing to estimate before the plan.
		bestLimit = top;
#endif
		ZP_PROF(12);
		const int four = n > 1023, hdr = four ? 4 : 3;
		const int comp = bestLimit ? zw_huf_plan(ws, n, nsorted, maxSym, bestLimit, 1, dc, &maxBits, sbits, lane) : 0x7FFF;
		ZP_PROF(13);
		if (comp < 0x7FFF && (four || comp <= 1023) && hdr + comp < rawh + n) {
			if (oend - op < hdr + comp) return 0;
			zw_huf_codes(ws, maxBits, lane);
			ZP_PROF(14);
			if (lane == 0) {
				uint8_t *p = op + hdr;
				const uint8_t *w = ws->u.lit.weight;
				const int tf = ws->u.lit.treeFse;
				if (tf < 0) {
					*p++ = (uint8_t)(127 + maxSym);
					for (int i = 0; i < maxSym; i += 2) *p++ = (uint8_t)(w[i] << 4 | (i + 1 < maxSym ? w[i + 1] : 0));
				} else {
					const int len = ws->u.lit.treeLen;
					*p++ = (uint8_t)len;
					for (int i = 0; i < len; i++) *p++ = ws->u.lit.tree[tf + i];
				}
				pl->comp = comp;
				pl->end = op + hdr + comp;
				if (!four) {
					pl->streams = 1;
					pl->from[0] = 0;
					pl->to[0] = n;
					pl->at[0] = p;
				} else {
					const int seg = (n + 3) / 4;
					uint8_t *jt = p;
					p += 6;
					for (int k = 0; k < 4; k++) {
						const int size = (int)((sbits[k] + 8) >> 3);
						pl->from[k] = k * seg;
						pl->to[k] = k == 3 ? n : (k + 1) * seg;
						pl->at[k] = p;
						if (k < 3) {
							jt[2 * k] = (uint8_t)size;
							jt[2 * k + 1] = (uint8_t)(size >> 8);
						}
						p += size;
					}
					pl->streams = 4;
				}
			}
			ZP_PROF(15);
			return 1;
		}
	}
	if (oend - op < rawh + n) return 0;
	if (lane == 0) {
		zp_lit_header_raw(op, 0, n);
		pl->end = op + rawh + n;
	}
	for (int i = lane; i < n; i += 32) op[rawh + i] = lit[i];
	return 1;
}

// zw_huf_streams writes the planned Huffman streams as zp_huf_stream does,
// with the warp: a stream's literals 32 at a time from its last, each
// lane's code placed by a prefix sum of the code lengths into a buffer in
// the plan's scratch (free once the tree is written; a stream of at most
// 1024 literals of 11 bits fits), then copied to the frame. It returns
// whether every stream came out the planned size, the same on every lane.
static __device__ bool zw_huf_streams(zp_workspace *ws, const zp_lit_plan *pl, int lane) {
	const unsigned full = 0xFFFFFFFFu;
	const uint8_t *lit = ws->u.lit.lit, *hlen = ws->u.lit.hlen;
	const uint16_t *hcode = ws->u.lit.hcode;
	uint32_t *buf = (uint32_t *)ws->u.lit.weight;
	const int words = (int)(offsetof(zp_workspace, u.lit.tsym) - offsetof(zp_workspace, u.lit.weight)) / 4;
	for (int k = 0; k < pl->streams; k++) {
		const int from = pl->from[k], to = pl->to[k];
		uint8_t *at = pl->at[k], *next = k + 1 < pl->streams ? pl->at[k + 1] : pl->end;
		for (int i = lane; i < words; i += 32) buf[i] = 0;
		__syncwarp();
		uint32_t base = 0;
		for (int r0 = 0; r0 < to - from; r0 += 32) {
			const int i = to - 1 - (r0 + lane);
			int nb = 0;
			uint32_t code = 0;
			if (i >= from) {
				const int c = lit[i];
				nb = hlen[c];
				code = hcode[c];
			}
			const uint32_t sum = zw_scan((uint32_t)nb, lane);
			const uint32_t pos = base + sum - (uint32_t)nb;
			base += __shfl_sync(full, sum, 31);
			if (pos + (uint32_t)nb <= (uint32_t)words * 32) zw_put(buf, pos, code, nb);
		}
		const int bytes = (int)((base + 8) >> 3);
		if (bytes != next - at || base + 1 > (uint32_t)words * 32) return false;
		if (lane == 0) zw_put(buf, base, 1, 1);
		__syncwarp();
		const uint8_t *b8 = (const uint8_t *)buf;
		for (int j = lane; j < bytes; j += 32) at[j] = b8[j];
		__syncwarp();
	}
	return true;
}

// zp_ll_code and zp_ml_code without their branches, which diverge across
// the lanes: the codes of the smaller values from tables.
static __device__ const uint8_t zw_ll_code_tab[64] = {
	0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15,
	16, 16, 17, 17, 18, 18, 19, 19, 20, 20, 20, 20, 21, 21, 21, 21,
	22, 22, 22, 22, 22, 22, 22, 22, 23, 23, 23, 23, 23, 23, 23, 23,
	24, 24, 24, 24, 24, 24, 24, 24, 24, 24, 24, 24, 24, 24, 24, 24,
};
static __device__ const uint8_t zw_ml_code_tab[128] = {
	0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15,
	16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31,
	32, 32, 33, 33, 34, 34, 35, 35, 36, 36, 36, 36, 37, 37, 37, 37,
	38, 38, 38, 38, 38, 38, 38, 38, 39, 39, 39, 39, 39, 39, 39, 39,
	40, 40, 40, 40, 40, 40, 40, 40, 40, 40, 40, 40, 40, 40, 40, 40,
	41, 41, 41, 41, 41, 41, 41, 41, 41, 41, 41, 41, 41, 41, 41, 41,
	42, 42, 42, 42, 42, 42, 42, 42, 42, 42, 42, 42, 42, 42, 42, 42,
	42, 42, 42, 42, 42, 42, 42, 42, 42, 42, 42, 42, 42, 42, 42, 42,
};
static __device__ __forceinline__ int zw_ll_code(uint32_t ll) { return ll < 64 ? zw_ll_code_tab[ll] : zp_highbit(ll) + 19; }
static __device__ __forceinline__ int zw_ml_code(uint32_t mlBase) { return mlBase < 128 ? zw_ml_code_tab[mlBase] : zp_highbit(mlBase) + 36; }

// The GPU keeps a sequence's three codes (by type: 0 LL, 1 OF, 2 ML) where
// the host keeps its values, which stay in scratch (zw_parsed) until the
// bitstream reads their extra bits.
static __device__ __forceinline__ uint8_t *zw_codes(zp_workspace *ws, int t) { return (uint8_t *)ws->seq_ll + t * ZP_MAX_SEQ; }
static_assert(3 * ZP_MAX_SEQ <= sizeof(((zp_workspace *)0)->seq_ll) * 3, "the codes fit the sequences' arrays");

// zw_seq_plan_tables is zp_seq_plan_table (FSE tables allowed) for the
// three types at once, with the same choices: each type's distinct codes
// and predefined table's cost from the warp, its two table logs tried on
// two lanes (the second's distribution and description kept in the
// type's tsym, free until the table is built), and the choice on the
// type's lane. It returns whether every type can be coded, on every lane.
static __device__ bool zw_seq_plan_tables(zp_workspace *ws, int nseq, zp_seq_plan *sp, int lane) {
	static_assert(ZP_FSE_TRIES <= 2, "two table logs a type, on two lanes");
	const unsigned full = 0xFFFFFFFFu;
	__shared__ int distinct[3], maxSym[3];
	__shared__ uint32_t pre[3], tryCost[3][2];
	__shared__ int tryDesc[3][2];
	for (int t = 0; t < 3; t++) {
		const uint16_t *count = ws->u.seq.x.b.count[t];
		const int c0 = count[lane], c1 = count[lane + 32];
		const unsigned b0 = __ballot_sync(full, c0 != 0), b1 = __ballot_sync(full, c1 != 0);
		const int top = b1 ? 32 + zp_highbit(b1) : zp_highbit(b0); // nseq > 0: some code is counted
		const int16_t *def = t == 0 ? zp_ll_def : t == 1 ? zp_of_def : zp_ml_def;
		const int defMax = t == 0 ? 35 : t == 1 ? 28 : 52, defLog = t == 1 ? 5 : 6;
		uint32_t bits = 0;
		bool bad = false;
		for (int k = 0; k < 2; k++) {
			const int s = lane + 32 * k, c = k ? c1 : c0;
			if (c == 0 || s > top) continue;
			int p = s <= defMax ? def[s] : 0;
			if (p == 0) {
				bad = true;
				continue;
			}
			if (p < 0) p = 1;
			bits += (uint32_t)c * (uint32_t)((defLog << 8) - zp_log2q8_tab[p]);
		}
		bad = __any_sync(full, bad);
		bits = zw_sum(bits);
		if (lane == 0) {
			distinct[t] = __popc(b0) + __popc(b1);
			maxSym[t] = top;
			pre[t] = bad ? 0xFFFFFFFFu : bits + ((uint32_t)defLog << 8);
		}
	}
	__syncwarp();
	if (lane < 3 * ZP_FSE_TRIES) {
		const int t = lane % 3, k = lane / 3;
		uint32_t c = 0xFFFFFFFFu;
		int h = -1;
		if (distinct[t] > 1) {
			int minLog = zp_highbit((uint32_t)distinct[t] - 1) + 1;
			if (minLog < 5) minLog = 5;
			const int tl = minLog + k, maxLog = t == 1 ? 8 : 9;
			if (tl <= maxLog && tl <= ZP_FSE_TRY_MAX) {
				const uint16_t *count = ws->u.seq.x.b.count[t];
				int16_t *norm = k == 0 ? ws->u.seq.x.b.norm[t] : (int16_t *)ws->u.seq.x.b.tsym[t];
				uint8_t *ncount = k == 0 ? ws->u.seq.x.b.ncount[t] : ws->u.seq.x.b.tsym[t] + 128;
				zp_fse_normalize(count, maxSym[t], (uint32_t)nseq, tl, norm);
				h = zp_fse_write_ncount(ncount, 96, norm, maxSym[t], tl);
				if (h >= 0) c = zp_fse_cost(count, maxSym[t], norm, maxSym[t], tl) + ((uint32_t)tl << 8) + ((uint32_t)h << 11);
			}
		}
		tryCost[t][k] = c;
		tryDesc[t][k] = h;
	}
	__syncwarp();
	bool ok = true;
	if (lane < 3) {
		const int t = lane, m = maxSym[t];
		sp->maxs[t] = m;
		sp->desc[t] = 0;
		if (distinct[t] == 1) {
			sp->mode[t] = 1;
			sp->log[t] = 0;
			sp->desc[t] = 1;
			ws->u.seq.x.b.ncount[t][0] = (uint8_t)m;
		} else {
			uint32_t best = pre[t];
			int bestK = -1;
			sp->mode[t] = 0;
			sp->log[t] = t == 1 ? 5 : 6;
			for (int k = 0; k < ZP_FSE_TRIES; k++) {
				if (tryCost[t][k] < best) {
					best = tryCost[t][k];
					bestK = k;
				}
			}
			if (bestK >= 0) {
				int minLog = zp_highbit((uint32_t)distinct[t] - 1) + 1;
				if (minLog < 5) minLog = 5;
				sp->mode[t] = 2;
				sp->log[t] = minLog + bestK;
				sp->desc[t] = tryDesc[t][bestK];
				if (bestK == 1) {
					const int16_t *norm = (const int16_t *)ws->u.seq.x.b.tsym[t];
					const uint8_t *ncount = ws->u.seq.x.b.tsym[t] + 128;
					for (int s = 0; s <= m; s++) ws->u.seq.x.b.norm[t][s] = norm[s];
					for (int i = 0; i < sp->desc[t]; i++) ws->u.seq.x.b.ncount[t][i] = ncount[i];
				}
			}
			ok = best != 0xFFFFFFFFu;
		}
	}
	return __all_sync(full, ok);
}

// zw_encode_sequences writes the bytes zp_encode_sequences writes (with FSE
// tables allowed), with the warp: the codes counted by every lane, the
// three types' tables planned and built on three lanes, each type's chain
// of states walked on its lane, and the bitstream laid out by a prefix sum
// of the sequences' bit counts and written by every lane. It returns the
// end, or NULL when over oend; every lane gets the same.
static __device__ uint8_t *zw_encode_sequences(zp_workspace *ws, const zw_parsed *parsed, int nseq, uint8_t *op, uint8_t *oend, int lane) {
	const unsigned full = 0xFFFFFFFFu;
	if (nseq == 0) {
		if (op >= oend) return 0;
		if (lane == 0) *op = 0;
		return op + 1;
	}
	if (oend - op < 3) return 0;
	if (lane == 0) zp_seq_header(op, nseq);
	op += nseq < 128 ? 1 : 2;
	// Counts of 16 bits, added as halves of 32-bit words.
	uint32_t *count2 = (uint32_t *)ws->u.seq.x.b.count;
	for (int i = lane; i < 3 * 64 / 2; i += 32) count2[i] = 0;
	__syncwarp();
	for (int i = lane; i < nseq; i += 32) {
		for (int t = 0; t < 3; t++) {
			const int c = t * 64 + zw_codes(ws, t)[i];
			atomicAdd(&count2[c >> 1], 1u << (16 * (c & 1)));
		}
	}
	__syncwarp();
	ZP_PROF(20);
	zp_seq_plan *sp = &ws->u.seq.plan;
	if (!zw_seq_plan_tables(ws, nseq, sp, lane)) return 0;
	__syncwarp();
	ZP_PROF(21);
	const int d0 = sp->desc[0], d1 = sp->desc[1], d2 = sp->desc[2];
	const int dlen = 1 + d0 + d1 + d2;
	if (oend - op < dlen) return 0;
	for (int i = lane; i < dlen; i += 32) {
		uint8_t c;
		if (i == 0) c = (uint8_t)(sp->mode[0] << 6 | sp->mode[1] << 4 | sp->mode[2] << 2);
		else if (i <= d0) c = ws->u.seq.x.b.ncount[0][i - 1];
		else if (i <= d0 + d1) c = ws->u.seq.x.b.ncount[1][i - 1 - d0];
		else c = ws->u.seq.x.b.ncount[2][i - 1 - d0 - d1];
		op[i] = c;
	}
	op += dlen;
	for (int t = 0; t < 3; t++) {
		if (sp->mode[t] == 1) continue;
		int16_t *norm = ws->u.seq.x.b.norm[t];
		int maxSym = sp->maxs[t];
		if (sp->mode[t] == 0) { // zp_seq_build_table's predefined distribution
			const int16_t *def = t == 0 ? zp_ll_def : t == 1 ? zp_of_def : zp_ml_def;
			maxSym = t == 0 ? 35 : t == 1 ? 28 : 52;
			for (int s = lane; s <= maxSym; s += 32) norm[s] = def[s];
			__syncwarp();
		}
		zp_fse_ct *ct = &ws->u.seq.ct[t];
		zw_fse_build(ct->state, ct->dfs, ct->dnb, norm, maxSym, sp->log[t], ws->u.seq.x.b.tsym[t], lane);
	}
	ZP_PROF(22);
	// Each type's states, last sequence first, on its own lane: the bits
	// that encoding sequence i's code emits (none for the last, whose code
	// sets the first state), and the final state.
	const int m[3] = {sp->mode[0] != 1, sp->mode[1] != 1, sp->mode[2] != 1};
	if (lane < 3 && m[lane]) {
		const int t = lane;
		const zp_fse_ct *ct = &ws->u.seq.ct[t];
		uint16_t *fb = ws->u.seq.x.fbits[t];
		const uint8_t *code = zw_codes(ws, t);
		uint32_t st = zp_fse_init(ct->state, ct->dfs, ct->dnb, code[nseq - 1]);
		for (int i = nseq - 2; i >= 0; i--) {
			const int c = code[i];
			const uint32_t nb = (st + ct->dnb[c]) >> 16;
			fb[i] = (uint16_t)((st & ((1u << nb) - 1)) << 4 | nb);
			st = ct->state[(int)(st >> nb) + ct->dfs[c]];
		}
		sp->fin[t] = st;
	}
	__syncwarp();
	ZP_PROF(24);
	// The bitstream, in the tables' memory (free now): sequence nseq-1's
	// fields first; per sequence the OF, ML and LL state bits, then the LL,
	// ML and OF extra bits, as zp_encode_sequences adds them.
	uint32_t *out = (uint32_t *)ws->u.seq.ct;
	const uint32_t capBits = (uint32_t)sizeof(ws->u.seq.ct) * 8 - 64;
	for (int i = lane; i < (int)(sizeof(ws->u.seq.ct) / 4); i += 32) out[i] = 0;
	__syncwarp();
	uint32_t base = 0;
	for (int r0 = 0; r0 < nseq; r0 += 32) {
		const int i = nseq - 1 - (r0 + lane);
		uint32_t fo = 0, fm = 0, fl = 0, ll = 0, mlb = 0, of = 0, bits = 0;
		int lc = 0, mc = 0, oc = 0;
		if (i >= 0) {
			ll = parsed->ll[i];
			mlb = (uint32_t)parsed->ml[i] - 3;
			of = parsed->of[i];
			lc = zw_codes(ws, 0)[i];
			oc = zw_codes(ws, 1)[i];
			mc = zw_codes(ws, 2)[i];
			if (i < nseq - 1) {
				fo = m[1] ? ws->u.seq.x.fbits[1][i] : 0;
				fm = m[2] ? ws->u.seq.x.fbits[2][i] : 0;
				fl = m[0] ? ws->u.seq.x.fbits[0][i] : 0;
			}
			bits = (fo & 15) + (fm & 15) + (fl & 15) + zp_ll_bits[lc] + zp_ml_bits[mc] + (uint32_t)oc;
		}
		const uint32_t sum = zw_scan(bits, lane);
		uint32_t pos = base + sum - bits;
		base += __shfl_sync(full, sum, 31);
		if (i >= 0 && pos + bits <= capBits) {
			// A sequence's fields in one value: at most 3 * 9 state bits
			// and 12 + 11 + 12 extra bits on a page.
			uint64_t v = fo >> 4;
			int nb = (int)(fo & 15);
			v |= (uint64_t)(fm >> 4) << nb;
			nb += (int)(fm & 15);
			v |= (uint64_t)(fl >> 4) << nb;
			nb += (int)(fl & 15);
			v |= (uint64_t)(ll - zp_ll_base[lc]) << nb;
			nb += zp_ll_bits[lc];
			v |= (uint64_t)(mlb - zp_ml_base[mc]) << nb;
			nb += zp_ml_bits[mc];
			v |= (uint64_t)(of & ((1u << oc) - 1)) << nb;
			zw_put64(out, pos, v, nb + oc);
		}
	}
	const uint32_t total = base + (uint32_t)(sp->log[0] + sp->log[1] + sp->log[2]) + 1;
	const int bytes = (int)((total + 7) >> 3);
	if (total > capBits || oend - op < bytes) return 0;
	if (lane == 0) {
		uint32_t pos = base;
		zw_put(out, pos, sp->fin[2], sp->log[2]);
		pos += sp->log[2];
		zw_put(out, pos, sp->fin[1], sp->log[1]);
		pos += sp->log[1];
		zw_put(out, pos, sp->fin[0], sp->log[0]);
		pos += sp->log[0];
		zw_put(out, pos, 1, 1);
	}
	__syncwarp();
	const uint8_t *ob = (const uint8_t *)out;
	for (int k = lane; k < bytes; k += 32) op[k] = ob[k];
	ZP_PROF(23);
	return op + bytes;
}

#ifdef ZW_PROFILE
#define ZW_PROF_START()                                                    \
	do {                                                                   \
		if ((threadIdx.x & 31) == 0) zw_t[threadIdx.x >> 5] = clock64(); \
	} while (0)
#else
#define ZW_PROF_START()
#endif

// zw_parse_block finds the sequences of the page at byte lo of the nw
// words page (a page's, or a group's: matches reach back to its start)
// and writes them and its literals to lit and out. table (1 << HB
// buckets) and rep hold what the blocks before found, and are carried on.
template <int HB>
static __device__ __forceinline__ void zw_parse_block(const uint32_t *page, int nw, int lo, uint32_t *table, uint32_t *rep,
		uint8_t *lit, zw_parsed *out, int lane) {
	const unsigned full = 0xFFFFFFFFu;
	const uint8_t *src = (const uint8_t *)page;
	// A page of one byte: an RLE block.
	const uint32_t *words = page + lo / 4;
	uint32_t first = words[0] & 0xFFu;
	first |= first << 8;
	first |= first << 16;
	bool same = true;
	for (int i = lane; i < ZP_PAGE / 4; i += 32) same &= words[i] == first;
	ZP_PROF(1);
	if (__all_sync(full, same)) {
		if (lane == 0) out->nlit = -1, out->rle = first & 0xFFu;
		return;
	}
	const int limit = lo + ZP_PAGE - 4; // the last position a match may start at
	int anchor = lo, nseq = 0, nlit = 0, w = max(lo, 1);
	while (w <= limit && nseq < ZP_MAX_SEQ) {
		const int p = w + lane;
		const bool valid = p <= limit;
		const unsigned vmask = __ballot_sync(full, valid);
		int ml = 0, off = 0, gain = ZP_MIN_GAIN;
		uint32_t h = 0, v = 0, bucket = 0;
		if (valid) {
			v = zw_rd32(page, p, nw);
			h = zw_hash(v, HB);
			bucket = table[h];
		}
		// The nearest earlier lane of the window with the same 4 bytes.
		unsigned same4 = valid ? __match_any_sync(vmask, v) & ((1u << lane) - 1) : 0;
		if (valid) {
			int cand[3] = {same4 ? w + 31 - __clz(same4) : -1, (int)(bucket & 0xFFFF) - 1, (int)(bucket >> 16) - 1};
			for (int k = 0; k < 3; k++) {
				const int q = cand[k];
				// The window's candidate has the lane's four bytes.
				if (q < 0 || (k > 0 && zw_rd32(page, q, nw) != v)) continue;
				const int l = zw_match_len(page, nw, q, p, 4, lo + ZP_PAGE);
				const int g = zw_gain(l, (uint32_t)(p - q) + 3);
				if (g > gain) ml = l, off = p - q, gain = g;
			}
			for (int r = 0; r < ZW_REPS; r++) {
				const int o = (int)rep[r];
				if (o <= 0 || o > p) continue;
				// Its first four bytes against the lane's: most repeat
				// offsets fail here, at a load and a shift.
				const uint32_t x = zw_rd32(page, p - o, nw) ^ v;
				if (x & ((1u << (8 * ZW_REP_MIN)) - 1)) continue;
				const int l = x ? (__ffs(x) - 1) >> 3 : zw_match_len(page, nw, p - o, p, 4, lo + ZP_PAGE);
				const int g = zw_gain(l, (uint32_t)r + 1);
				if (g > gain) ml = l, off = o, gain = g;
			}
		}
		unsigned found = __ballot_sync(full, ml > 0);
		int cur = w;
		while (nseq < ZP_MAX_SEQ) {
			const int from = cur - w;
			const unsigned m = from >= 32 ? 0u : found & (full << from);
			if (m == 0) break;
			int q = __ffs(m) - 1;
			const int qg = __shfl_sync(full, gain, q);
			const int q1 = min(q + 1, 31), q2 = min(q + 2, 31);
			const int g1 = __shfl_sync(full, gain, q1), g2 = __shfl_sync(full, gain, q2);
			if (q1 != q && (found >> q1 & 1u) && g1 > qg + ZP_LAZY1) {
				q = q1;
			} else if (q2 != q1 && (found >> q2 & 1u) && g2 > qg + ZP_LAZY2) {
				q = q2;
			}
			int mlq = __shfl_sync(full, ml, q), offq = __shfl_sync(full, off, q);
			int start = w + q;
			if (mlq >= ZW_CAP) mlq = zw_extend(page, nw, start - offq, start, mlq, lo + ZP_PAGE, lane);
			while (start > anchor && start - offq > 0 && src[start - 1] == src[start - 1 - offq]) {
				start--;
				mlq++;
			}
			const uint32_t ll = (uint32_t)(start - anchor);
			const uint32_t ov = zp_offval((uint32_t)offq, ll, rep);
			zp_rep_update(rep, ov, ll);
			for (int k = lane; k < (int)ll; k += 32) lit[nlit + k] = src[anchor + k];
			if (lane == 0) {
				out->ll[nseq] = (uint16_t)ll;
				out->ml[nseq] = (uint16_t)mlq;
				out->of[nseq] = (uint16_t)ov;
			}
			nlit += (int)ll;
			nseq++;
			cur = start + mlq;
			anchor = cur;
		}
		// The window's positions enter the table, two a bucket: of the
		// lanes with one hash, the last two (or the last and the bucket's
		// newest) are kept, whatever the lanes' order.
		const unsigned group = valid ? __match_any_sync(vmask, h) : 0;
		if (valid && lane == 31 - __clz(group)) {
			const unsigned rest = group & ~(1u << lane);
			const uint32_t older = rest ? (uint32_t)(w + 31 - __clz(rest)) + 1 : bucket & 0xFFFF;
			table[h] = older << 16 | ((uint32_t)p + 1);
		}
		__syncwarp();
		w = max(cur, w + 32);
	}
	for (int k = lane; k < lo + ZP_PAGE - anchor; k += 32) lit[nlit + k] = src[anchor + k];
	nlit += lo + ZP_PAGE - anchor;
	if (lane == 0) out->nlit = nlit, out->nseq = nseq;
}

extern "C" __global__ void __launch_bounds__(32 * ZW_PARSE_WARPS, ZW_PARSE_BLOCKS)
gz_zstd_parse(const uint4 *__restrict__ in, int n, uint8_t *__restrict__ scratch,
		uint8_t *__restrict__ packed, unsigned int *__restrict__ packed_size,
		unsigned int *__restrict__ offsets, unsigned int *__restrict__ lens) {
	__shared__ uint32_t tables[ZW_PARSE_WARPS][1 << ZW_HASH_BITS];
	const int lane = threadIdx.x & 31;
	const int pg = blockIdx.x * ZW_PARSE_WARPS + (threadIdx.x >> 5);
	if (pg >= n) return;
	ZW_PROF_START();
	uint32_t *const table = tables[threadIdx.x >> 5];
	const uint32_t *const page = (const uint32_t *)(in + (size_t)pg * (ZP_PAGE / 16));
	uint8_t *const lit = scratch + (size_t)pg * ZW_SCRATCH_PAGE;
	for (int i = lane; i < (1 << ZW_HASH_BITS); i += 32) table[i] = 0;
	__syncwarp();
	uint32_t rep[3] = {1, 4, 8};
	zw_parse_block<ZW_HASH_BITS>(page, ZP_PAGE / 4, 0, table, rep, lit, (zw_parsed *)(lit + ZP_PAGE), lane);
	ZP_PROF(2);
#ifdef ZW_PROFILE
	if (lane == 0) {
		const zw_parsed *out = (const zw_parsed *)(lit + ZP_PAGE);
		atomicAdd(&zw_prof[30], (unsigned long long)max(out->nseq, 0)), atomicAdd(&zw_prof[31], (unsigned long long)max(out->nlit, 0));
	}
#endif
}

// zw_encode_page codes a page's parse, in its part of scratch from frame,
// as one zstd block, after the frame's header when header is set (a
// page's own frame). It returns the bytes written from frame, or 0 when
// they would not be fewer than a page's.
static __device__ int zw_encode_page(zp_workspace *ws, zp_lit_plan *plan, uint8_t *frame, const zw_parsed *parsed, bool header,
		int lane) {
	const unsigned full = 0xFFFFFFFFu;
	uint8_t *const block = header ? frame + 7 : frame;
	const int nlit = parsed->nlit;
	if (nlit < 0) {
		if (lane == 0) {
			if (header) zp_frame_header(frame);
			zp_block_header(block, 1, ZP_PAGE);
			block[3] = (uint8_t)parsed->rle;
		}
		return (int)(block - frame) + 4;
	}
	// The literals into the workspace (the block is then written over
	// their copy in scratch), the sequences' codes beside them.
	const int nseq = parsed->nseq;
	const uint4 *lit16 = (const uint4 *)frame;
	uint4 *ws16 = (uint4 *)ws->u.lit.lit;
	for (int i = lane; i < (nlit + 15) >> 4; i += 32) ws16[i] = lit16[i];
	for (int i = lane; i < nseq; i += 32) {
		zw_codes(ws, 0)[i] = (uint8_t)zw_ll_code(parsed->ll[i]);
		zw_codes(ws, 1)[i] = (uint8_t)zp_highbit(parsed->of[i]);
		zw_codes(ws, 2)[i] = (uint8_t)zw_ml_code((uint32_t)parsed->ml[i] - 3);
	}
	__syncwarp();
	ZP_PROF(3);
	// 16-bit counts, added as halves of 32-bit words (a page's 4096
	// literals cannot carry into the neighbour).
	uint32_t *hist2 = (uint32_t *)ws->u.lit.hist;
	for (int i = lane; i < 128; i += 32) hist2[i] = 0;
	__syncwarp();
	const uint8_t *lit = ws->u.lit.lit;
	for (int i = lane; i < nlit; i += 32) atomicAdd(&hist2[lit[i] >> 1], 1u << (16 * (lit[i] & 1)));
	__syncwarp();
	uint8_t *const oend = frame + ZP_PAGE - 1;
	ZP_PROF(4);
	if (header && lane == 0) zp_frame_header(frame);
	bool ok = zw_plan_literals(ws, nlit, block + 3, oend, plan, lane) != 0;
	__syncwarp();
	if (ok) ok = zw_huf_streams(ws, plan, lane);
	ZP_PROF(5);
	int len = 0;
	if (ok) {
		uint8_t *op = plan->end;
		if (lane == 0) zp_finish_literals(plan);
		op = zw_encode_sequences(ws, parsed, nseq, op, oend, lane);
		if (op && lane == 0) {
			zp_block_header(block, 2, (uint32_t)(op - (block + 3)));
			len = (int)(op - frame);
		}
	}
	ZP_PROF(6);
	return __shfl_sync(full, len, 0);
}

extern "C" __global__ void __launch_bounds__(32)
gz_zstd_encode(const uint4 *__restrict__ in, int n, uint8_t *__restrict__ scratch,
		uint8_t *__restrict__ packed, unsigned int *__restrict__ packed_size,
		unsigned int *__restrict__ offsets, unsigned int *__restrict__ lens) {
	__shared__ __align__(16) zp_workspace ws;
	__shared__ zp_lit_plan plan;
	const unsigned full = 0xFFFFFFFFu;
	const int lane = threadIdx.x;
	const int pg = blockIdx.x;
	if (pg >= n) return;
	ZW_PROF_START();
	uint8_t *const frame = scratch + (size_t)pg * ZW_SCRATCH_PAGE;
	const int len = zw_encode_page(&ws, &plan, frame, (const zw_parsed *)(frame + ZP_PAGE), true, lane);
	if (len <= 0 || len >= ZP_PAGE) {
		if (lane == 0) offsets[pg] = 0, lens[pg] = 0;
		return;
	}
	unsigned int at = 0;
	if (lane == 0) at = atomicAdd(packed_size, (unsigned int)(len + 15) & ~15u);
	at = __shfl_sync(full, at, 0);
	__syncwarp();
	for (int i = lane * 4; i < len; i += 128) *(uint32_t *)(packed + at + i) = *(const uint32_t *)(frame + i);
	if (lane == 0) offsets[pg] = at, lens[pg] = (unsigned int)len;
	ZP_PROF(7);
}

// Groups: ZW_GROUP_PAGES adjacent pages compressed as one frame, for the
// dense tier (pkg/device/dense.go). The three kernels below take the page
// kernels' arguments, n counting pages (a multiple of ZW_GROUP_PAGES),
// and write a frame a group: offsets[g] and lens[g] for group g, length 0
// for a group declined, and with offset ~0 for one that does not come out
// smaller than its pages.
//
// A frame is a block a page, each page's sequences found by
// zw_parse_block as a page's are, but by one warp for the whole group in
// order, with a larger hash table and the repeat offsets carried from
// block to block: matches reach back over the whole group, which is most
// of what compressing 64 KiB together gains over 4 KiB pages (zstd -1 on
// the shared corpus: 3.97 against 3.51). Blocks of a page let a read of
// one page stop decoding at its block. The blocks are then coded by
// gz_zstd_encode_blocks, a warp a page as gz_zstd_encode codes them, and
// joined into frames by gz_zstd_pack_groups.
#define ZW_GROUP_PAGES 16
#define ZW_GROUP (ZW_GROUP_PAGES * ZP_PAGE)
// The group's hash table: a group's match finder runs alone on its SM
// (a batch has few groups), so its table is as large as one warp's
// shared memory comfortably holds.
#ifndef ZW_GROUP_HASH_BITS
#define ZW_GROUP_HASH_BITS 13
#endif
// A page whose literals and twice its sequences reach this many is stored
// as its literals alone (gz_zstd_parse_groups).
#ifndef ZW_GROUP_RAW_AT
#define ZW_GROUP_RAW_AT (ZP_PAGE - 64)
#endif

// zw_parse_group parses the pages pages at group (words, ZP_PAGE bytes a
// page) as one frame's blocks, each page's parse in scratch from first on
// (ZW_SCRATCH_PAGE a page), with table (ZW_GROUP_HASH_BITS) as its hash
// table.
static __device__ void zw_parse_group(const uint32_t *group, int pages, uint8_t *first, uint32_t *table, int lane) {
	for (int i = lane; i < (1 << ZW_GROUP_HASH_BITS); i += 32) table[i] = 0;
	__syncwarp();
	uint32_t rep[3] = {1, 4, 8};
	for (int b = 0; b < pages; b++) {
		uint8_t *const lit = first + (size_t)b * ZW_SCRATCH_PAGE;
		zw_parsed *const out = (zw_parsed *)(lit + ZP_PAGE);
		const uint32_t before[3] = {rep[0], rep[1], rep[2]};
		zw_parse_block<ZW_GROUP_HASH_BITS>(group, pages * (ZP_PAGE / 4), b * ZP_PAGE, table, rep, lit, out, lane);
		__syncwarp();
		// A page that leaves nearly all of itself literals will not
		// compress: its sequences are dropped, and the repeat offsets
		// they set, so that its block can be stored raw rather than
		// decline the group (zw_pack_group).
		const int nlit = out->nlit, nseq = out->nseq;
		if (nlit >= 0 && nseq > 0 && nlit + 2 * nseq >= ZW_GROUP_RAW_AT) {
			rep[0] = before[0], rep[1] = before[1], rep[2] = before[2];
			const uint8_t *const page = (const uint8_t *)group + b * ZP_PAGE;
			for (int i = lane; i < ZP_PAGE; i += 32) lit[i] = page[i];
			__syncwarp();
			if (lane == 0) out->nlit = ZP_PAGE, out->nseq = 0;
		}
		__syncwarp();
	}
}

extern "C" __global__ void __launch_bounds__(32)
gz_zstd_parse_groups(const uint4 *__restrict__ in, int n, uint8_t *__restrict__ scratch,
		uint8_t *__restrict__ packed, unsigned int *__restrict__ packed_size,
		unsigned int *__restrict__ offsets, unsigned int *__restrict__ lens) {
	__shared__ uint32_t table[1 << ZW_GROUP_HASH_BITS];
	const int grp = blockIdx.x;
	if ((grp + 1) * ZW_GROUP_PAGES > n) return;
	zw_parse_group((const uint32_t *)(in + (size_t)grp * (ZW_GROUP / 16)), ZW_GROUP_PAGES,
		scratch + (size_t)grp * ZW_GROUP_PAGES * ZW_SCRATCH_PAGE, table, threadIdx.x);
}

// Objects of several pages (the fast tier's --object-pages, for staged
// writes) are groups of their own size: up to ZW_GROUP_PAGES pages, each
// starting at a page of the batch. The kernels of objects take, in
// offsets[i] on entry, the pages of the object that starts at page i (1
// for a page alone, 0 for a page within an object), and write the frame
// of object i at offsets[i] and lens[i] (length 0 where it did not
// compress, with offset ~0 where it would not be smaller than its pages,
// and for pages within an object). gz_zstd_parse_objects, then
// gz_zstd_encode_blocks, then gz_zstd_pack_objects, each a warp a page.

// zw_object returns the pages of the object that starts at page pg of n,
// from offsets, or 0 for none (a page within one, or sizes that do not
// fit the batch).
static __device__ __forceinline__ int zw_object(const unsigned int *offsets, int pg, int n) {
	const unsigned int pages = offsets[pg];
	return pages >= 1 && pages <= ZW_GROUP_PAGES && pg + (int)pages <= n ? (int)pages : 0;
}

extern "C" __global__ void __launch_bounds__(32)
gz_zstd_parse_objects(const uint4 *__restrict__ in, int n, uint8_t *__restrict__ scratch,
		uint8_t *__restrict__ packed, unsigned int *__restrict__ packed_size,
		unsigned int *__restrict__ offsets, unsigned int *__restrict__ lens) {
	__shared__ uint32_t table[1 << ZW_GROUP_HASH_BITS];
	const int pg = blockIdx.x;
	if (pg >= n) return;
	const int pages = zw_object(offsets, pg, n);
	if (pages == 0) return;
	zw_parse_group((const uint32_t *)(in + (size_t)pg * (ZP_PAGE / 16)), pages,
		scratch + (size_t)pg * ZW_SCRATCH_PAGE, table, threadIdx.x);
}

// gz_zstd_encode_blocks codes a page of a group as a block (its length in
// its parse's pad, 0 when it did not fit a page).
extern "C" __global__ void __launch_bounds__(32)
gz_zstd_encode_blocks(const uint4 *__restrict__ in, int n, uint8_t *__restrict__ scratch,
		uint8_t *__restrict__ packed, unsigned int *__restrict__ packed_size,
		unsigned int *__restrict__ offsets, unsigned int *__restrict__ lens) {
	__shared__ __align__(16) zp_workspace ws;
	__shared__ zp_lit_plan plan;
	const int lane = threadIdx.x;
	const int pg = blockIdx.x;
	if (pg >= n) return;
	uint8_t *const frame = scratch + (size_t)pg * ZW_SCRATCH_PAGE;
	zw_parsed *const parsed = (zw_parsed *)(frame + ZP_PAGE);
	const int len = zw_encode_page(&ws, &plan, frame, parsed, false, lane);
	__syncwarp();
	if (lane == 0) parsed->pad = (uint32_t)(len < ZP_PAGE ? len : 0);
}

// zw_pack_group writes the frame of the pages pages at group (the pages;
// their parses and blocks in scratch from first on): the header, then its
// blocks. A page whose block did not fit is stored as a raw block when it
// has no sequences; one with sequences fails its group, as the repeat
// offsets of the blocks after it were chosen with its sequences decoded,
// and a raw block would leave them out. It sets *offset and *len to the
// frame in packed, or *len to 0 and *offset to 0 for a group declined, ~0
// for one that would not be smaller than its pages.
static __device__ void zw_pack_group(const uint8_t *group, int pages, const uint8_t *first, uint8_t *packed,
		unsigned int *packed_size, unsigned int *offset, unsigned int *len, int lane) {
	const unsigned full = 0xFFFFFFFFu;
	const int hdr = 7;
	int size = 0;
	bool bad = false;
	if (lane < pages) {
		const zw_parsed *parsed = (const zw_parsed *)(first + (size_t)lane * ZW_SCRATCH_PAGE + ZP_PAGE);
		size = (int)parsed->pad;
		if (size == 0) {
			bad = parsed->nlit >= 0 && parsed->nseq > 0;
			size = 3 + ZP_PAGE;
		}
	}
	const int end = (int)zw_scan((uint32_t)size, lane);
	const int total = hdr + __shfl_sync(full, end, 31);
	const bool declined = __any_sync(full, bad);
	if (declined || total >= pages * ZP_PAGE) {
		if (lane == 0) *offset = declined ? 0u : 0xFFFFFFFFu, *len = 0;
		return;
	}
	unsigned int at = 0;
	if (lane == 0) at = atomicAdd(packed_size, (unsigned int)(total + 15) & ~15u);
	at = __shfl_sync(full, at, 0);
	uint8_t *const dst = packed + at;
	if (lane == 0) {
		const int content = pages * ZP_PAGE - 256;
		dst[0] = 0x28, dst[1] = 0xB5, dst[2] = 0x2F, dst[3] = 0xFD;
		dst[4] = 0x60; // Single_Segment, a 2-byte Frame_Content_Size
		dst[5] = (uint8_t)(content & 0xFF);
		dst[6] = (uint8_t)(content >> 8);
	}
	for (int b = 0; b < pages; b++) {
		const int bsize = __shfl_sync(full, size, b);
		const int from = hdr + __shfl_sync(full, end, b) - bsize;
		const uint8_t *const frame = first + (size_t)b * ZW_SCRATCH_PAGE;
		const bool raw = ((const zw_parsed *)(frame + ZP_PAGE))->pad == 0;
		const uint8_t *const src = raw ? group + b * ZP_PAGE : frame;
		const int last = b == pages - 1;
		if (raw) {
			if (lane == 0) zp_block_header(dst + from, 0, ZP_PAGE);
			for (int i = lane; i < ZP_PAGE; i += 32) dst[from + 3 + i] = src[i];
		} else {
			for (int i = lane; i < bsize; i += 32) dst[from + i] = src[i];
		}
		__syncwarp();
		// zp_block_header marks every block the last.
		if (lane == 0 && !last) dst[from] &= 0xFE;
	}
	if (lane == 0) *offset = at, *len = (unsigned int)total;
}

// gz_zstd_pack_groups writes each group's frame (zw_pack_group).
extern "C" __global__ void __launch_bounds__(32)
gz_zstd_pack_groups(const uint4 *__restrict__ in, int n, uint8_t *__restrict__ scratch,
		uint8_t *__restrict__ packed, unsigned int *__restrict__ packed_size,
		unsigned int *__restrict__ offsets, unsigned int *__restrict__ lens) {
	const int grp = blockIdx.x;
	if ((grp + 1) * ZW_GROUP_PAGES > n) return;
	zw_pack_group((const uint8_t *)(in + (size_t)grp * (ZW_GROUP / 16)), ZW_GROUP_PAGES,
		scratch + (size_t)grp * ZW_GROUP_PAGES * ZW_SCRATCH_PAGE, packed, packed_size, &offsets[grp], &lens[grp],
		threadIdx.x);
}

// gz_zstd_pack_objects writes each object's frame (zw_pack_group), and
// nothing for a page within one (length 0, offset 0).
extern "C" __global__ void __launch_bounds__(32)
gz_zstd_pack_objects(const uint4 *__restrict__ in, int n, uint8_t *__restrict__ scratch,
		uint8_t *__restrict__ packed, unsigned int *__restrict__ packed_size,
		unsigned int *__restrict__ offsets, unsigned int *__restrict__ lens) {
	const int lane = threadIdx.x;
	const int pg = blockIdx.x;
	if (pg >= n) return;
	const int pages = zw_object(offsets, pg, n);
	__syncwarp(); // every lane has read its size before lane 0 writes the result
	unsigned int offset = 0, len = 0;
	if (pages > 0)
		zw_pack_group((const uint8_t *)(in + (size_t)pg * (ZP_PAGE / 16)), pages, scratch + (size_t)pg * ZW_SCRATCH_PAGE,
			packed, packed_size, &offset, &len, lane);
	if (lane == 0) offsets[pg] = offset, lens[pg] = len;
}
