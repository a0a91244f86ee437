// The zstd frame decoder of zstddec.c, in C that builds for the host
// (included by zstddec.c) and for the GPU (kernels/zstd_dec.cu, which
// decodes the fast tier's zstd pages before the dense tier recompresses
// them): RFC 8878, without libzstd.
//
// The dense tier stores four pages as one frame of one block, which
// libzstd can only decode whole: a read of one page paid for four. This
// decoder executes a block's sequences only until the output holds the
// bytes the read wants, and keeps what every frame costs before its
// first byte small, as a frame here is only 16 KiB: Huffman tables of a
// symbol a lookup, sized to the code's longest length; FSE tables built
// only for the modes a block names, the predefined ones built once (on
// the GPU, where nothing is built at start, as a block names them).
//
// It reads every frame the format allows but skippable ones, and frames
// with a dictionary when it is not given theirs (a dictionary's tables are
// built once, gz_zdict_load, and its content is read where it lies); those,
// literals of a block longer than its buffer, and anything it finds
// malformed it returns as errors, on which the caller decodes with libzstd
// instead. So a frame it misreads as malformed
// costs time, never data; what it must never do is decode a frame to
// other bytes than libzstd, or touch memory outside its buffers, which
// every length and offset is checked against.
//
// It does not check the content checksum: a read stops before the frame's
// end, and the frames come from gzramd's own memory.
//
// The includer includes zstddec.h and <string.h> first (on the GPU, the
// CUDA runtime's memcpy and memset), and may set ZD_LIT_MAX. The header
// is C99 and C++ alike: no compound literals, no designated initializers.

#ifdef __CUDACC__
// A decoder is one thread's (kernels/zstd_dec.cu: lane 0 of a warp a
// page). Its tables and the builders' temporaries are in the block's
// shared memory, which a thread's local arrays would otherwise take
// from device memory for every thread the GPU can hold.
#define ZD_INLINE static __device__ __forceinline__
#define ZD_TABLE static __device__ const
#define ZD_TEMP(decl) __shared__ decl
#else
// Every function of the decoder is inlined into the two builds of it in
// zstddec.c: the plain one, and, on x86-64 processors with BMI2, one
// whose shifts by a register's count take any register (shlx, shrx),
// which the bit readers' chains of shifts need: 10-15 % off a dense
// frame.
#define ZD_INLINE static inline __attribute__((always_inline))
#define ZD_TABLE static const
#define ZD_TEMP(decl) decl
// The predefined FSE tables are built once, at start (zstddec.c).
#define ZD_PREBUILT 1
#endif

#define likely(x) __builtin_expect(!!(x), 1)
#define unlikely(x) __builtin_expect(!!(x), 0)

// ZD_DICTS says whether frames with a dictionary are read: on the host.
// The GPU decodes the fast tier's pages, which have none, and its code
// stays as it was without them.
#ifdef __CUDACC__
#define ZD_DICTS 0
#else
#define ZD_DICTS 1
#endif

#define ZD_MAGIC 0xFD2FB528u
#define ZD_BLOCK_MAX (128 << 10)
// A block's literals are decoded whole into z; the dense tier's frames
// and objects' blocks of a page hold 16 KiB at most. A block with more
// goes to libzstd: every context holds z, and a larger buffer would cost
// 48 KiB a context for frames gzramd does not write.
#ifndef ZD_LIT_MAX
#define ZD_LIT_MAX (16 << 10)
#endif
// Literals are copied 16 bytes at a time, past their end.
#define ZD_LIT_SLACK 32
// A sequence whose literals and match end this far before the output's
// end is copied in 16- and 8-byte steps that may write past them.
#define ZD_WILD 32

#define ZD_HUF_LOG 11
#define ZD_LL_LOG 9
#define ZD_ML_LOG 9
#define ZD_OF_LOG 8
#define ZD_LL_MAX 35
#define ZD_ML_MAX 52
#define ZD_OF_MAX 31

// A state of an FSE table for sequences: the symbol's baseline and extra
// bits (for Huffman weights, the symbol itself), and the next state's
// base and bits to read.
typedef struct {
	uint16_t next;
	uint8_t add;
	uint8_t nb;
	uint32_t base;
} zd_sym;

// zd_sym_of is the state of a symbol of baseline base and add extra bits,
// its next state's fields zero.
ZD_INLINE zd_sym zd_sym_of(uint32_t base, uint8_t add) {
	zd_sym e;
	e.next = 0;
	e.add = add;
	e.nb = 0;
	e.base = base;
	return e;
}

struct gz_zdec {
	// A Huffman table entry is the symbol << 8 and its code's length: in
	// the low byte, the length is a shift count as it is.
	uint16_t huf[1 << ZD_HUF_LOG];
	zd_sym ll[1 << ZD_LL_LOG], of[1 << ZD_OF_LOG], ml[1 << ZD_ML_LOG];
	uint8_t lit[ZD_LIT_MAX + ZD_LIT_SLACK];
};

// A zstd dictionary (RFC 8878, section 5) as the decoder uses it: its
// entropy tables, built once, which a frame's first blocks may repeat, its
// repeat offsets, and its content, which the frame's matches may reach
// back into as if it preceded the frame's output.
struct gz_zdict {
	uint16_t huf[1 << ZD_HUF_LOG];
	zd_sym ll[1 << ZD_LL_LOG], of[1 << ZD_OF_LOG], ml[1 << ZD_ML_LOG];
	unsigned log[3]; // literal lengths, offsets, match lengths
	unsigned huflog;
	uint32_t rep[3];
	uint32_t id;
	const uint8_t *content;
	size_t contentlen;
};

// A frame's state besides z's tables: which tables the last block used,
// for the next block's repeat modes (z's own, or a dictionary's), and the
// dictionary content its matches may reach into.
typedef struct {
	const zd_sym *t[3]; // literal lengths, offsets, match lengths
	unsigned log[3];
	const uint16_t *huf;
	unsigned huflog; // 0: no Huffman table yet
	uint32_t rep[3];
	const uint8_t *dict; // the dictionary's content, dictlen bytes
	size_t dictlen;
} zd_frame;

