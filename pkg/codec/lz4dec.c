// An LZ4 block decoder for gzramd's pages: the standard block format, as
// liblz4's LZ4_decompress_safe reads it, checked so that no input, however
// malformed, makes it read or write outside the buffers it is given.
//
// A block is a run of sequences: a token (literal length, match length),
// the literals, a 2-byte offset back into the output, and the match
// copied from there; the last sequence is literals alone and ends the
// input. gzramd knows how long every block decodes (a page), so the block
// must fill the output exactly, and it must keep the format's end rules
// that liblz4 also checks: every match starts at least 12 bytes before
// the end and the last 5 bytes are literals. Offset 0 is refused, as the
// format says.
//
// Memory pages decode as many short sequences (a few literals, a match of
// 4 to 18 bytes), so the speed is in those: while at least GZ_FAST_IN
// bytes of input and GZ_FAST_OUT of output remain, a sequence with short
// lengths copies 16 literal bytes at once and its match in 8-byte steps
// (a repeated word, short or byte from a register) without any check but
// that of its offset; the margins make the over-copies land inside the
// buffers, where later bytes overwrite them. Long lengths and the last
// few sequences take the path that checks every length against what is
// left.

#include "lz4dec.h"

#include <stddef.h>
#include <string.h>

#define GZ_MINMATCH 4
#define GZ_MFLIMIT 12
#define GZ_LASTLITERALS 5
#define GZ_RUN_MASK 15
#define GZ_ML_MASK 15
// A short sequence reads at most 1+14+2 = 17 bytes of input (16 literal
// bytes at once); it writes at most 14 literals (16 at once) and a match
// of up to 18 bytes whose copy may run to 32: 46 bytes in all.
#define GZ_FAST_IN 32
#define GZ_FAST_OUT 64
// What a match copy may write past its end: see gz_copy_match.
#define GZ_COPY_OVER 32

#define likely(x) __builtin_expect(!!(x), 1)
#define unlikely(x) __builtin_expect(!!(x), 0)

static inline uint16_t rd16(const uint8_t *p) {
	uint16_t v;
	memcpy(&v, p, 2);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
	v = __builtin_bswap16(v);
#endif
	return v;
}
// rd16ne and rd32ne read in the machine's byte order: to repeat bytes.
static inline uint16_t rd16ne(const uint8_t *p) { uint16_t v; memcpy(&v, p, 2); return v; }
static inline uint32_t rd32ne(const uint8_t *p) { uint32_t v; memcpy(&v, p, 4); return v; }
static inline void copy4(uint8_t *d, const uint8_t *s) { memcpy(d, s, 4); }
static inline void copy8(uint8_t *d, const uint8_t *s) { memcpy(d, s, 8); }
static inline void copy16(uint8_t *d, const uint8_t *s) { memcpy(d, s, 16); }

// gz_read_len adds the length bytes at *ip (a byte of 255 means another
// follows) to *len and advances *ip past them; -1 when they run past iend
// or the length past any buffer gzramd decodes into. The sum cannot
// overflow 64 bits: it grows by at most 255 a byte of a shorter input.
static inline int gz_read_len(const uint8_t **ip, const uint8_t *iend, size_t *len) {
	const uint8_t *p = *ip;
	uint64_t sum = *len;
	unsigned b;
	do {
		if (unlikely(p >= iend)) return -1;
		b = *p++;
		sum += b;
	} while (b == 255);
	if (unlikely(sum > INT32_MAX)) return -1;
	*len = (size_t)sum;
	*ip = p;
	return 0;
}

// gz_copy_match writes the match of the end-op bytes at offset off behind
// op, which may overlap them (a short offset repeats a pattern). It may
// write up to GZ_COPY_OVER-1 bytes past end, and reads only bytes before
// what it writes.
static inline void gz_copy_match(uint8_t *op, size_t off, uint8_t *const end) {
	const uint8_t *match = op - off;
	if (likely(off >= 16)) {
		// The second half reads what the first may have just written.
		do {
			copy16(op, match);
			copy16(op + 16, match + 16);
			op += 32;
			match += 32;
		} while (op < end);
		return;
	}
	// A pattern of off bytes: write its first 16 bytes, then store them
	// again every step bytes, the largest multiple of off up to 16. The
	// loop then loads nothing, so no load waits for the stores before it.
	static const uint8_t step16[16] = {0, 16, 16, 15, 16, 15, 12, 14, 16, 9, 10, 11, 12, 13, 14, 15};
	uint8_t pattern[16];
	if ((off & (off - 1)) == 0) {
		// 1, 2, 4 or 8 (runs of a byte, a short or a word): the pattern
		// comes from one load of the bytes before op.
		uint64_t w;
		switch (off) {
		case 1: w = 0x0101010101010101ull * match[0]; break;
		case 2: w = 0x0001000100010001ull * rd16ne(match); break;
		case 4: w = 0x0000000100000001ull * rd32ne(match); break;
		default: memcpy(&w, match, 8); break;
		}
		memcpy(pattern, &w, 8);
		memcpy(pattern + 8, &w, 8);
		for (; op < end; op += 16) copy16(op, pattern);
		return;
	}
	uint8_t *const start = op;
	if (off < 8) {
		// Byte steps for the first 4, then match ends up a multiple of
		// off, and at least 8, behind op (liblz4's tables for the same
		// trick).
		static const uint8_t inc[8] = {0, 1, 2, 1, 0, 4, 4, 4};
		static const int8_t dec[8] = {0, 0, 0, -1, -4, 1, 2, 3};
		op[0] = match[0];
		op[1] = match[1];
		op[2] = match[2];
		op[3] = match[3];
		match += inc[off];
		copy4(op + 4, match);
		match -= dec[off];
	} else {
		copy8(op, match);
		match += 8;
	}
	copy8(op + 8, match);
	if (end <= start + 16) return;
	copy16(pattern, start);
	const size_t step = step16[off];
	for (uint8_t *p = start + step; p < end; p += step) copy16(p, pattern);
}

