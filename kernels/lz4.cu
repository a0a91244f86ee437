// Batched LZ4 block compression and decompression of 4 KiB pages, and
// compression of objects of several pages.
//
// One warp owns one page. Compression walks the page in windows of 32
// positions, one per lane. Each lane finds the longest match (compared up
// to SEARCH_CAP bytes) for its position among the nearest earlier lane of
// the window holding the same 4 bytes (__match_any_sync) and the positions
// in its hash bucket (WAYS most recent positions with that hash); then the
// window's positions enter the table, and the parser picks matches in
// order, greedily with a one-position lazy look-ahead, extending a capped
// match with the whole warp. The chosen sequences of a window are encoded
// at once: each lane sizes its own, a warp prefix sum places them. The
// next window starts where the last match ends.
//
// Searching every uncovered position (liblz4's fast mode skips ahead after
// misses) is what beats liblz4 level 1's ratio; the table size, ways and
// cap trade ratio for speed (bench/gpu/sweep.sh measures variants; the
// defaults were chosen on an H200, see bench/results/gpu-*.md).
//
// The output is the standard LZ4 block format (lz4_Block_format.md): the
// last match starts at least 12 bytes before the end, the last 5 bytes are
// literals. A page whose encoding would need PAGE_SIZE bytes or more gets
// length 0: the caller stores it raw.
//
// Compressed pages are packed on the device: each warp reserves its place
// in the packed buffer with one atomicAdd (16-byte aligned), so only the
// packed bytes and the per-page offsets and lengths travel back.
//
// Decompression: one warp per page, the parse run by all lanes in step,
// literals and matches copied 32 bytes at a time (a match shorter-period
// than its length is copied from its period, which is already written).
//
// The file is built to PTX for compute_75 (Turing and later; the driver
// compiles it for the GPU at load) by kernels/build-ptx.sh; no newer
// instruction is needed.

#include <stdint.h>

#define PAGE_SIZE 4096
#define PAGE_WORDS (PAGE_SIZE / 4)
// Zero words after a page in shared memory, so that word loads near the
// end need no bounds checks (the bytes they read are never used).
#define PAD_WORDS 16
#define MIN_MATCH 4
#define LAST_LITERALS 5
#define MF_LIMIT 12
// A compressed page must be strictly smaller than a page.
#define OUT_LIMIT (PAGE_SIZE - 1)

#ifndef HASH_BITS
#define HASH_BITS 9
#endif
#define HASH_BUCKETS (1 << HASH_BITS)
// Ways per hash bucket: 16-bit positions packed in one word, slot 0 newest.
#ifndef WAYS
#define WAYS 2
#endif
#if WAYS == 4
typedef unsigned long long bucket_t;
#elif WAYS == 2
typedef unsigned int bucket_t;
#else
#error "WAYS must be 2 or 4"
#endif
// Per-position search stops extending a match at this length; the parser
// extends the chosen match further with the whole warp.
#ifndef SEARCH_CAP
#define SEARCH_CAP 12
#endif
#if SEARCH_CAP % 4 != 0 || SEARCH_CAP < 8
#error "SEARCH_CAP must be a multiple of 4, at least 8"
#endif
#define SEARCH_WORDS (SEARCH_CAP / 4)

#ifndef C_WARPS
#define C_WARPS 4 // warps (pages) per compression block
#endif
#define D_WARPS 4 // warps (pages) per decompression block
#ifndef C_MIN_BLOCKS
#define C_MIN_BLOCKS 1
#endif

#define FULL_MASK 0xFFFFFFFFu

// The encoder reads its input as words, from a source: a page in shared
// memory followed by PAD_WORDS of padding (Padded), or an object in global
// memory read no further than its last word (Clamped), as the batch may
// end there. The encoder loads words up to 64 bytes past its input's end,
// whose values it never uses.
struct Padded {
	const uint32_t *w;
	__device__ __forceinline__ uint32_t operator[](int i) const { return w[i]; }
};
struct Clamped {
	const uint32_t *w;
	int last; // the input's last word
	__device__ __forceinline__ uint32_t operator[](int i) const { return w[min(i, last)]; }
};

// word_at loads an unaligned little-endian 32-bit word at byte position x.
template <class S>
__device__ __forceinline__ uint32_t word_at(const S &s, int x) {
	const int i = x >> 2;
	return __funnelshift_r(s[i], s[i + 1], (x & 3) * 8);
}