ZD_INLINE uint64_t rd64(const uint8_t *p) {
	uint64_t v;
	memcpy(&v, p, 8);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
	v = __builtin_bswap64(v);
#endif
	return v;
}

ZD_INLINE void copy8(uint8_t *d, const uint8_t *s) { memcpy(d, s, 8); }
ZD_INLINE void copy16(uint8_t *d, const uint8_t *s) { memcpy(d, s, 16); }

#ifdef __CUDA_ARCH__
ZD_INLINE unsigned highbit(uint32_t v) { return 31 - (unsigned)__clz(v); }
#else
ZD_INLINE unsigned highbit(uint32_t v) { return 31 - (unsigned)__builtin_clz(v); }
#endif

// The baselines and extra bits of literal and match length codes.
ZD_TABLE uint32_t ll_base[ZD_LL_MAX + 1] = {
	0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15,
	16, 18, 20, 22, 24, 28, 32, 40, 48, 64, 128, 256, 512, 1024, 2048, 4096,
	8192, 16384, 32768, 65536};
ZD_TABLE uint8_t ll_bits[ZD_LL_MAX + 1] = {
	0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
	1, 1, 1, 1, 2, 2, 3, 3, 4, 6, 7, 8, 9, 10, 11, 12,
	13, 14, 15, 16};
ZD_TABLE uint32_t ml_base[ZD_ML_MAX + 1] = {
	3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18,
	19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33, 34,
	35, 37, 39, 41, 43, 47, 51, 59, 67, 83, 99, 131, 259, 515, 1027, 2051,
	4099, 8195, 16387, 32771, 65539};
ZD_TABLE uint8_t ml_bits[ZD_ML_MAX + 1] = {
	0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
	0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
	1, 1, 1, 1, 2, 2, 3, 3, 4, 4, 5, 7, 8, 9, 10, 11,
	12, 13, 14, 15, 16};
ZD_TABLE uint32_t of_base[ZD_OF_MAX + 1] = {
	1u << 0, 1u << 1, 1u << 2, 1u << 3, 1u << 4, 1u << 5, 1u << 6, 1u << 7,
	1u << 8, 1u << 9, 1u << 10, 1u << 11, 1u << 12, 1u << 13, 1u << 14, 1u << 15,
	1u << 16, 1u << 17, 1u << 18, 1u << 19, 1u << 20, 1u << 21, 1u << 22, 1u << 23,
	1u << 24, 1u << 25, 1u << 26, 1u << 27, 1u << 28, 1u << 29, 1u << 30, 1u << 31};
ZD_TABLE uint8_t of_bits[ZD_OF_MAX + 1] = {
	0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15,
	16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31};

// The predefined distributions (RFC 8878, 3.1.1.3.2.2).
ZD_TABLE int16_t ll_pre_norm[ZD_LL_MAX + 1] = {
	4, 3, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 1, 1, 1,
	2, 2, 2, 2, 2, 2, 2, 2, 2, 3, 2, 1, 1, 1, 1, 1,
	-1, -1, -1, -1};
ZD_TABLE int16_t ml_pre_norm[ZD_ML_MAX + 1] = {
	1, 4, 3, 2, 2, 2, 2, 2, 2, 1, 1, 1, 1, 1, 1, 1,
	1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1,
	1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, -1, -1,
	-1, -1, -1, -1, -1};
ZD_TABLE int16_t of_pre_norm[29] = {
	1, 1, 1, 1, 1, 1, 2, 2, 2, 1, 1, 1, 1, 1, 1, 1,
	1, 1, 1, 1, 1, 1, 1, 1, -1, -1, -1, -1, -1};
#ifdef ZD_PREBUILT
static zd_sym ll_pre[64], ml_pre[64], of_pre[32];
#endif

// zd_build builds the decoding table of 1<<log states for the normalized
// counts norm[0..maxsym] (their absolute values summing to 1<<log, which
// the caller has checked), with each symbol's baseline and extra bits from
// base and bits, or the symbol itself without them.
ZD_INLINE int zd_build(zd_sym *t, const int16_t *norm, unsigned maxsym, unsigned log,
		const uint32_t *base, const uint8_t *bits) {
	unsigned size = 1u << log;
	int high = (int)size - 1;
	ZD_TEMP(uint16_t next[ZD_ML_MAX + 1]);
	ZD_TEMP(uint8_t sym[1 << ZD_LL_LOG]);
	for (unsigned s = 0; s <= maxsym; s++) {
		if (norm[s] == -1) {
			if (high < 0) return -1;
			sym[high--] = (uint8_t)s;
			next[s] = 1;
		} else {
			next[s] = (uint16_t)norm[s];
		}
	}
	unsigned step = (size >> 1) + (size >> 3) + 3, mask = size - 1, pos = 0;
	if (high == (int)size - 1) {
		// No symbol of probability "less than 1": the positions the
		// spread visits are k*step for k in order, none skipped, so the
		// symbols repeated by their counts, in order, go to them in turn,
		// without a loop of a symbol's count.
		ZD_TEMP(uint8_t run[(1 << ZD_LL_LOG) + 8]);
		unsigned n = 0;
		for (unsigned s = 0; s <= maxsym; s++) {
			uint64_t v = (uint64_t)s * 0x0101010101010101ull;
			if (norm[s] < 0 || n + (unsigned)norm[s] > size) return -1;
			for (int i = 0; i < norm[s]; i += 8) memcpy(run + n + i, &v, 8);
			n += (unsigned)norm[s];
		}
		if (n != size) return -1;
		for (unsigned k = 0; k < size; k++) {
			sym[pos] = run[k];
			pos = (pos + step) & mask;
		}
	} else {
		for (unsigned s = 0; s <= maxsym; s++) {
			for (int i = 0; i < norm[s]; i++) {
				sym[pos] = (uint8_t)s;
				do pos = (pos + step) & mask;
				while ((int)pos > high);
			}
		}
	}
	if (pos != 0) return -1;
	// Each state is its symbol's entry with the next state's fields
	// filled in: one 8-byte store.
	ZD_TEMP(zd_sym sym0[ZD_ML_MAX + 1]);
	for (unsigned s = 0; s <= maxsym; s++)
		sym0[s] = zd_sym_of(base ? base[s] : s, bits ? bits[s] : 0);
	for (unsigned u = 0; u < size; u++) {
		unsigned s = sym[u];
		unsigned n = next[s]++;
		unsigned nb = log - highbit(n);
		zd_sym e = sym0[s];
		e.nb = (uint8_t)nb;
		e.next = (uint16_t)((n << nb) - size);
		t[u] = e;
	}
	return 0;
}

