// An LZ4 block compressor for exactly one 4 KiB page: liblz4's greedy
// LZ4_compress_fast parse (acceleration 1), specialised so that it beats
// liblz4 on swap pages at a compression ratio at least as good:
//
//   - the hash covers 5 bytes, not liblz4's 4 for small inputs: fewer
//     candidates that match only 4 bytes, so fewer, longer sequences; on
//     memory pages that is both faster (sequences, not bytes, are the
//     cost) and a better ratio;
//   - a 12-bit table of page offsets, half of liblz4's, cleared per page;
//   - the candidate check loads 8 bytes, which for the usual short match
//     already gives its length;
//   - misses stride further after every 32, not 64, as liblz4 does.
//
// The output is the standard block format (the last match starts at least
// 12 bytes before the end, the last 5 bytes are literals), so liblz4 or any
// LZ4 decoder reads it. Every write is bounded by limit: the checks are
// liblz4's limitedOutput ones, which are exact lower bounds of the final
// length, so 0 means the page really does not fit.

#include "lz4page.h"

#include <string.h>

#define GZ_MINMATCH 4
#define GZ_MFLIMIT 12
#define GZ_LASTLITERALS 5
#define GZ_ML_BITS 4
#define GZ_ML_MASK 15
#define GZ_RUN_MASK 15
#define GZ_SKIP_TRIGGER 5
#define GZ_HASHLOG GZ_LZ4_HASHLOG
#define GZ_PAGE GZ_LZ4_PAGE

#define likely(x) __builtin_expect(!!(x), 1)
#define unlikely(x) __builtin_expect(!!(x), 0)

static inline uint16_t rd16(const uint8_t *p) { uint16_t v; memcpy(&v, p, 2); return v; }
static inline uint32_t rd32(const uint8_t *p) { uint32_t v; memcpy(&v, p, 4); return v; }
static inline uint64_t rd64(const uint8_t *p) { uint64_t v; memcpy(&v, p, 8); return v; }
static inline void wr16(uint8_t *p, uint16_t v) { memcpy(p, &v, 2); }
static inline void wr32(uint8_t *p, uint32_t v) { memcpy(p, &v, 4); }
static inline void copy8(uint8_t *d, const uint8_t *s) { memcpy(d, s, 8); }

// gz_hash hashes the 5 bytes at p (liblz4's LZ4_hash5).
static inline unsigned gz_hash(const uint8_t *p) {
	return (unsigned)(((rd64(p) << 24) * 889523592379ULL) >> (64 - GZ_HASHLOG));
}

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

int gz_lz4_page(gz_lz4_ctx *ctx, const uint8_t *src, uint8_t *dst, int limit) {
	const uint8_t *ip = src;
	const uint8_t *anchor = src;
	const uint8_t *const iend = src + GZ_PAGE;
	const uint8_t *const mflimit_plus_one = iend - GZ_MFLIMIT + 1;
	const uint8_t *const matchlimit = iend - GZ_LASTLITERALS;
	uint8_t *op = dst;
	uint8_t *const olimit = dst + limit;
	uint16_t *const table = ctx->table;
	unsigned forward_h;

	if (limit <= 0) return 0;

	// Clearing costs less than tagging entries by page and checking the
	// tags, which lengthens the critical path of every probe. An empty
	// entry points at offset 0, a valid (if unlikely) candidate.
	memset(table, 0, sizeof ctx->table);
	table[gz_hash(ip)] = 0;
	ip++;
	forward_h = gz_hash(ip);

	for (;;) {
		const uint8_t *match;
		uint8_t *token;
		uint64_t diff;

		// Find a match, striding one byte further after every
		// 1<<GZ_SKIP_TRIGGER misses.
		{
			const uint8_t *forward_ip = ip;
			unsigned step = 1;
			unsigned search_nb = 1u << GZ_SKIP_TRIGGER;
			for (;;) {
				unsigned h = forward_h;
				unsigned cur = (unsigned)(forward_ip - src);
				const uint8_t *cand = src + table[h];
				ip = forward_ip;
				forward_ip += step;
				step = search_nb++ >> GZ_SKIP_TRIGGER;
				if (unlikely(forward_ip > mflimit_plus_one)) goto last_literals;
				forward_h = gz_hash(forward_ip);
				table[h] = (uint16_t)cur;
				diff = rd64(cand) ^ rd64(ip);
				if ((uint32_t)diff == 0) {
					match = cand;
					break;
				}
			}
		}

		// Extend it backwards over bytes the stride skipped.
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
			if (unlikely(op + lit + (2 + 1 + GZ_LASTLITERALS) + lit / 255 > olimit)) return 0;
			if (lit >= GZ_RUN_MASK) {
				int len = (int)(lit - GZ_RUN_MASK);
				*token = GZ_RUN_MASK << GZ_ML_BITS;
				for (; len >= 255; len -= 255) *op++ = 255;
				*op++ = (uint8_t)len;
			} else {
				*token = (uint8_t)(lit << GZ_ML_BITS);
			}
			{
				uint8_t *d = op;
				const uint8_t *s = anchor;
				uint8_t *const e = op + lit;
				do {
					copy8(d, s);
					d += 8;
					s += 8;
				} while (d < e);
			}
			op += lit;
		}

	next_match:
		wr16(op, (uint16_t)(ip - match));
		op += 2;

		{
			unsigned ml;
			// ip <= mflimit-1, so a length from diff (at most 7) ends
			// by matchlimit; a match of 8 or more is counted with it.
			if (likely(diff != 0)) {
				ml = (unsigned)(__builtin_ctzll(diff) >> 3) - GZ_MINMATCH;
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

		// Try the position right after the match before searching.
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
		forward_h = gz_hash(++ip);
	}

last_literals:
	{
		unsigned run = (unsigned)(iend - anchor);
		if (op + run + 1 + (run + 255 - GZ_RUN_MASK) / 255 > olimit) return 0;
		if (run >= GZ_RUN_MASK) {
			unsigned acc = run - GZ_RUN_MASK;
			*op++ = GZ_RUN_MASK << GZ_ML_BITS;
			for (; acc >= 255; acc -= 255) *op++ = 255;
			*op++ = (uint8_t)acc;
		} else {
			*op++ = (uint8_t)(run << GZ_ML_BITS);
		}
		memcpy(op, anchor, run);
		op += run;
	}
	return (int)(op - dst);
}