template <int HB>
__device__ __forceinline__ uint32_t hash4(uint32_t w) {
	return (w * 2654435761u) >> (32 - HB);
}

// equal_bytes counts the equal leading bytes of two little-endian words.
__device__ __forceinline__ int equal_bytes(uint32_t a, uint32_t b) {
	uint32_t x = a ^ b;
	return x == 0 ? 4 : (__ffs(x) - 1) >> 3;
}

// cand_len returns how many leading bytes (4 to SEARCH_CAP) position c
// shares with the position whose first SEARCH_WORDS words are pw, or 0 if
// they differ in the first 4 bytes. c is an earlier position than the one
// searched; bytes past the input are never used (the caller clamps the
// length).
template <class S>
__device__ __forceinline__ int cand_len(const S &s, int c, const uint32_t (&pw)[SEARCH_WORDS]) {
	const int ci = c >> 2, cs = (c & 3) * 8;
	uint32_t a[SEARCH_WORDS + 1];
	a[0] = s[ci];
	a[1] = s[ci + 1];
	if (__funnelshift_r(a[0], a[1], cs) != pw[0]) return 0;
#pragma unroll
	for (int k = 2; k <= SEARCH_WORDS; k++) a[k] = s[ci + k];
	int len = SEARCH_CAP;
#pragma unroll
	for (int k = SEARCH_WORDS - 1; k >= 1; k--) {
		const uint32_t x = __funnelshift_r(a[k], a[k + 1], cs) ^ pw[k];
		if (x != 0) len = 4 * k + ((__ffs(x) - 1) >> 3);
	}
	return len;
}

// warp_extend extends a match between p and c from length k up to limit,
// comparing 128 bytes per step with the whole warp. All lanes call it with
// the same arguments and get the same result.
template <class S>
__device__ int warp_extend(const S &s, int p, int c, int k, int limit, int lane) {
	while (k < limit) {
		int at = k + 4 * lane;
		int e = 0;
		if (at < limit) {
			e = equal_bytes(word_at(s, p + at), word_at(s, c + at));
			e = min(e, limit - at);
		}
		uint32_t short_lanes = __ballot_sync(FULL_MASK, e < 4);
		if (short_lanes == 0) {
			k += 128;
			continue;
		}
		int f = __ffs(short_lanes) - 1;
		int ef = __shfl_sync(FULL_MASK, e, f);
		return k + 4 * f + ef;
	}
	return limit;
}

// put_length writes the extension bytes of an LZ4 length field (the part
// beyond 15) at out, a byte per lane per step (an object's last literals
// may need more than 32); v = length - 15 >= 0.
__device__ __forceinline__ void put_length(uint8_t *out, int v, int lane) {
	int n = v / 255 + 1;
	for (int i = lane; i < n; i += 32) out[i] = (i == n - 1) ? (uint8_t)(v % 255) : (uint8_t)255;
}

__device__ __forceinline__ int length_size(int len) {
	return len >= 15 ? (len - 15) / 255 + 1 : 0;
}

// emit writes one sequence: literals [lit, lit+nlit) then, when mlen > 0,
// a match of mlen bytes at distance off. It returns false (writing nothing)
// if the sequence would take the output past out_limit.
__device__ bool emit(const uint8_t *src, uint8_t *out, int &op, int lit, int nlit, int off, int mlen, int lane, int out_limit) {
	int need = 1 + length_size(nlit) + nlit;
	if (mlen > 0) need += 2 + length_size(mlen - MIN_MATCH);
	if (op + need > out_limit) return false;
	int o = op;
	if (lane == 0) {
		int ml = mlen > 0 ? min(mlen - MIN_MATCH, 15) : 0;
		out[o] = (uint8_t)((min(nlit, 15) << 4) | ml);
	}
	o++;
	if (nlit >= 15) {
		put_length(out + o, nlit - 15, lane);
		o += length_size(nlit);
	}
	for (int i = lane; i < nlit; i += 32) out[o + i] = src[lit + i];
	o += nlit;
	if (mlen > 0) {
		if (lane == 0) {
			out[o] = (uint8_t)off;
			out[o + 1] = (uint8_t)(off >> 8);
		}
		o += 2;
		if (mlen - MIN_MATCH >= 15) {
			put_length(out + o, mlen - MIN_MATCH - 15, lane);
			o += length_size(mlen - MIN_MATCH);
		}
	}
	op = o;
	return true;
}