// zd_rd32z reads 4 bytes little-endian at p, those at or past end as 0.
ZD_INLINE uint32_t zd_rd32z(const uint8_t *p, const uint8_t *end) {
	uint32_t v = 0;
	if (likely(end - p >= 4)) {
		memcpy(&v, p, 4);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
		v = __builtin_bswap32(v);
#endif
		return v;
	}
	for (int i = 0; i < 4 && p + i < end; i++) v |= (uint32_t)p[i] << (8 * i);
	return v;
}

// zd_fse_header reads the FSE table description at [p, p+n) into norm,
// for symbols up to *maxsym and a table of up to 1<<maxlog states. It sets
// *maxsym and *log to the table's and returns the bytes it took, or -1.
ZD_INLINE int zd_fse_header(int16_t *norm, unsigned *maxsym, unsigned *log, unsigned maxlog,
		const uint8_t *p, size_t n) {
	const uint8_t *end = p + n;
	if (n < 1) return -1;
	size_t bit = 4;
	unsigned acc = (p[0] & 15) + 5;
	if (acc > maxlog) return -1;
	int remaining = (1 << acc) + 1, threshold = 1 << acc, nb = (int)acc + 1;
	unsigned s = 0, limit = *maxsym;
	while (remaining > 1) {
		if (s > limit || (bit >> 3) >= n) return -1;
		uint32_t v = zd_rd32z(p + (bit >> 3), end) >> (bit & 7);
		int max = (2 * threshold - 1) - remaining;
		int count;
		if ((int)(v & (uint32_t)(threshold - 1)) < max) {
			count = (int)(v & (uint32_t)(threshold - 1));
			bit += (size_t)nb - 1;
		} else {
			count = (int)(v & (uint32_t)(2 * threshold - 1));
			if (count >= threshold) count -= max;
			bit += (size_t)nb;
		}
		count--;
		remaining -= count < 0 ? -count : count;
		norm[s++] = (int16_t)count;
		if (count == 0) {
			for (;;) {
				if ((bit >> 3) >= n) return -1;
				unsigned r = (zd_rd32z(p + (bit >> 3), end) >> (bit & 7)) & 3;
				bit += 2;
				for (unsigned k = 0; k < r; k++) {
					if (s > limit) return -1;
					norm[s++] = 0;
				}
				if (r != 3) break;
			}
		}
		if (remaining < 1) return -1;
		while (remaining < threshold) {
			nb--;
			threshold >>= 1;
		}
	}
	if (remaining != 1 || s == 0) return -1;
	size_t used = (bit + 7) >> 3;
	if (used > n) return -1;
	*maxsym = s - 1;
	*log = acc;
	return (int)used;
}

// A backward bit stream (RFC 8878, 4.1): read from its last byte, whose
// highest set bit marks where it starts, towards its first. c holds the
// bits not yet read from the top down, with zeros below them, so that a
// read is two shifts: used counts the bits of the 8 bytes at p read so
// far. Past 64 the stream was read beyond its first byte, which is an
// error, caught where the stream ends; such reads give zeros, and table
// indexes stay within their tables.
typedef struct {
	uint64_t c;
	unsigned used;
	const uint8_t *p, *start;
} zd_br;

ZD_INLINE int zd_br_init(zd_br *b, const uint8_t *s, size_t n) {
	if (n < 1 || s[n - 1] == 0) return -1;
	unsigned hb = highbit(s[n - 1]);
	b->start = s;
	if (n >= 8) {
		b->p = s + n - 8;
		b->used = 8 - hb;
		b->c = rd64(b->p) << b->used;
	} else {
		uint64_t c = 0;
		for (size_t i = 0; i < n; i++) c |= (uint64_t)s[i] << (8 * i);
		b->p = s;
		b->used = 8 - hb + (unsigned)(8 - n) * 8;
		b->c = b->used < 64 ? c << b->used : 0;
	}
	return 0;
}

// zd_br_read reads nb bits, 0 to 32.
ZD_INLINE uint32_t zd_br_read(zd_br *b, unsigned nb) {
	uint32_t v = (uint32_t)((b->c >> 1) >> (63 - nb));
	b->c <<= nb;
	b->used += nb;
	return v;
}

// zd_br_reload moves down the stream so that used is below 8 again, or as
// far as the stream's first byte lets it. It returns 1 when the stream
// has been read past its start.
ZD_INLINE int zd_br_reload(zd_br *b) {
	if (likely(b->p >= b->start + 8)) {
		b->p -= b->used >> 3;
		b->used &= 7;
		b->c = rd64(b->p) << b->used;
		return 0;
	}
	if (unlikely(b->used > 64)) return 1;
	size_t nb = b->used >> 3;
	if (nb > (size_t)(b->p - b->start)) nb = (size_t)(b->p - b->start);
	if (nb == 0) return 0;
	b->p -= nb;
	b->used -= (unsigned)nb * 8;
	b->c = rd64(b->p) << b->used;
	return 0;
}

ZD_INLINE int zd_br_done(const zd_br *b) { return b->p == b->start && b->used == 64; }

