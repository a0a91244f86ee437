// An LZ4 block compressor for exactly one 4 KiB page: liblz4's greedy
// LZ4_compress_fast parse (acceleration 1), specialised for swap pages so
// that it is faster than liblz4 at a better compression ratio.
//
// Swap pages are mostly arrays of 8-byte words: pointers that share their
// high bytes, small integers, zeros. LZ4 codes them as one short sequence
// per word or two (a few literal bytes, a match of 5 to 8 bytes), so the
// cost is in the sequences, not in the bytes:
//
//   - the hash covers 5 bytes, not liblz4's 4 for small inputs: fewer
//     candidates that match only 4 bytes (a 4-byte match saves one byte
//     and costs a sequence), so fewer and longer sequences. A 6-byte hash
//     is faster still but compresses worse than liblz4 at the daemon's
//     limit: more pages miss it and are stored raw;
//   - two neighbouring positions are probed per step, two independent
//     chains of loads, in a table of 4096 page offsets (8 KiB, cleared per
//     page), which stays in L1 with the page;
//   - a match is measured 16 bytes at once, and a short literal run is
//     copied 16 bytes at once, without a loop, when the output has room.
//
// The output is the standard block format (the last match starts at least
// 12 bytes before the end, the last 5 bytes are literals), so liblz4 or any
// LZ4 decoder reads it, and the GPU's output is read the same way. Every
// write is bounded by limit: the checks are liblz4's limitedOutput ones,
// exact lower bounds of the final length, so 0 means the page really does
// not fit.
//
// Inputs of other sizes, up to 64 KiB, go through the same code
// (gz_lz4_block), so that gzramd needs no other LZ4 compressor; pages get
// a copy compiled for their constant size.

#include "lz4page.h"

#include <string.h>
#if defined(__SSE2__)
#include <emmintrin.h>
#define GZ_SSE 1
#else
#define GZ_SSE 0
#endif

#define GZ_MINMATCH 4
#define GZ_MFLIMIT 12
#define GZ_LASTLITERALS 5
#define GZ_ML_BITS 4
#define GZ_ML_MASK 15
#define GZ_RUN_MASK 15
// Pairs of probes stride one position further apart after every
// 1<<GZ_SKIP_TRIGGER misses, as liblz4's acceleration does after 64.
#define GZ_SKIP_TRIGGER 5
// The room the fast sequence path needs: token, 16 literal bytes, offset,
// and the match length bytes that the exact check then bounds.
#define GZ_FAST_ROOM 32
#define GZ_HASHLOG GZ_LZ4_HASHLOG
#define GZ_PAGE GZ_LZ4_PAGE

#define likely(x) __builtin_expect(!!(x), 1)
#define unlikely(x) __builtin_expect(!!(x), 0)

static inline uint16_t rd16(const uint8_t *p) { uint16_t v; memcpy(&v, p, 2); return v; }
static inline uint32_t rd32(const uint8_t *p) { uint32_t v; memcpy(&v, p, 4); return v; }
static inline uint64_t rd64(const uint8_t *p) { uint64_t v; memcpy(&v, p, 8); return v; }
static inline void wr16(uint8_t *p, uint16_t v) { memcpy(p, &v, 2); }
static inline void wr32(uint8_t *p, uint32_t v) { memcpy(p, &v, 4); }
static inline void copy16(uint8_t *d, const uint8_t *s) { memcpy(d, s, 16); }

// gz_hash_word hashes the low 5 bytes of w, the bytes at a position read
// little-endian (liblz4's LZ4_hash5).
static inline unsigned gz_hash_word(uint64_t w) {
	return (unsigned)(((w << 24) * 889523592379ULL) >> (64 - GZ_HASHLOG));
}

static inline unsigned gz_hash(const uint8_t *p) { return gz_hash_word(rd64(p)); }

// gz_beyond_min returns how far n equal bytes reach beyond the minimum
// match. A match's first 4 bytes were found equal by an earlier read; when
// the page changes under the compressor (a late reader of a buffer being
// reused) a second read can find fewer, and n - GZ_MINMATCH would wrap to
// a length of 4 billion that writes far past the output. Such a page's
// result is garbage, but the writes stay within limit.
static inline unsigned gz_beyond_min(unsigned n) { return n > GZ_MINMATCH ? n - GZ_MINMATCH : 0; }