// lz4_encode encodes the size bytes of source s as one LZ4 block into out,
// with table (1 << HB buckets, cleared) as its hash table, and returns the
// block's length, or 0 where it would be longer than out_limit. One warp
// calls it with the same arguments; size is at most 65536, so that
// positions fit a bucket's 16 bits and every match is within LZ4's reach.
template <int HB, class S>
__device__ __forceinline__ int lz4_encode(const S &s, const int size, bucket_t *table, uint8_t *out,
		const int out_limit, const int lane) {
	const uint8_t *src = (const uint8_t *)s.w;
	// A match may start at p only if p + MF_LIMIT <= size, and must end
	// at or before match_end.
	const int match_start = size - MF_LIMIT;
	const int match_end = size - LAST_LITERALS;
	int op = 0;       // output position
	int anchor = 0;   // first literal not yet emitted
	int cursor = 0;   // first position not yet covered by a chosen match
	bool ok = true;

	int base = 0; // first position of this step's window of 32
	while (base < size && ok) {
		const int p = base + lane;
		const bool valid = p + MIN_MATCH <= size;
		// This position's first SEARCH_CAP bytes (bytes past the end are
		// garbage, and never used: limit below keeps matches inside).
		uint32_t pw[SEARCH_WORDS];
		{
			const int pi = p >> 2, ps = (p & 3) * 8;
			uint32_t a[SEARCH_WORDS + 1];
#pragma unroll
			for (int k = 0; k <= SEARCH_WORDS; k++) a[k] = s[pi + k];
#pragma unroll
			for (int k = 0; k < SEARCH_WORDS; k++) pw[k] = __funnelshift_r(a[k], a[k + 1], ps);
		}
		const uint32_t cur = valid ? pw[0] : 0u;
		const uint32_t h = hash4<HB>(cur);

		// Search: the longest match among the nearest earlier lane with the
		// same word and the bucket's positions, nearest first on ties.
		int best_len = 0, best_off = 0;
		const bool search = valid && p >= cursor && p < match_start;
		const uint32_t same = __match_any_sync(FULL_MASK, valid ? cur : (0x80000000u ^ (uint32_t)lane));
		const bucket_t bucket = table[h];
		if (search) {
			const uint32_t earlier = same & ((1u << lane) - 1u);
			if (earlier) {
				const int q = base + 31 - __clz(earlier);
				best_len = cand_len(s, q, pw);
				best_off = p - q;
			}
#pragma unroll
			for (int k = 0; k < WAYS; k++) {
				const int c = (int)((bucket >> (16 * k)) & 0xFFFFu);
				if (c < p) {
					const int l = cand_len(s, c, pw);
					if (l > best_len) {
						best_len = l;
						best_off = p - c;
					}
				}
			}
			best_len = min(best_len, match_end - p);
			if (best_len < MIN_MATCH) best_len = 0;
		}
		__syncwarp();

		// Insert this step's positions, newest first, each bucket updated by
		// the highest lane that hashes to it.
		const uint32_t group = __match_any_sync(FULL_MASK, valid ? h : (0x80000000u | (uint32_t)lane));
		if (valid && lane == 31 - __clz(group)) {
			bucket_t fresh = 0;
			uint32_t g = group;
			int k = 0;
			for (; k < WAYS && g; k++) {
				int l = 31 - __clz(g);
				g &= ~(1u << l);
				fresh |= (bucket_t)(base + l) << (16 * k);
			}
			bucket_t kept = k == WAYS ? (bucket_t)0 : (bucket_t)(bucket << (16 * k));
			table[h] = kept | fresh;
		}
		__syncwarp();

		// Parse: choose this step's matches in order (greedy, with a
		// one-position lazy look-ahead), then encode them all at once.
		const uint32_t has = __ballot_sync(FULL_MASK, best_len > 0);
		uint32_t sel = 0;   // lanes where a chosen match starts
		int sel_len = 0;    // its final length, on those lanes
		while (cursor < base + 32) {
			const uint32_t cand = has & (FULL_MASK << (cursor - base));
			if (cand == 0) {
				cursor = base + 32;
				break;
			}
			int j = __ffs(cand) - 1;
			int len = __shfl_sync(FULL_MASK, best_len, j);
			while (j < 31) {
				const int nlen = __shfl_sync(FULL_MASK, best_len, j + 1);
				if (nlen <= len) break;
				j++;
				len = nlen;
			}
			const int mp = base + j;
			const int limit = match_end - mp;
			if (len >= SEARCH_CAP && len < limit)
				len = warp_extend(s, mp, mp - __shfl_sync(FULL_MASK, best_off, j), len, limit, lane);
			if (lane == j) sel_len = len;
			sel |= 1u << j;
			cursor = mp + len;
		}
		// The next window starts where the matches end: positions inside
		// a match that crosses the window's end are neither searched nor
		// inserted (liblz4 skips them too). This saves about 8% of the
		// windows for 0.04% of ratio.
		base = cursor;
		if (sel == 0) continue;

		// Encode: each chosen lane sizes its sequence (literals since the
		// previous match, then the match), a prefix sum places them, each
		// lane writes its header bytes, and the warp copies the literals.
		const bool me = (sel >> lane) & 1u;
		const uint32_t before = sel & ((1u << lane) - 1u);
		const int prev_end = __shfl_sync(FULL_MASK, p + sel_len, (31 - __clz(before)) & 31);
		const int lit = before ? prev_end : anchor;
		const int nlit = p - lit;
		const int mcode = sel_len - MIN_MATCH;
		const int size_me = me ? 3 + length_size(nlit) + nlit + length_size(mcode) : 0;
		int incl = size_me;
#pragma unroll
		for (int d = 1; d < 32; d <<= 1) {
			const int v = __shfl_up_sync(FULL_MASK, incl, d);
			if (lane >= d) incl += v;
		}
		const int total = __shfl_sync(FULL_MASK, incl, 31);
		if (op + total > out_limit) {
			ok = false;
			break;
		}
		int o = op + incl - size_me;
		int lit_out = 0;
		if (me) {
			out[o++] = (uint8_t)((min(nlit, 15) << 4) | min(mcode, 15));
			if (nlit >= 15) {
				int v = nlit - 15;
				for (; v >= 255; v -= 255) out[o++] = 255;
				out[o++] = (uint8_t)v;
			}
			lit_out = o;
			o += nlit;
			const int off = best_off;
			out[o++] = (uint8_t)off;
			out[o++] = (uint8_t)(off >> 8);
			if (mcode >= 15) {
				int v = mcode - 15;
				for (; v >= 255; v -= 255) out[o++] = 255;
				out[o++] = (uint8_t)v;
			}
		}
		for (uint32_t m = sel; m != 0; m &= m - 1) {
			const int jj = __ffs(m) - 1;
			const int n = __shfl_sync(FULL_MASK, nlit, jj);
			const int from = __shfl_sync(FULL_MASK, lit, jj);
			const int to = __shfl_sync(FULL_MASK, lit_out, jj);
			for (int i = lane; i < n; i += 32) out[to + i] = src[from + i];
		}
		op += total;
		anchor = __shfl_sync(FULL_MASK, p + sel_len, 31 - __clz(sel));
	}
	if (ok) ok = emit(src, out, op, anchor, size - anchor, 0, 0, lane, out_limit);
	__syncwarp();
	return ok ? op : 0;
}