// zd_fse_weights decodes the FSE-compressed Huffman weights at [p, p+n)
// into w and returns how many, or -1.
ZD_INLINE int zd_fse_weights(uint8_t *w, const uint8_t *p, size_t n) {
	int16_t norm[16];
	unsigned maxsym = 15, log;
	ZD_TEMP(zd_sym t[1 << 6]);
	int h = zd_fse_header(norm, &maxsym, &log, 6, p, n);
	if (h < 0 || zd_build(t, norm, maxsym, log, NULL, NULL) < 0) return -1;
	zd_br b;
	if (zd_br_init(&b, p + h, n - (size_t)h) < 0) return -1;
	unsigned s1 = zd_br_read(&b, log), s2 = zd_br_read(&b, log);
	int k = 0;
	if (zd_br_reload(&b)) return -1;
	// Far from the stream's start, 8 weights a reload (48 bits at most)
	// cannot read past it.
	while (b.p >= b.start + 8 && k <= 253 - 8) {
		b.p -= b.used >> 3;
		b.used &= 7;
		b.c = rd64(b.p) << b.used;
		for (int i = 0; i < 4; i++) {
			w[k++] = (uint8_t)t[s1].base;
			s1 = t[s1].next + zd_br_read(&b, t[s1].nb);
			w[k++] = (uint8_t)t[s2].base;
			s2 = t[s2].next + zd_br_read(&b, t[s2].nb);
		}
	}
	for (;;) {
		if (k > 253) return -1;
		w[k++] = (uint8_t)t[s1].base;
		s1 = t[s1].next + zd_br_read(&b, t[s1].nb);
		if (zd_br_reload(&b)) {
			w[k++] = (uint8_t)t[s2].base;
			break;
		}
		if (k > 253) return -1;
		w[k++] = (uint8_t)t[s2].base;
		s2 = t[s2].next + zd_br_read(&b, t[s2].nb);
		if (zd_br_reload(&b)) {
			w[k++] = (uint8_t)t[s1].base;
			break;
		}
		s1 &= (1u << log) - 1;
		s2 &= (1u << log) - 1;
	}
	return k;
}

// zd_huf_table reads the Huffman tree description at [p, p+n) into z's
// table and returns the bytes it took, or -1; *log is the longest code.
ZD_INLINE int zd_huf_table(gz_zdec *z, unsigned *log, const uint8_t *p, size_t n) {
	ZD_TEMP(uint8_t w[256]);
	int nw, used;
	if (n < 1) return -1;
	if (p[0] >= 128) {
		nw = p[0] - 127;
		used = 1 + (nw + 1) / 2;
		if ((size_t)used > n) return -1;
		for (int i = 0; i < nw; i++) w[i] = (i & 1) ? p[1 + i / 2] & 15 : p[1 + i / 2] >> 4;
	} else {
		used = 1 + p[0];
		if ((size_t)used > n) return -1;
		nw = zd_fse_weights(w, p + 1, p[0]);
		if (nw < 0) return -1;
	}
	uint32_t total = 0, count[ZD_HUF_LOG + 2] = {0};
	for (int i = 0; i < nw; i++) {
		if (w[i] > ZD_HUF_LOG) return -1;
		if (w[i]) total += 1u << (w[i] - 1);
		count[w[i]]++;
	}
	if (total == 0) return -1;
	unsigned max = highbit(total) + 1;
	if (max > ZD_HUF_LOG) return -1;
	uint32_t left = (1u << max) - total;
	if (left & (left - 1)) return -1;
	w[nw] = (uint8_t)(highbit(left) + 1);
	count[w[nw]]++;
	nw++;
	// Symbols sorted by weight first, so that each weight's entries are
	// written by loops of one length: a loop a symbol of a length its
	// weight says mispredicts on most symbols.
	uint32_t first[ZD_HUF_LOG + 2], at = 0;
	ZD_TEMP(uint8_t sorted[256]);
	for (unsigned k = 0; k <= max; k++) {
		first[k] = at;
		at += count[k];
	}
	for (int s = 0; s < nw; s++) sorted[first[w[s]]++] = (uint8_t)s;
	uint16_t *e = z->huf;
	at = count[0];
	for (unsigned k = 1; k <= max; k++) {
		uint16_t nb = (uint16_t)(max + 1 - k);
		const uint8_t *sym = sorted + at, *end = sym + count[k];
		at += count[k];
		switch (k) {
		case 1:
			for (; sym < end; sym++) *e++ = (uint16_t)(*sym << 8 | nb);
			break;
		case 2:
			for (; sym < end; sym++, e += 2) e[0] = e[1] = (uint16_t)(*sym << 8 | nb);
			break;
		default:
			for (; sym < end; sym++) {
				uint64_t e4 = (uint64_t)(*sym << 8 | nb) * 0x0001000100010001ull;
				for (uint32_t i = 0; i < 1u << (k - 1); i += 4, e += 4) memcpy(e, &e4, 8);
			}
		}
	}
	*log = max;
	return used;
}

// zd_huf_fast decodes symbols 4 at a time while the stream is at least 8
// bytes from its start and 4 symbols remain, returning where it stopped.
#define ZD_HUF_STEP(c, used, o, t, log) \
	do { \
		unsigned e_ = (t)[(c) >> (64 - (log))]; \
		*(o)++ = (uint8_t)(e_ >> 8); \
		(c) <<= e_ & 63; \
		(used) += e_ & 255; \
	} while (0)

// zd_huf_tail decodes the symbols of [o, e) one by one, reloading before
// each, and checks that they end the stream exactly.
ZD_INLINE int zd_huf_tail(zd_br *b, uint8_t *o, uint8_t *e, const uint16_t *t, unsigned log) {
	while (o < e) {
		if (zd_br_reload(b)) return -1;
		unsigned v = t[b->c >> (64 - log)];
		*o++ = (uint8_t)(v >> 8);
		b->c <<= v & 63;
		b->used += v & 255;
	}
	if (zd_br_reload(b) || !zd_br_done(b)) return -1;
	return 0;
}

