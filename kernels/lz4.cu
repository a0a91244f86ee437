// Batched LZ4 block compression and decompression of 4 KiB pages.
//
// One warp owns one page. Compression finds, for every position of the page
// in parallel (32 positions per step), the longest match among a 4-way
// hash bucket of earlier positions and the nearest earlier lane holding the
// same 4 bytes, then parses greedily with a one-step lazy look-ahead. Every
// position is both searched and inserted, which is why the ratio beats
// liblz4's fast mode (which skips ahead on misses and keeps one candidate).
//
// The output is the standard LZ4 block format (lz4_Block_format.md): the
// last match starts at least 12 bytes before the end, the last 5 bytes are
// literals. A page whose encoding would need PAGE_SIZE bytes or more gets
// length 0: the caller stores it raw.
//
// Compressed pages are packed on the device: each warp reserves its slot in
// the packed buffer with one atomicAdd (16-byte aligned), so only the packed
// bytes and the per-page offsets and lengths travel back to the host.
//
// The file is built to PTX for compute_75 (Turing and later; Hopper JIT-
// compiles it at module load) by kernels/build-ptx.sh; no Hopper-only
// instructions are needed.

#include <stdint.h>

#define PAGE_SIZE 4096
#define PAGE_WORDS (PAGE_SIZE / 4)
#define MIN_MATCH 4
#define LAST_LITERALS 5
#define MF_LIMIT 12
// A match may start at p only if p + MF_LIMIT <= PAGE_SIZE.
#define MATCH_START_LIMIT (PAGE_SIZE - MF_LIMIT)
// and must end at or before this position.
#define MATCH_END_LIMIT (PAGE_SIZE - LAST_LITERALS)
// A compressed page must be strictly smaller than a page.
#define OUT_LIMIT (PAGE_SIZE - 1)

#define HASH_BITS 10
#define HASH_BUCKETS (1 << HASH_BITS)
#define EMPTY_SLOT 0xFFFFu
// Per-position search stops extending a match at this length; the parser
// extends the chosen match further with the whole warp.
#define SEARCH_CAP 36

#define C_WARPS 4 // warps (pages) per compression block
#define D_WARPS 4 // warps (pages) per decompression block

#define FULL_MASK 0xFFFFFFFFu

// word loads an unaligned little-endian 32-bit word at byte position x of a
// page held as words in shared memory. Bytes past the page read as zero.
__device__ __forceinline__ uint32_t word_at(const uint32_t *s, int x) {
	int i = x >> 2;
	uint32_t lo = s[i];
	uint32_t hi = (i + 1 < PAGE_WORDS) ? s[i + 1] : 0u;
	return __funnelshift_r(lo, hi, (x & 3) * 8);
}

__device__ __forceinline__ uint32_t hash4(uint32_t w) {
	return (w * 2654435761u) >> (32 - HASH_BITS);
}

// equal_bytes counts the equal leading bytes of two little-endian words.
__device__ __forceinline__ int equal_bytes(uint32_t a, uint32_t b) {
	uint32_t x = a ^ b;
	return x == 0 ? 4 : (__ffs(x) - 1) >> 3;
}

// match_len returns the length of the match between positions p and c
// (c < p), known to share their first 4 bytes, up to limit bytes.
__device__ __forceinline__ int match_len(const uint32_t *s, int p, int c, int limit) {
	int k = MIN_MATCH;
	while (k < limit) {
		int e = equal_bytes(word_at(s, p + k), word_at(s, c + k));
		k += e;
		if (e < 4) break;
	}
	return min(k, limit);
}