// pack reserves room for the block of len bytes (0: none) at out in packed
// with one atomicAdd on *packed_size, 16-byte aligned, copies it there, and
// records its offset and length as result pg.
__device__ __forceinline__ void pack(const uint8_t *out, unsigned int len, int pg, uint8_t *packed,
		unsigned int *packed_size, unsigned int *offsets, unsigned int *lens, int lane) {
	unsigned int at = 0;
	if (lane == 0 && len > 0) at = atomicAdd(packed_size, (len + 15u) & ~15u);
	at = __shfl_sync(FULL_MASK, at, 0);
	if (lane == 0) {
		lens[pg] = len;
		offsets[pg] = at;
	}
	if (len > 0) {
		const uint4 *from = (const uint4 *)out;
		uint4 *to = (uint4 *)(packed + at);
		for (unsigned int i = lane; i < (len + 15u) / 16u; i += 32) to[i] = from[i];
	}
}

// load_page copies page pg of in into s (PAGE_WORDS words, then PAD_WORDS
// of zeros), 16 bytes per lane per step.
__device__ __forceinline__ void load_page(const uint4 *in, int pg, uint32_t *s, int lane) {
	const uint4 *pin = in + (size_t)pg * (PAGE_SIZE / 16);
	uint4 *s4 = (uint4 *)s;
#pragma unroll
	for (int i = 0; i < PAGE_SIZE / 16 / 32; i++) s4[lane + 32 * i] = pin[lane + 32 * i];
	if (lane < PAD_WORDS) s[PAGE_WORDS + lane] = 0;
}