// zd_huf_finish decodes the symbols of [o, e) from b, 4 a reload while
// the stream is far from its start.
ZD_INLINE int zd_huf_finish(zd_br *bp, uint8_t *o, uint8_t *e, const uint16_t *t, unsigned log) {
	zd_br b = *bp;
	while (e - o >= 4 && b.p >= b.start + 8) {
		b.p -= b.used >> 3;
		b.used &= 7;
		b.c = rd64(b.p) << b.used;
		ZD_HUF_STEP(b.c, b.used, o, t, log);
		ZD_HUF_STEP(b.c, b.used, o, t, log);
		ZD_HUF_STEP(b.c, b.used, o, t, log);
		ZD_HUF_STEP(b.c, b.used, o, t, log);
	}
	return zd_huf_tail(&b, o, e, t, log);
}

ZD_INLINE int zd_huf1(uint8_t *o, size_t cnt, const uint8_t *s, size_t n, const uint16_t *t, unsigned log) {
	zd_br b;
	if (zd_br_init(&b, s, n) < 0) return -1;
	return zd_huf_finish(&b, o, o + cnt, t, log);
}

// zd_huf4 decodes the 4 streams at [s, s+n) (after their jump table) into
// o[0..cnt), interleaved while all four are far from their starts.
ZD_INLINE int zd_huf4(uint8_t *o, size_t cnt, const uint8_t *s, size_t n, const uint16_t *t, unsigned log) {
	if (n < 10) return -1;
	size_t l1 = s[0] | (size_t)s[1] << 8, l2 = s[2] | (size_t)s[3] << 8, l3 = s[4] | (size_t)s[5] << 8;
	if (l1 + l2 + l3 > n - 6) return -1;
	size_t l4 = n - 6 - l1 - l2 - l3;
	size_t seg = (cnt + 3) / 4;
	if (3 * seg > cnt) return -1;
	zd_br b[4];
	const uint8_t *at = s + 6;
	if (zd_br_init(&b[0], at, l1) < 0 || zd_br_init(&b[1], at + l1, l2) < 0 ||
		zd_br_init(&b[2], at + l1 + l2, l3) < 0 || zd_br_init(&b[3], at + l1 + l2 + l3, l4) < 0)
		return -1;
	uint8_t *o0 = o, *o1 = o + seg, *o2 = o + 2 * seg, *o3 = o + 3 * seg;
	uint8_t *e3 = o + cnt;
	// The four streams in locals of their own, for registers.
	uint64_t c0 = b[0].c, c1 = b[1].c, c2 = b[2].c, c3 = b[3].c;
	unsigned u0 = b[0].used, u1 = b[1].used, u2 = b[2].used, u3 = b[3].used;
	const uint8_t *p0 = b[0].p, *p1 = b[1].p, *p2 = b[2].p, *p3 = b[3].p;
	const uint8_t *s0 = b[0].start + 8, *s1 = b[1].start + 8, *s2 = b[2].start + 8, *s3 = b[3].start + 8;
	// As many symbols a reload as 57 bits hold: the reload's load is in
	// every stream's chain of dependent steps. Stream 4's segment is the
	// shortest: when it has that many left, all have.
	int per = 57 / (int)log;
	while (e3 - o3 >= per && p0 >= s0 && p1 >= s1 && p2 >= s2 && p3 >= s3) {
		p0 -= u0 >> 3, p1 -= u1 >> 3, p2 -= u2 >> 3, p3 -= u3 >> 3;
		u0 &= 7, u1 &= 7, u2 &= 7, u3 &= 7;
		c0 = rd64(p0) << u0, c1 = rd64(p1) << u1, c2 = rd64(p2) << u2, c3 = rd64(p3) << u3;
		for (int k = 0; k < per; k++) {
			ZD_HUF_STEP(c0, u0, o0, t, log);
			ZD_HUF_STEP(c1, u1, o1, t, log);
			ZD_HUF_STEP(c2, u2, o2, t, log);
			ZD_HUF_STEP(c3, u3, o3, t, log);
		}
	}
	b[0].c = c0, b[1].c = c1, b[2].c = c2, b[3].c = c3;
	b[0].used = u0, b[1].used = u1, b[2].used = u2, b[3].used = u3;
	b[0].p = p0, b[1].p = p1, b[2].p = p2, b[3].p = p3;
	// One stream near its start ends the loop; the others may be far
	// from theirs.
	if (zd_huf_finish(&b[0], o0, o + seg, t, log) < 0 || zd_huf_finish(&b[1], o1, o + 2 * seg, t, log) < 0 ||
		zd_huf_finish(&b[2], o2, o + 3 * seg, t, log) < 0 || zd_huf_finish(&b[3], o3, e3, t, log) < 0)
		return -1;
	return 0;
}

// zd_literals decodes the literals section at [p, p+n) into z->lit, sets
// *cnt to their number and returns the section's length, or an error.
ZD_INLINE int zd_literals(gz_zdec *z, zd_frame *f, const uint8_t *p, size_t n, size_t *cnt) {
	if (n < 1) return GZ_ZDEC_CORRUPT;
	unsigned type = p[0] & 3, fmt = (p[0] >> 2) & 3;
	size_t regen, csize, h;
	if (type < 2) {
		switch (fmt) {
		case 0: case 2:
			h = 1;
			regen = p[0] >> 3;
			break;
		case 1:
			h = 2;
			if (n < h) return GZ_ZDEC_CORRUPT;
			regen = (p[0] >> 4) | (size_t)p[1] << 4;
			break;
		default:
			h = 3;
			if (n < h) return GZ_ZDEC_CORRUPT;
			regen = (p[0] >> 4) | (size_t)p[1] << 4 | (size_t)p[2] << 12;
			break;
		}
		if (regen > ZD_LIT_MAX) return GZ_ZDEC_TOO_LARGE;
		if (type == 0) {
			if (regen > n - h) return GZ_ZDEC_CORRUPT;
			memcpy(z->lit, p + h, regen);
			*cnt = regen;
			return (int)(h + regen);
		}
		if (n - h < 1) return GZ_ZDEC_CORRUPT;
		memset(z->lit, p[h], regen);
		*cnt = regen;
		return (int)(h + 1);
	}
	int four = fmt != 0;
	h = fmt < 2 ? 3 : fmt + 2;
	if (n < h) return GZ_ZDEC_CORRUPT;
	uint32_t v = p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (h > 3 ? (uint32_t)p[3] << 24 : 0);
	switch (h) {
	case 3:
		regen = (v >> 4) & 0x3FF;
		csize = (v >> 14) & 0x3FF;
		break;
	case 4:
		regen = (v >> 4) & 0x3FFF;
		csize = v >> 18;
		break;
	default:
		regen = (v >> 4) & 0x3FFFF;
		csize = (v >> 22) | (size_t)p[4] << 10;
		break;
	}
	if (regen > ZD_LIT_MAX) return GZ_ZDEC_TOO_LARGE;
	if (csize > n - h || regen == 0) return GZ_ZDEC_CORRUPT;
	const uint8_t *s = p + h;
	size_t sn = csize;
	if (type == 2) {
		int used = zd_huf_table(z, &f->huflog, s, sn);
		if (used < 0) return GZ_ZDEC_CORRUPT;
		s += used;
		sn -= (size_t)used;
		f->huf = z->huf;
	} else if (f->huflog == 0) {
		return GZ_ZDEC_CORRUPT;
	}
	const uint16_t *huf = ZD_DICTS ? f->huf : z->huf;
	int r = four ? zd_huf4(z->lit, regen, s, sn, huf, f->huflog) : zd_huf1(z->lit, regen, s, sn, huf, f->huflog);
	if (r < 0) return GZ_ZDEC_CORRUPT;
	*cnt = regen;
	return (int)(h + csize);
}