// gz_count returns how many bytes at ip equal those at match, up to limit.
static inline unsigned gz_count(const uint8_t *ip, const uint8_t *match, const uint8_t *limit) {
	const uint8_t *const start = ip;
	while (likely(ip < limit - 7)) {
		uint64_t diff = rd64(match) ^ rd64(ip);
		if (diff) return (unsigned)(ip - start) + (__builtin_ctzll(diff) >> 3);
		ip += 8;
		match += 8;
	}
	if (ip < limit - 3 && rd32(match) == rd32(ip)) { ip += 4; match += 4; }
	if (ip < limit - 1 && rd16(match) == rd16(ip)) { ip += 2; match += 2; }
	if (ip < limit && *match == *ip) ip++;
	return (unsigned)(ip - start);
}

// gz_literals sets the literal length in the token at token, writes its
// continuation bytes and the lit literals at anchor from op on, and
// returns where they end. The caller has checked that they fit.
static inline uint8_t *gz_literals(uint8_t *token, uint8_t *op, const uint8_t *anchor, unsigned lit) {
	if (lit >= GZ_RUN_MASK) {
		unsigned len = lit - GZ_RUN_MASK;
		*token = GZ_RUN_MASK << GZ_ML_BITS;
		for (; len >= 255; len -= 255) *op++ = 255;
		*op++ = (uint8_t)len;
	} else {
		*token = (uint8_t)(lit << GZ_ML_BITS);
	}
	memcpy(op, anchor, lit);
	return op + lit;
}