// encode_page encodes page pg of in, loaded into s (the warp's page in
// shared memory), with table (HASH_BUCKETS of it) as its hash table, into
// out, and returns the block's length, or 0 where it did not compress.
__device__ __forceinline__ int encode_page(const uint4 *in, int pg, uint32_t *s, bucket_t *table, uint8_t *out, int lane) {
	load_page(in, pg, s, lane);
	for (int i = lane; i < HASH_BUCKETS; i += 32) table[i] = (bucket_t)~0ull;
	__syncwarp();
	return lz4_encode<HASH_BITS>(Padded{s}, PAGE_SIZE, table, out, OUT_LIMIT, lane);
}

struct CompressShared {
	uint32_t page[C_WARPS][PAGE_WORDS + PAD_WORDS];
	bucket_t table[C_WARPS][HASH_BUCKETS];
};

// gz_lz4_compress compresses n pages from in (page i at in + i*PAGE_SIZE).
// Each page is first encoded into scratch (page i at scratch + i*PAGE_SIZE),
// then packed into packed at a 16-byte-aligned offset reserved with
// atomicAdd on *packed_size (which the caller zeroes). lens[i] = 0 means the
// page did not compress; offsets[i] is then 0.
extern "C" __global__ void __launch_bounds__(C_WARPS * 32, C_MIN_BLOCKS)
gz_lz4_compress(const uint4 *__restrict__ in, int n, uint8_t *__restrict__ scratch,
		uint8_t *__restrict__ packed, unsigned int *__restrict__ packed_size,
		unsigned int *__restrict__ offsets, unsigned int *__restrict__ lens) {
	__shared__ CompressShared sh;
	const int lane = threadIdx.x & 31;
	const int w = threadIdx.x >> 5;
	const int pg = blockIdx.x * C_WARPS + w;
	if (pg >= n) return;

	uint8_t *out = scratch + (size_t)pg * PAGE_SIZE;
	const int len = encode_page(in, pg, sh.page[w], sh.table[w], out, lane);
	pack(out, (unsigned int)len, pg, packed, packed_size, offsets, lens, lane);
}

// Objects of several adjacent pages (up to MAX_OBJECT_PAGES, 64 KiB) are
// compressed as one LZ4 block each, by one warp, which reads the object
// from global memory (through the L1 cache) rather than shared memory, and
// uses a larger hash table. A page alone is compressed as gz_lz4_compress
// compresses it.
#define MAX_OBJECT_PAGES 16
#ifndef O_HASH_BITS
#define O_HASH_BITS 12
#endif
#define O_WARPS 2 // warps (objects) per block: shared memory bounds it

struct ObjectShared {
	uint32_t page[O_WARPS][PAGE_WORDS + PAD_WORDS];
	bucket_t table[O_WARPS][1 << O_HASH_BITS];
};

// gz_lz4_compress_objects compresses the objects of n pages from in, as
// gz_lz4_compress compresses pages: offsets[i] holds, on entry, the pages
// of the object that starts at page i (1 for a page alone, 0 for a page
// within an object), and on return, as lens[i], object i's packed block
// (length 0 where it did not compress below its pages' size less a byte,
// and for pages within an object). Object i is encoded into scratch from
// page i on.
extern "C" __global__ void __launch_bounds__(O_WARPS * 32)
gz_lz4_compress_objects(const uint4 *__restrict__ in, int n, uint8_t *__restrict__ scratch,
		uint8_t *__restrict__ packed, unsigned int *__restrict__ packed_size,
		unsigned int *__restrict__ offsets, unsigned int *__restrict__ lens) {
	__shared__ ObjectShared sh;
	const int lane = threadIdx.x & 31;
	const int w = threadIdx.x >> 5;
	const int pg = blockIdx.x * O_WARPS + w;
	if (pg >= n) return;

	const unsigned int pages = offsets[pg];
	__syncwarp(); // every lane has read it before lane 0 writes its result
	bucket_t *table = sh.table[w];
	uint8_t *out = scratch + (size_t)pg * PAGE_SIZE;
	int len = 0;
	if (pages == 1) {
		len = encode_page(in, pg, sh.page[w], table, out, lane);
	} else if (pages > 1 && pages <= MAX_OBJECT_PAGES && pg + (int)pages <= n) {
		const int size = (int)pages * PAGE_SIZE;
		const Clamped s{(const uint32_t *)(in + (size_t)pg * (PAGE_SIZE / 16)), size / 4 - 1};
		for (int i = lane; i < (1 << O_HASH_BITS); i += 32) table[i] = (bucket_t)~0ull;
		__syncwarp();
		len = lz4_encode<O_HASH_BITS>(s, size, table, out, size - 1, lane);
	}
	pack(out, (unsigned int)len, pg, packed, packed_size, offsets, lens, lane);
}