// zd_table sets the frame's table i (0 literal lengths, 1 offsets, 2
// match lengths) by mode, reading its description at *p, which it
// advances.
ZD_INLINE int zd_table(gz_zdec *z, zd_frame *f, int i, unsigned mode, const uint8_t **p, const uint8_t *end) {
	const unsigned maxsyms = i == 0 ? ZD_LL_MAX : i == 1 ? ZD_OF_MAX : ZD_ML_MAX;
	const unsigned maxlog = i == 0 ? ZD_LL_LOG : i == 1 ? ZD_OF_LOG : ZD_ML_LOG;
	const unsigned prelog = i == 1 ? 5 : 6;
	const uint32_t *base = i == 0 ? ll_base : i == 1 ? of_base : ml_base;
	const uint8_t *bits = i == 0 ? ll_bits : i == 1 ? of_bits : ml_bits;
	zd_sym *own = i == 0 ? z->ll : i == 1 ? z->of : z->ml;
	switch (mode) {
	case 0:
		// Copied, so that the sequences' loop finds all three tables at
		// fixed places in z, in one register.
#ifdef ZD_PREBUILT
		memcpy(own, i == 0 ? ll_pre : i == 1 ? of_pre : ml_pre, sizeof(zd_sym) << prelog);
#else
		if (zd_build(own, i == 0 ? ll_pre_norm : i == 1 ? of_pre_norm : ml_pre_norm,
				i == 1 ? 28 : maxsyms, prelog, base, bits) < 0)
			return -1;
#endif
		f->t[i] = own;
		f->log[i] = prelog;
		return 0;
	case 1: {
		if (*p >= end) return -1;
		unsigned s = *(*p)++;
		if (s > maxsyms) return -1;
		own[0] = zd_sym_of(base[s], bits[s]);
		f->t[i] = own;
		f->log[i] = 0;
		return 0;
	}
	case 2: {
		int16_t norm[ZD_ML_MAX + 1];
		unsigned maxsym = maxsyms, log;
		int h = zd_fse_header(norm, &maxsym, &log, maxlog, *p, (size_t)(end - *p));
		if (h < 0 || zd_build(own, norm, maxsym, log, base, bits) < 0) return -1;
		*p += h;
		f->t[i] = own;
		f->log[i] = log;
		return 0;
	}
	default:
		if (!f->t[i]) return -1;
		if (ZD_DICTS && f->t[i] != own) {
			// A dictionary's, repeated: to z's place for the loop.
			memcpy(own, f->t[i], sizeof(zd_sym) << f->log[i]);
			f->t[i] = own;
		}
		return 0;
	}
}

// zd_dict_seq writes a sequence whose match reaches back before dst, into
// the dictionary's content: ll literals from *litp, then ml bytes from off
// bytes back, exactly (no wild copies), where dst's output and the
// content read as one.
ZD_INLINE int zd_dict_seq(const zd_frame *f, uint8_t **opp, const uint8_t **litp, size_t ll, size_t off, size_t ml,
		const uint8_t *oend, const uint8_t *dst) {
	uint8_t *op = *opp;
	size_t room = (size_t)(oend - op);
	if (ll + ml > room) return GZ_ZDEC_DST_SMALL;
	const uint8_t *lit = *litp;
	*litp += ll;
	size_t back = off - (size_t)(op + ll - dst); // 1..dictlen: checked
	const uint8_t *from = f->dict + f->dictlen - back;
	if (likely(room >= ll + ml + ZD_WILD && back >= ml + 16)) {
		// As the loop's fast path: 16 bytes at a time, past the end,
		// the match all inside the content, up to 16 bytes before its end.
		for (size_t j = 0; j < ll; j += 16) copy16(op + j, lit + j);
		op += ll;
		for (size_t j = 0; j < ml; j += 16) copy16(op + j, from + j);
		*opp = op + ml;
		return 0;
	}
	memcpy(op, lit, ll);
	op += ll;
	size_t n = back < ml ? back : ml;
	memcpy(op, from, n);
	for (size_t j = n; j < ml; j++) op[j] = op[j - off]; // from dst on
	*opp = op + ml;
	return 0;
}

// zd_back4 and zd_back8 are, for a match's period under 8, whole numbers
// of periods at least 4 and 8 bytes back.
ZD_TABLE uint8_t zd_back4[8] = {0, 4, 4, 6, 4, 5, 6, 7}, zd_back8[8] = {0, 8, 8, 9, 8, 10, 12, 14};