// warp_extend extends a match between p and c from length k up to limit,
// comparing 128 bytes per step with the whole warp. All lanes call it with
// the same arguments and get the same result.
__device__ int warp_extend(const uint32_t *s, int p, int c, int k, int limit, int lane) {
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

// length_bytes writes the extension bytes of an LZ4 length field (the part
// beyond 15) at out, one byte per lane; v = length - 15 >= 0.
__device__ __forceinline__ void put_length(uint8_t *out, int v, int lane) {
	int n = v / 255 + 1;
	if (lane < n) out[lane] = (lane == n - 1) ? (uint8_t)(v % 255) : (uint8_t)255;
}

__device__ __forceinline__ int length_size(int len) {
	return len >= 15 ? (len - 15) / 255 + 1 : 0;
}

// emit writes one sequence: literals [lit, lit+nlit) then, when mlen > 0,
// a match of mlen bytes at distance off. It returns false (writing nothing)
// if the sequence would take the output past OUT_LIMIT.
__device__ bool emit(const uint8_t *src, uint8_t *out, int &op, int lit, int nlit, int off, int mlen, int lane) {
	int need = 1 + length_size(nlit) + nlit;
	if (mlen > 0) need += 2 + length_size(mlen - MIN_MATCH);
	if (op + need > OUT_LIMIT) return false;
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

struct CompressShared {
	uint32_t page[C_WARPS][PAGE_WORDS];
	unsigned long long table[C_WARPS][HASH_BUCKETS]; // 4 x 16-bit positions, slot 0 newest
};

// gz_lz4_compress compresses n pages from in (page i at in + i*PAGE_SIZE).
// Each page is first encoded into scratch (page i at scratch + i*PAGE_SIZE),
// then packed into packed at a 16-byte-aligned offset reserved with
// atomicAdd on *packed_size (which the caller zeroes). lens[i] = 0 means the
// page did not compress; offsets[i] is then 0.
extern "C" __global__ void __launch_bounds__(C_WARPS * 32)
gz_lz4_compress(const uint4 *__restrict__ in, int n, uint8_t *__restrict__ scratch,
		uint8_t *__restrict__ packed, unsigned int *__restrict__ packed_size,
		unsigned int *__restrict__ offsets, unsigned int *__restrict__ lens) {
	__shared__ CompressShared sh;
	const int lane = threadIdx.x & 31;
	const int w = threadIdx.x >> 5;
	const int pg = blockIdx.x * C_WARPS + w;
	if (pg >= n) return;

	uint32_t *s = sh.page[w];
	unsigned long long *table = sh.table[w];
	const uint8_t *src = (const uint8_t *)s;
	uint8_t *out = scratch + (size_t)pg * PAGE_SIZE;

	// Load the page (16 bytes per lane per step) and clear the table.
	const uint4 *pin = in + (size_t)pg * (PAGE_SIZE / 16);
	uint4 *s4 = (uint4 *)s;
#pragma unroll
	for (int i = 0; i < PAGE_SIZE / 16 / 32; i++) s4[lane + 32 * i] = pin[lane + 32 * i];
	for (int i = lane; i < HASH_BUCKETS; i += 32) table[i] = ~0ull;
	__syncwarp();

	int op = 0;       // output position
	int anchor = 0;   // first literal not yet emitted
	int cursor = 0;   // first position not yet covered by a chosen match
	bool ok = true;

	for (int base = 0; base < PAGE_SIZE && ok; base += 32) {
		const int p = base + lane;
		const bool valid = p + MIN_MATCH <= PAGE_SIZE;
		const uint32_t cur = valid ? word_at(s, p) : 0u;
		const uint32_t h = hash4(cur);

		// Search: the longest match among the nearest earlier lane with the
		// same word and the bucket's four positions.
		int best_len = 0, best_off = 0;
		const bool search = valid && p >= cursor && p < MATCH_START_LIMIT;
		const uint32_t same = __match_any_sync(FULL_MASK, valid ? cur : (0x80000000u ^ (uint32_t)lane));
		const unsigned long long bucket = table[h];
		if (search) {
			const int limit = min(SEARCH_CAP, MATCH_END_LIMIT - p);
			const uint32_t earlier = same & ((1u << lane) - 1u);
			if (earlier) {
				int q = base + 31 - __clz(earlier);
				best_len = match_len(s, p, q, limit);
				best_off = p - q;
			}
#pragma unroll
			for (int k = 0; k < 4; k++) {
				int c = (int)((bucket >> (16 * k)) & 0xFFFFu);
				if (c < p && p - c > best_off && word_at(s, c) == cur) {
					int l = match_len(s, p, c, limit);
					if (l > best_len) {
						best_len = l;
						best_off = p - c;
					}
				}
			}
			if (best_len < MIN_MATCH) best_len = 0;
		}
		__syncwarp();

		// Insert this step's positions, newest first, each bucket updated by
		// the highest lane that hashes to it.
		const uint32_t group = __match_any_sync(FULL_MASK, valid ? h : (0x80000000u | (uint32_t)lane));
		if (valid && lane == 31 - __clz(group)) {
			unsigned long long fresh = 0;
			uint32_t g = group;
			int k = 0;
			for (; k < 4 && g; k++) {
				int l = 31 - __clz(g);
				g &= ~(1u << l);
				fresh |= (unsigned long long)(base + l) << (16 * k);
			}
			unsigned long long kept = k == 4 ? 0ull : (bucket << (16 * k));
			table[h] = kept | fresh;
		}
		__syncwarp();

		// Parse: walk the chosen matches of this step in order.
		const uint32_t has = __ballot_sync(FULL_MASK, best_len > 0);
		while (cursor < base + 32) {
			const int rel = cursor - base;
			const uint32_t cand = has & (FULL_MASK << rel);
			if (cand == 0) {
				cursor = base + 32;
				break;
			}
			int j = __ffs(cand) - 1;
			int len = __shfl_sync(FULL_MASK, best_len, j);
			int off = __shfl_sync(FULL_MASK, best_off, j);
			// Lazy step: prefer the next position's match if it is longer.
			while (j < 31) {
				int nlen = __shfl_sync(FULL_MASK, best_len, j + 1);
				if (nlen <= len) break;
				j++;
				len = nlen;
				off = __shfl_sync(FULL_MASK, best_off, j);
			}
			const int mp = base + j;
			const int limit = MATCH_END_LIMIT - mp;
			if (len >= SEARCH_CAP && len < limit) len = warp_extend(s, mp, mp - off, len, limit, lane);
			if (!emit(src, out, op, anchor, mp - anchor, off, len, lane)) {
				ok = false;
				break;
			}
			cursor = mp + len;
			anchor = cursor;
		}
	}
	if (ok) ok = emit(src, out, op, anchor, PAGE_SIZE - anchor, 0, 0, lane);
	__syncwarp();

	unsigned int len = ok ? (unsigned int)op : 0u;
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

// gz_spin keeps the stream busy for ns nanoseconds. The backend's fault
// injection launches it to simulate a hung kernel, so that the watchdog and
// the quarantine of a slot still owned by the device are tested for real.
extern "C" __global__ void gz_spin(unsigned long long ns) {
	unsigned long long start, now;
	asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
	do {
		asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
	} while (now - start < ns);
}