// gz_lz4_decompress decodes n pages: page i's compressed bytes are
// in[offsets[i] : offsets[i]+lens[i]], its output out + i*PAGE_SIZE. Pages
// with lens[i] == 0 are skipped. status[i] is 0 for a page decoded to
// exactly PAGE_SIZE bytes, 1 for malformed input (the output page is then
// undefined), 2 for a skipped page.
extern "C" __global__ void __launch_bounds__(D_WARPS * 32)
gz_lz4_decompress(const uint8_t *__restrict__ in, const unsigned int *__restrict__ offsets,
		const unsigned int *__restrict__ lens, int n, uint4 *__restrict__ out,
		unsigned int *__restrict__ status) {
	__shared__ uint4 sin4[D_WARPS][PAGE_SIZE / 16];
	__shared__ uint4 sout4[D_WARPS][PAGE_SIZE / 16];
	const int lane = threadIdx.x & 31;
	const int w = threadIdx.x >> 5;
	const int pg = blockIdx.x * D_WARPS + w;
	if (pg >= n) return;
	const int clen = (int)lens[pg];
	if (clen == 0 || clen >= PAGE_SIZE) {
		if (lane == 0) status[pg] = clen == 0 ? 2u : 1u;
		return;
	}
	uint8_t *sin = (uint8_t *)sin4[w];
	uint8_t *sout = (uint8_t *)sout4[w];
	const uint8_t *src = in + offsets[pg];
	for (int i = lane; i < clen; i += 32) sin[i] = src[i];
	__syncwarp();

	int ip = 0, op = 0;
	bool bad = false;
	for (;;) {
		if (ip >= clen) { bad = true; break; }
		const int token = sin[ip++];
		int lit = token >> 4;
		if (lit == 15) {
			int b;
			do {
				if (ip >= clen) { bad = true; break; }
				b = sin[ip++];
				lit += b;
			} while (b == 255);
			if (bad) break;
		}
		if (ip + lit > clen || op + lit > PAGE_SIZE) { bad = true; break; }
		for (int i = lane; i < lit; i += 32) sout[op + i] = sin[ip + i];
		ip += lit;
		op += lit;
		if (ip == clen) break; // the last sequence holds only literals
		if (ip + 2 > clen) { bad = true; break; }
		const int off = sin[ip] | (sin[ip + 1] << 8);
		ip += 2;
		int ml = token & 15;
		if (ml == 15) {
			int b;
			do {
				if (ip >= clen) { bad = true; break; }
				b = sin[ip++];
				ml += b;
			} while (b == 255);
			if (bad) break;
		}
		ml += MIN_MATCH;
		if (off == 0 || off > op || op + ml > PAGE_SIZE) { bad = true; break; }
		__syncwarp();
		if (off >= ml) {
			for (int i = lane; i < ml; i += 32) sout[op + i] = sout[op - off + i];
		} else {
			// The source repeats with period off, so every byte can be read
			// from the bytes before op and copied at once.
			for (int i = lane; i < ml; i += 32) sout[op + i] = sout[op - off + i % off];
		}
		__syncwarp();
		op += ml;
	}
	if (!bad && op != PAGE_SIZE) bad = true;
	__syncwarp();
	if (lane == 0) status[pg] = bad ? 1u : 0u;
	if (bad) return;
	uint4 *dst = out + (size_t)pg * (PAGE_SIZE / 16);
#pragma unroll
	for (int i = 0; i < PAGE_SIZE / 16 / 32; i++) dst[lane + 32 * i] = sout4[w][lane + 32 * i];
}