// zd_copy_match copies the match of n bytes at offset off behind op with
// steps that may write up to 16 bytes past its end (the caller leaves
// ZD_WILD bytes of room).
ZD_INLINE void zd_copy_match(uint8_t *op, size_t off, size_t n) {
	if (off >= 16) {
		for (size_t i = 0; i < n; i += 16) copy16(op + i, op - off + i);
		return;
	}
	size_t d = off;
	if (off < 8) {
		// A period under 8 bytes: its first 4 bytes one by one, the next
		// 4 from a whole number of periods back (at least 4, so written
		// already), and the rest 8 at a time from a whole number of
		// periods back that is at least 8.
		op[0] = op[-(ptrdiff_t)off];
		op[1] = op[1 - (ptrdiff_t)off];
		op[2] = op[2 - (ptrdiff_t)off];
		op[3] = op[3 - (ptrdiff_t)off];
		memcpy(op + 4, op + 4 - zd_back4[off], 4);
		d = zd_back8[off];
		op += 8;
		if (n <= 8) return;
		n -= 8;
	}
	for (size_t i = 0; i < n; i += 8) copy8(op + i, op - d + i);
}

// zd_block decodes the compressed block at [p, p+n) to *op onwards,
// stopping once *op - dst reaches want.
ZD_INLINE int zd_block(gz_zdec *z, zd_frame *f, const uint8_t *p, size_t n, uint8_t *dst, uint8_t **opp,
		uint8_t *oend, size_t want) {
	size_t litn;
	int r = zd_literals(z, f, p, n, &litn);
	if (r < 0) return r;
	const uint8_t *ip = p + r, *end = p + n;
	const uint8_t *lit = z->lit, *litend = z->lit + litn;
	uint8_t *op = *opp;
	if (ip >= end) return GZ_ZDEC_CORRUPT;
	size_t nseq = *ip++;
	if (nseq >= 128) {
		if (ip >= end) return GZ_ZDEC_CORRUPT;
		if (nseq < 255) {
			nseq = ((nseq - 128) << 8) + *ip++;
		} else {
			if (end - ip < 2) return GZ_ZDEC_CORRUPT;
			nseq = ip[0] + ((size_t)ip[1] << 8) + 0x7F00;
			ip += 2;
		}
	}
	if (nseq > 0) {
		if (ip >= end) return GZ_ZDEC_CORRUPT;
		unsigned modes = *ip++;
		if (modes & 3) return GZ_ZDEC_CORRUPT;
		if (zd_table(z, f, 0, modes >> 6, &ip, end) < 0 || zd_table(z, f, 1, (modes >> 4) & 3, &ip, end) < 0 ||
			zd_table(z, f, 2, (modes >> 2) & 3, &ip, end) < 0)
			return GZ_ZDEC_CORRUPT;
		zd_br b;
		if (zd_br_init(&b, ip, (size_t)(end - ip)) < 0) return GZ_ZDEC_CORRUPT;
		unsigned lls = zd_br_read(&b, f->log[0]);
		unsigned ofs = zd_br_read(&b, f->log[1]);
		unsigned mls = zd_br_read(&b, f->log[2]);
		uint32_t rep0 = f->rep[0], rep1 = f->rep[1], rep2 = f->rep[2];
		// Where to stop, past the output's end for the whole block: one
		// register for the loop, which has too few.
		uintptr_t stop = (uintptr_t)dst + (want < (size_t)(oend - dst) ? want : (size_t)(oend - dst) + 1);
		for (size_t left = nseq;;) {
			// A sequence reads its extra bits, then the states' (26 at
			// most), from one reload while the former come to 31 at most.
			if (zd_br_reload(&b)) return GZ_ZDEC_CORRUPT;
			// No mask: zd_build's states lead only to states of the
			// table, whatever bits the stream holds.
			const zd_sym *L = &z->ll[lls], *O = &z->of[ofs], *M = &z->ml[mls];
			unsigned adds = O->add + M->add + L->add;
			uint32_t ofv = O->base + zd_br_read(&b, O->add);
			if (unlikely(adds > 31) && zd_br_reload(&b)) return GZ_ZDEC_CORRUPT;
			size_t ml = M->base + zd_br_read(&b, M->add);
			size_t ll = L->base + zd_br_read(&b, L->add);
			// The repeat offsets without branches: which kind of offset
			// comes next is as good as random.
			unsigned k = (ofv - 1 + (ll == 0)) & 3;
			uint32_t reps[4] = {rep0, rep1, rep2, rep0 - 1};
			int isnew = ofv > 3;
			size_t off = isnew ? ofv - 3 : reps[k];
			int same = !isnew && k == 0, swap = !isnew && k == 1;
			rep2 = same || swap ? rep2 : rep1;
			rep1 = same ? rep1 : rep0;
			rep0 = (uint32_t)off;
			if (--left) {
				if (unlikely(adds > 31) && zd_br_reload(&b)) return GZ_ZDEC_CORRUPT;
				lls = L->next + zd_br_read(&b, L->nb);
				mls = M->next + zd_br_read(&b, M->nb);
				ofs = O->next + zd_br_read(&b, O->nb);
			}
			if (unlikely(ll > (size_t)(litend - lit))) return GZ_ZDEC_CORRUPT;
			if (unlikely(off - 1 >= (size_t)(op + ll - dst))) {
				// 0, or before dst: into the dictionary's content, if
				// it is that far.
				if (!ZD_DICTS || off == 0 || off - (size_t)(op + ll - dst) > f->dictlen) return GZ_ZDEC_CORRUPT;
				int r = zd_dict_seq(f, &op, &lit, ll, off, ml, oend, dst);
				if (r < 0) return r;
			} else {
				size_t room = (size_t)(oend - op);
				if (likely(room >= ll + ml + ZD_WILD)) {
					// Most literals and matches take one 16-byte copy.
					copy16(op, lit);
					for (size_t j = 16; unlikely(j < ll); j += 16) copy16(op + j, lit + j);
					op += ll;
					lit += ll;
					if (likely(off >= 16)) {
						copy16(op, op - off);
						copy16(op + 16, op - off + 16);
						for (size_t j = 32; unlikely(j < ml); j += 16) copy16(op + j, op - off + j);
					} else {
						zd_copy_match(op, off, ml);
					}
					op += ml;
				} else {
					if (ll + ml > room) return GZ_ZDEC_DST_SMALL;
					memcpy(op, lit, ll);
					op += ll;
					lit += ll;
					for (size_t j = 0; j < ml; j++) op[j] = op[j - off];
					op += ml;
				}
			}
			if ((uintptr_t)op >= stop) {
				*opp = op;
				return 0;
			}
			if (!left) break;
		}
		if (zd_br_reload(&b) || !zd_br_done(&b)) return GZ_ZDEC_CORRUPT;
		f->rep[0] = rep0;
		f->rep[1] = rep1;
		f->rep[2] = rep2;
	} else if (ip != end) {
		return GZ_ZDEC_CORRUPT;
	}
	size_t rest = (size_t)(litend - lit);
	if (rest > (size_t)(oend - op)) return GZ_ZDEC_DST_SMALL;
	memcpy(op, lit, rest);
	*opp = op + rest;
	return 0;
}