// gz_decode is gz_lz4_decode, stopping with success once at least want
// bytes are out when want < dstlen (gz_lz4_decode_prefix). Each entry
// point gets its own copy, so the full decode pays nothing for the check.
static inline __attribute__((always_inline)) int gz_decode(const uint8_t *const src, int srclen, uint8_t *const dst, int dstlen, int want) {
	if (src == NULL || dst == NULL || srclen <= 0 || dstlen < 0) return -1;
	const uint8_t *ip = src;
	const uint8_t *const iend = src + srclen;
	uint8_t *op = dst;
	uint8_t *const oend = dst + dstlen;
	uint8_t *const stop = want < dstlen ? dst + (want > 0 ? want : 0) : NULL;
	// The fast path runs while ip < ifast and op < ofast (where a buffer
	// is too short for it, the limit is its start).
	const uint8_t *const ifast = srclen >= GZ_FAST_IN ? iend - GZ_FAST_IN + 1 : src;
	uint8_t *const ofast = dstlen >= GZ_FAST_OUT ? oend - GZ_FAST_OUT + 1 : dst;

	for (;;) {
		unsigned token;
		size_t lit, ml, off;

		if (stop != NULL && op >= stop) return 0;
		if (likely(ip < ifast && op < ofast)) {
			token = *ip++;
			lit = token >> 4;
			ml = token & GZ_ML_MASK;
			if (unlikely(lit == GZ_RUN_MASK)) goto literals;
			copy16(op, ip);
			op += lit;
			ip += lit;
			off = rd16(ip);
			ip += 2;
			// off-1 wraps for offset 0.
			if (unlikely(off - 1 >= (size_t)(op - dst))) return -1;
			if (unlikely(ml == GZ_ML_MASK)) goto match;
			// The match ends at least GZ_FAST_OUT-14-18 bytes before
			// oend, inside both end rules. Its 4 to 18 bytes are copied
			// in three fixed steps when they do not overlap by 8; a
			// repeated word (offset 8, the most common short one) from
			// one load.
			ml += GZ_MINMATCH;
			if (off == 8) {
				uint64_t w;
				memcpy(&w, op - 8, 8);
				memcpy(op, &w, 8);
				memcpy(op + 8, &w, 8);
				memcpy(op + 16, &w, 2);
			} else if (likely(off > 8)) {
				const uint8_t *m = op - off;
				copy8(op, m);
				copy8(op + 8, m + 8);
				memcpy(op + 16, m + 16, 2);
			} else {
				gz_copy_match(op, off, op + ml);
			}
			op += ml;
			continue;
		}

		if (unlikely(ip >= iend)) return -1;
		token = *ip++;
		lit = token >> 4;
		ml = token & GZ_ML_MASK;
	literals:
		if (lit == GZ_RUN_MASK && gz_read_len(&ip, iend, &lit) != 0) return -1;
		if (unlikely(lit > (size_t)(iend - ip) || lit > (size_t)(oend - op))) return -1;
		if (likely(lit + 32 <= (size_t)(iend - ip) && lit + 32 <= (size_t)(oend - op))) {
			for (size_t i = 0; i < lit; i += 32) {
				copy16(op + i, ip + i);
				copy16(op + i + 16, ip + i + 16);
			}
		} else {
			memcpy(op, ip, lit);
		}
		op += lit;
		ip += lit;
		if (ip == iend) return op == oend ? 0 : -1; // the last sequence
		if (unlikely((size_t)(oend - op) < GZ_MFLIMIT || (size_t)(iend - ip) < 2)) return -1;
		off = rd16(ip);
		ip += 2;
		if (unlikely(off - 1 >= (size_t)(op - dst))) return -1;
	match:
		// Here oend-op >= GZ_MFLIMIT, so the subtraction below holds.
		if (ml == GZ_ML_MASK && gz_read_len(&ip, iend, &ml) != 0) return -1;
		ml += GZ_MINMATCH;
		if (unlikely(ml > (size_t)(oend - op) - GZ_LASTLITERALS)) return -1;
		if (likely(ml + GZ_COPY_OVER <= (size_t)(oend - op))) {
			gz_copy_match(op, off, op + ml);
		} else {
			// A match near the end (a long run of zeros to the end of
			// the page, say): in steps up to where their over-copy
			// would pass oend, then in exact ones.
			uint8_t *p = op;
			uint8_t *const end = op + ml;
			if ((size_t)(oend - op) > GZ_COPY_OVER) {
				p = oend - GZ_COPY_OVER;
				gz_copy_match(op, off, p);
			}
			const uint8_t *m = p - off;
			if (off >= 8) {
				for (; end - p >= 8; p += 8, m += 8) copy8(p, m);
			}
			while (p < end) *p++ = *m++;
		}
		op += ml;
	}
}

int gz_lz4_decode(const uint8_t *src, int srclen, uint8_t *dst, int dstlen) {
	return gz_decode(src, srclen, dst, dstlen, dstlen);
}

int gz_lz4_decode_prefix(const uint8_t *src, int srclen, uint8_t *dst, int dstlen, int want) {
	return gz_decode(src, srclen, dst, dstlen, want);
}