// gz_compress compresses the n bytes at src, 0 < n <= GZ_LZ4_MAX_INPUT
// (so that a page offset fits the table's 16 bits); always inlined, so
// that the page compressor is compiled with n the constant GZ_PAGE.
static inline __attribute__((always_inline)) int gz_compress(gz_lz4_ctx *ctx, const uint8_t *src, int n, uint8_t *dst, int limit) {
	const uint8_t *ip = src;
	const uint8_t *anchor = src;
	const uint8_t *const iend = src + n;
	uint8_t *op = dst;
	uint8_t *const olimit = dst + limit;
	uint16_t *const table = ctx->table;

	if (limit <= 0) return 0;
	// Too short for a match that ends the format's 12 bytes before the end.
	if (n < GZ_MFLIMIT + 1) goto last_literals;

	const uint8_t *const mflimit_plus_one = iend - GZ_MFLIMIT + 1;
	const uint8_t *const matchlimit = iend - GZ_LASTLITERALS;

	// Clearing costs less than tagging entries by page and checking the
	// tags, which lengthens the critical path of every probe. An empty
	// entry points at offset 0, a valid (if unlikely) candidate.
	memset(table, 0, sizeof ctx->table);
	table[gz_hash(ip)] = 0;
	ip++;

	for (;;) {
		const uint8_t *match;
		uint8_t *token;
		uint64_t diff; // the 8 bytes at match xor those at ip

		// Find a match: probe ip and ip+1 together. A candidate is
		// any earlier position of the page, so a stale or colliding
		// entry costs a failed compare and nothing else.
		{
			unsigned step = 2;
			unsigned probes = 2u << GZ_SKIP_TRIGGER;
			for (;;) {
				if (unlikely(ip + 1 >= mflimit_plus_one)) goto last_literals;
				uint64_t w0 = rd64(ip), w1 = rd64(ip + 1);
				unsigned h0 = gz_hash_word(w0), h1 = gz_hash_word(w1);
				unsigned c0 = table[h0];
				table[h0] = (uint16_t)(ip - src);
				unsigned c1 = table[h1];
				table[h1] = (uint16_t)(ip + 1 - src);
				uint64_t d0 = rd64(src + c0) ^ w0;
				uint64_t d1 = rd64(src + c1) ^ w1;
				if ((uint32_t)d0 == 0) {
					match = src + c0;
					diff = d0;
					break;
				}
				if ((uint32_t)d1 == 0) {
					match = src + c1;
					diff = d1;
					ip++;
					break;
				}
				ip += step;
				probes += 2;
				step = 2 * (probes >> (GZ_SKIP_TRIGGER + 1));
			}
		}

		// Extend it backwards over bytes that were skipped or whose
		// bucket held another position.
		if (unlikely(ip > anchor && match > src && ip[-1] == match[-1])) {
			do {
				ip--;
				match--;
			} while (ip > anchor && match > src && ip[-1] == match[-1]);
			diff = rd64(match) ^ rd64(ip);
		}

		{
			unsigned lit = (unsigned)(ip - anchor);
			token = op++;
			// The usual sequence, a short literal run with room to
			// spare, copies 16 bytes at once.
			if (likely(lit < GZ_RUN_MASK && op + GZ_FAST_ROOM <= olimit && ip + 16 <= matchlimit)) {
				*token = (uint8_t)(lit << GZ_ML_BITS);
				copy16(op, anchor);
				op += lit;
			} else {
				if (unlikely(op + lit + (2 + 1 + GZ_LASTLITERALS) + lit / 255 > olimit)) return 0;
				op = gz_literals(token, op, anchor, lit);
			}
		}

	next_match:
		wr16(op, (uint16_t)(ip - match));
		op += 2;

		{
			unsigned ml; // match length beyond GZ_MINMATCH
#if GZ_SSE
			if (likely(ip + 16 <= matchlimit)) {
				unsigned eq = (unsigned)_mm_movemask_epi8(_mm_cmpeq_epi8(
					_mm_loadu_si128((const __m128i *)ip), _mm_loadu_si128((const __m128i *)match)));
				if (likely(eq != 0xFFFF)) ml = gz_beyond_min((unsigned)__builtin_ctz(~eq));
				else ml = 16 - GZ_MINMATCH + gz_count(ip + 16, match + 16, matchlimit);
			} else
#endif
			// ip <= mflimit-1, so a length read from diff (at most 7)
			// ends by matchlimit; one of 8 or more is counted.
			if (likely(diff != 0)) {
				ml = gz_beyond_min((unsigned)(__builtin_ctzll(diff) >> 3));
			} else {
				ml = gz_count(ip + GZ_MINMATCH, match + GZ_MINMATCH, matchlimit);
			}
			ip += ml + GZ_MINMATCH;
			if (unlikely(op + (1 + GZ_LASTLITERALS) + (ml + 240) / 255 > olimit)) return 0;
			if (ml >= GZ_ML_MASK) {
				*token += GZ_ML_MASK;
				ml -= GZ_ML_MASK;
				wr32(op, 0xFFFFFFFF);
				while (ml >= 4 * 255) {
					op += 4;
					wr32(op, 0xFFFFFFFF);
					ml -= 4 * 255;
				}
				op += ml / 255;
				*op++ = (uint8_t)(ml % 255);
			} else {
				*token += (uint8_t)ml;
			}
		}

		anchor = ip;
		if (ip >= mflimit_plus_one) break;

		table[gz_hash(ip - 2)] = (uint16_t)(ip - 2 - src);

		// Try the position right after the match before searching: a
		// hit there needs no literals.
		{
			unsigned h = gz_hash(ip);
			const uint8_t *cand = src + table[h];
			table[h] = (uint16_t)(ip - src);
			diff = rd64(cand) ^ rd64(ip);
			if ((uint32_t)diff == 0) {
				match = cand;
				token = op++;
				*token = 0;
				goto next_match;
			}
		}
		ip++;
	}

last_literals:
	{
		unsigned run = (unsigned)(iend - anchor);
		if (op + run + 1 + (run + 255 - GZ_RUN_MASK) / 255 > olimit) return 0;
		uint8_t *token = op++;
		op = gz_literals(token, op, anchor, run);
	}
	return (int)(op - dst);
}

int gz_lz4_page(gz_lz4_ctx *ctx, const uint8_t *src, uint8_t *dst, int limit) {
	return gz_compress(ctx, src, GZ_PAGE, dst, limit);
}

int gz_lz4_block(gz_lz4_ctx *ctx, const uint8_t *src, int n, uint8_t *dst, int limit) {
	if (n <= 0 || n > GZ_LZ4_MAX_INPUT) return 0;
	return gz_compress(ctx, src, n, dst, limit);
}