// zd_decode_dict is gz_zdec_decode_dict; d may be NULL, for frames with
// no dictionary.
ZD_INLINE ptrdiff_t zd_decode_dict(gz_zdec *z, const gz_zdict *d, const uint8_t *src, size_t srclen, uint8_t *dst,
		size_t dstlen, size_t want) {
	const uint8_t *ip = src, *end = src + srclen;
	if (srclen < 6) return GZ_ZDEC_CORRUPT;
	uint32_t magic = src[0] | (uint32_t)src[1] << 8 | (uint32_t)src[2] << 16 | (uint32_t)src[3] << 24;
	if (magic != ZD_MAGIC) return (magic & 0xFFFFFFF0u) == 0x184D2A50u ? GZ_ZDEC_UNSUPPORTED : GZ_ZDEC_CORRUPT;
	unsigned fhd = src[4];
	if (fhd & 8) return GZ_ZDEC_CORRUPT;
	unsigned single = (fhd >> 5) & 1, fcsflag = fhd >> 6, didflag = fhd & 3;
	size_t didlen = didflag == 3 ? 4 : didflag;
	size_t fcslen = fcsflag == 0 ? single : 1u << fcsflag;
	ip = src + 5 + !single;
	if ((size_t)(end - ip) < didlen + fcslen) return GZ_ZDEC_CORRUPT;
	uint32_t did = 0;
	for (size_t i = 0; i < didlen; i++) did |= (uint32_t)ip[i] << (8 * i);
	// A frame may leave its dictionary's ID out.
	if (did != 0 && (!ZD_DICTS || !d || did != d->id)) return GZ_ZDEC_UNSUPPORTED;
	ip += didlen;
	uint64_t fcs = 0;
	for (size_t i = 0; i < fcslen; i++) fcs |= (uint64_t)ip[i] << (8 * i);
	if (fcslen == 2) fcs += 256;
	ip += fcslen;

	int full = want >= dstlen;
	if (full) want = SIZE_MAX;
	zd_frame f;
	if (ZD_DICTS && d) {
		f.t[0] = d->ll, f.t[1] = d->of, f.t[2] = d->ml;
		f.log[0] = d->log[0], f.log[1] = d->log[1], f.log[2] = d->log[2];
		f.huf = d->huf;
		f.huflog = d->huflog;
		f.rep[0] = d->rep[0], f.rep[1] = d->rep[1], f.rep[2] = d->rep[2];
		f.dict = d->content;
		f.dictlen = d->contentlen;
	} else {
		f.t[0] = f.t[1] = f.t[2] = NULL;
		f.log[0] = f.log[1] = f.log[2] = 0;
		f.huf = z->huf;
		f.huflog = 0;
		f.rep[0] = 1, f.rep[1] = 4, f.rep[2] = 8;
		f.dict = NULL;
		f.dictlen = 0;
	}
	uint8_t *op = dst, *oend = dst + dstlen;
	for (;;) {
		if (end - ip < 3) return GZ_ZDEC_CORRUPT;
		uint32_t bh = ip[0] | (uint32_t)ip[1] << 8 | (uint32_t)ip[2] << 16;
		ip += 3;
		size_t bsize = bh >> 3;
		uint8_t *bstart = op;
		switch ((bh >> 1) & 3) {
		case 0:
			if (bsize > (size_t)(end - ip)) return GZ_ZDEC_CORRUPT;
			if (bsize > (size_t)(oend - op)) return GZ_ZDEC_DST_SMALL;
			memcpy(op, ip, bsize);
			ip += bsize;
			op += bsize;
			break;
		case 1:
			if (ip >= end) return GZ_ZDEC_CORRUPT;
			if (bsize > (size_t)(oend - op)) return GZ_ZDEC_DST_SMALL;
			memset(op, *ip++, bsize);
			op += bsize;
			break;
		case 2: {
			if (bsize > (size_t)(end - ip) || bsize > ZD_BLOCK_MAX) return GZ_ZDEC_CORRUPT;
			int r = zd_block(z, &f, ip, bsize, dst, &op, oend, want);
			if (r < 0) return r;
			ip += bsize;
			break;
		}
		default:
			return GZ_ZDEC_CORRUPT;
		}
		if ((size_t)(op - dst) >= want) return op - dst;
		if (op - bstart > ZD_BLOCK_MAX) return GZ_ZDEC_CORRUPT;
		if (bh & 1) break;
	}
	if (fcslen && fcs != (uint64_t)(op - dst)) return GZ_ZDEC_CORRUPT;
	if (fhd & 4) {
		if (end - ip < 4) return GZ_ZDEC_CORRUPT;
		ip += 4;
	}
	if (full && ip != end) return GZ_ZDEC_CORRUPT;
	return op - dst;
}

ZD_INLINE ptrdiff_t zd_decode(gz_zdec *z, const uint8_t *src, size_t srclen, uint8_t *dst, size_t dstlen, size_t want) {
	return zd_decode_dict(z, NULL, src, srclen, dst, dstlen, want);
}
