// zstd encoder for single 4 KiB pages, portable C for the host (gcc, cgo)
// and for CUDA device code (nvcc): every function is ZP_FN, static inline
// on the host and static __device__ __forceinline__ under nvcc.
//
// zp_compress_page writes one standard zstd frame (RFC 8878) that any
// zstd decoder (libzstd's ZSTD_decompress) decodes to the page:
//
//   magic | Frame_Header_Descriptor 0x60 (Single_Segment, 2-byte FCS,
//   no checksum, no dictionary) | FCS 4096 | one last block
//
// The block is an RLE block for a page of one repeated byte (11-byte
// frame), else one compressed block. The encoder runs in stages, each a
// function a GPU kernel can call on its own (kernels/zstd.cu runs its own
// warp-parallel stage 1, then stages 2 and 3 from here):
//
//   1. zp_find_sequences: LZ77 parse with a hash-chain match finder (hash
//      of min_match bytes into a head table, every position chained,
//      depth-limited search; the three repeat offsets tried at every
//      position; lazy look-ahead of one or two positions; matches scored
//      as zstd's lazy parser scores them, ZP_GAIN_BYTE per byte less the
//      offset value's bits), giving (literal length, match length, offset
//      value) triples in ws->seq_*; offset values 1-3 are repeat codes,
//      with the literal-length-0 shift of RFC 8878 3.1.2.5 (zp_offval,
//      zp_rep_update). zp_gather_literals then copies the literals to
//      ws->u.lit.lit (over the match finder's tables).
//   2. zp_encode_literals: raw, RLE or Huffman literals, whichever is
//      smallest. Huffman: code lengths by in-place Moffat-Katajainen,
//      limited to 11 bits (or fewer when that makes the section smaller),
//      canonical codes as RFC 8878 4.2.1.3 assigns them, the tree
//      described with direct 4-bit weights (up to 128 weights) or
//      FSE-compressed weights, whichever is smaller; one stream up to 1023
//      literals (size format 00), else four with the jump table.
//   3. zp_encode_sequences: per symbol type (literal length, offset, match
//      length codes) RLE when one code, else the predefined table or an
//      FSE-compressed one (tableLog 5..8), whichever is estimated smallest;
//      the bitstream written last sequence first, the states interleaved
//      as the decoder reads them. It overwrites ws->u.lit, so it runs
//      after stage 2 has written its section.
//   4. zp_compress_page: frame and block headers around them.
//
// Constraints kept for the device: no allocation, no libc (the host build
// uses only compiler builtins), no recursion, no function pointers; all
// scratch lives in one caller-provided zp_workspace of ZP_WORKSPACE_SIZE
// bytes (16 KiB with the defaults: 6 KiB of sequences, then the match
// finder's tables or the entropy coders' scratch in a union).
//
// On the memory-page corpus (internal/zstdpage's TestCorpus, all-zero
// pages left out) the defaults store 3.66x against 3.43x for libzstd
// level 1; every stage and option is measured there.
//
// zp_compress_page returns the frame length, or 0 when the frame would be
// 4096 bytes or more or would not fit in dst_cap (the caller then keeps
// the page raw). It never writes at or past dst + dst_cap and reads only
// the 4096 bytes of src.
//
// kernels/zstd.ptx is built from kernels/zstd.cu with this header: rebuild
// it (kernels/build-ptx.sh zstd.cu) after changing either.

#ifndef GZRAMD_ZSTD_PAGE_H
#define GZRAMD_ZSTD_PAGE_H

#include <stddef.h>
#include <stdint.h>

// ZP_FN_BIG marks the entropy stages' larger functions: on the device they
// stay calls (ZP_NOINLINE_BIG), so that the lane running them does not walk
// through several copies of them and out of the instruction cache.
#ifdef __CUDACC__
#define ZP_FN static __device__ __forceinline__
#ifdef ZP_NOINLINE_BIG
#define ZP_FN_BIG static __device__ __noinline__
#else
#define ZP_FN_BIG ZP_FN
#endif
#define ZP_TABLE static __device__ const
#else
#define ZP_FN static inline
#define ZP_FN_BIG static inline
#define ZP_TABLE static const
#endif

// ZP_PROF(k) marks the end of step k for a profiling build (zstdbench
// with -DZW_PROFILE); nothing otherwise.
#ifndef ZP_PROF
#define ZP_PROF(k)
#endif

// ZP_PAGE is the bytes of a frame: a page, or a frame of several pages
// for kernels/zstd_deep.h, which sets it before including this header.
// Its one block holds them all, so it is at most 65535 (16-bit positions).
#ifndef ZP_PAGE
#define ZP_PAGE 4096
#endif

// The head table of the match finder has 1 << hash_bits entries, at most
// 1 << ZP_HASH_BITS_MAX.
#ifndef ZP_HASH_BITS_MAX
#define ZP_HASH_BITS_MAX 10
#endif
// At most ZP_MAX_SEQ sequences per page: enough for matches of 4 bytes or
// more; a page that would need more (3-byte matches) keeps the rest as
// literals.
#ifndef ZP_MAX_SEQ
#define ZP_MAX_SEQ 1024
#endif
#define ZP_HUF_MAX_BITS 11
// FSE-compressed sequence tables are tried with tableLogs up to this one
// (larger ones hardly ever win on a page).
#ifndef ZP_FSE_TRY_MAX
#define ZP_FSE_TRY_MAX 8
#endif
// Huffman code-length limits tried: 11 down to this one, while the
// literals section shrinks.
// How many table logs zp_encode_sequences tries for a compressed table,
// from the smallest that holds the symbols up.
#ifndef ZP_FSE_TRIES
#define ZP_FSE_TRIES 16
#endif
// How many code-length limits zp_plan_literals tries, from the deepest
// down, and whether the Huffman weights' FSE description is also tried at
// table log 5 (it always is at 6): fewer tries cost the GPU's one lane less.
#ifndef ZP_HUF_TRIES
#define ZP_HUF_TRIES 16
#endif
#ifndef ZP_HUF_WEIGHT_LOG5
#define ZP_HUF_WEIGHT_LOG5 1
#endif
#ifndef ZP_HUF_SRC_BITS
#define ZP_HUF_SRC_BITS 1
#endif
#ifndef ZP_HUF_MIN_LIMIT
#define ZP_HUF_MIN_LIMIT 5
#endif

#define ZP_EMPTY 0xFFFFu

// Options select the stages (to measure each) and the match finder;
// zp_defaults sets the best ratio found on the corpus that stays cheap
// enough for a GPU; zp_compress_page clamps them (zp_sanitize).
typedef struct zp_options {
	int huffman;    // 1: Huffman literals allowed (used when smaller)
	int fse_custom; // 1: FSE_Compressed sequence tables allowed (used when smaller)
	int rep;        // 1: repeat offsets searched and encoded; 0: offset + 3 only
	int hash_bits;  // head table bits, 4..ZP_HASH_BITS_MAX (hardly matters with chains)
	int min_match;  // shortest new-offset match, 3..8 (also the hashed length)
	int rep_min;    // shortest repeat-offset match, 3..8
	int depth;      // chain candidates tried per position, 1..4096
	int lazy;       // 0 greedy, 1 or 2 positions of look-ahead
} zp_options;

// FSE encoding table (FSE_buildCTable's layout: states by symbol, and per
// symbol the delta to its states and the bit-count threshold).
typedef struct zp_fse_ct {
	uint16_t state[512];
	int16_t dfs[64];  // deltaFindState
	uint32_t dnb[64]; // deltaNbBits
} zp_fse_ct;

typedef struct zp_fse_ct_small { // for Huffman weights: tableLog <= 6, symbols 0..11
	uint16_t state[64];
	int16_t dfs[16];
	uint32_t dnb[16];
} zp_fse_ct_small;

// zp_seq_plan is how the sequences section codes each type (0 LL, 1 OF,
// 2 ML): mode (0 predefined, 1 RLE, 2 FSE-compressed), table log, largest
// code, the description's length, and (GPU) each stream's last state.
typedef struct zp_seq_plan {
	int mode[3], log[3], maxs[3], desc[3];
	uint32_t fin[3];
} zp_seq_plan;

typedef struct zp_workspace {
	// Stage 1 output, read by stages 2 and 3.
	uint16_t seq_ll[ZP_MAX_SEQ]; // literal length
	uint16_t seq_ml[ZP_MAX_SEQ]; // match length
	uint16_t seq_of[ZP_MAX_SEQ]; // offset value: 1-3 repeat code, else offset + 3
	union {
#ifndef ZP_NO_CHAIN_MF
		struct { // stage 1
			uint16_t head[1 << ZP_HASH_BITS_MAX];
			uint16_t chain[ZP_PAGE];
		} mf;
#endif
		struct { // stage 2
			uint8_t lit[ZP_PAGE];
			uint16_t hist[256];
			uint16_t hcode[256];
			uint8_t hlen[256];
			uint8_t weight[256];
			uint16_t sym[256];  // symbols by ascending count
			uint16_t depth[256]; // Moffat-Katajainen work array
			uint8_t tree[256];  // Huffman tree descriptions tried (FSE weights, 5- and 6-bit tables)
			uint8_t tsym[64];
			int16_t treeFse, treeLen; // FSE description in tree[] (-1: direct)
			uint16_t wcount[16]; // 4-byte aligned: the GPU adds to it in 32-bit words
			uint16_t wcumul[18];
			int16_t wnorm[16];
			uint8_t maxBits;
			zp_fse_ct_small wct;
		} lit;
		struct { // stage 3
			zp_fse_ct ct[3]; // LL, OF, ML
			union {
				struct { // the tables' planning and building, a type's scratch apart from the others'
					uint16_t count[3][64];
					int16_t norm[3][64];
					uint8_t tsym[3][512];
					uint8_t ncount[3][96]; // table descriptions
					uint16_t cumul[3][66];
				} b;
#ifdef __CUDACC__
				// The GPU's bitstream: a sequence's state bits per type
				// (value << 4 | bit count), once the tables are built.
				uint16_t fbits[3][ZP_MAX_SEQ];
#endif
			} x;
			zp_seq_plan plan;
		} seq;
	} u;
} zp_workspace;

#define ZP_WORKSPACE_SIZE sizeof(zp_workspace)
// The workspace must stay within ZP_WORKSPACE_LIMIT bytes (a warp's share
// of shared memory on the device); raise it to try larger tables.
#ifndef ZP_WORKSPACE_LIMIT
#define ZP_WORKSPACE_LIMIT 16384
#endif
typedef char zp_workspace_size_check[(sizeof(zp_workspace) <= ZP_WORKSPACE_LIMIT) ? 1 : -1];

// ---------------------------------------------------------------- tables

ZP_TABLE uint8_t zp_ll_bits[36] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
	1, 1, 1, 1, 2, 2, 3, 3, 4, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16};
ZP_TABLE uint32_t zp_ll_base[36] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15,
	16, 18, 20, 22, 24, 28, 32, 40, 48, 64, 128, 256, 512, 1024, 2048, 4096,
	8192, 16384, 32768, 65536};
ZP_TABLE uint8_t zp_ml_bits[53] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
	0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
	1, 1, 1, 1, 2, 2, 3, 3, 4, 4, 5, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16};
// Match length baselines minus 3 (the minimum match).
ZP_TABLE uint32_t zp_ml_base[53] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15,
	16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31,
	32, 34, 36, 38, 40, 44, 48, 56, 64, 80, 96, 128, 256, 512, 1024, 2048,
	4096, 8192, 16384, 32768, 65536};

// Predefined distributions (RFC 8878 3.1.1.3.2.2).
ZP_TABLE int16_t zp_ll_def[36] = {4, 3, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 1, 1, 1,
	2, 2, 2, 2, 2, 2, 2, 2, 2, 3, 2, 1, 1, 1, 1, 1, -1, -1, -1, -1};
ZP_TABLE int16_t zp_ml_def[53] = {1, 4, 3, 2, 2, 2, 2, 2, 2, 1, 1, 1, 1, 1, 1, 1,
	1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1,
	1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, -1, -1, -1, -1, -1, -1, -1};
ZP_TABLE int16_t zp_of_def[29] = {1, 1, 1, 1, 1, 1, 2, 2, 2, 1, 1, 1, 1, 1, 1, 1,
	1, 1, 1, 1, 1, 1, 1, 1, -1, -1, -1, -1, -1};

// --------------------------------------------------------------- helpers

ZP_FN int zp_highbit(uint32_t v) { // v > 0
#ifdef __CUDACC__
	return 31 - __clz(v);
#else
	return 31 - __builtin_clz(v);
#endif
}

ZP_FN int zp_ctz64(uint64_t v) { // v != 0
#ifdef __CUDACC__
	return __ffsll((long long)v) - 1;
#else
	return __builtin_ctzll(v);
#endif
}

ZP_FN void zp_defaults(zp_options *o) {
	o->huffman = 1;
	o->fse_custom = 1;
	o->rep = 1;
	o->hash_bits = ZP_HASH_BITS_MAX;
	o->min_match = 4;
	o->rep_min = 3;
	o->depth = 16;
	o->lazy = 2;
}

// zp_ld32 / zp_ld64 load little-endian words at p (within the page);
// zp_rd32 / zp_rd64 also take p near the end, bytes past the page read
// as 0. On a little-endian GNU host the loads are single unaligned loads
// (__builtin_memcpy of a constant size is inlined, no libc call).
#if !defined(__CUDACC__) && defined(__GNUC__) && defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
ZP_FN uint32_t zp_ld32(const uint8_t *s, int p) {
	uint32_t v;
	__builtin_memcpy(&v, s + p, 4);
	return v;
}
ZP_FN uint64_t zp_ld64(const uint8_t *s, int p) {
	uint64_t v;
	__builtin_memcpy(&v, s + p, 8);
	return v;
}
#else
ZP_FN uint32_t zp_ld32(const uint8_t *s, int p) {
	return (uint32_t)s[p] | (uint32_t)s[p + 1] << 8 | (uint32_t)s[p + 2] << 16 | (uint32_t)s[p + 3] << 24;
}
ZP_FN uint64_t zp_ld64(const uint8_t *s, int p) { return (uint64_t)zp_ld32(s, p) | (uint64_t)zp_ld32(s, p + 4) << 32; }
#endif

ZP_FN uint32_t zp_rd32(const uint8_t *s, int p) {
	if (p + 4 <= ZP_PAGE) return zp_ld32(s, p);
	uint32_t v = 0;
	for (int i = 0; i < 4 && p + i < ZP_PAGE; i++) v |= (uint32_t)s[p + i] << (8 * i);
	return v;
}

ZP_FN uint64_t zp_rd64(const uint8_t *s, int p) {
	if (p + 8 <= ZP_PAGE) return zp_ld64(s, p);
	uint64_t v = 0;
	for (int i = 0; i < 8 && p + i < ZP_PAGE; i++) v |= (uint64_t)s[p + i] << (8 * i);
	return v;
}

// zp_log2q8 returns log2(x) * 256 (x > 0), to 8 fraction bits.
ZP_FN int zp_log2q8(uint32_t x) {
	int h = zp_highbit(x);
	uint32_t m = h >= 15 ? x >> (h - 15) : x << (15 - h); // [1, 2) in Q15
	int r = h << 8;
	for (int i = 7; i >= 0; i--) {
		m = (m * m) >> 15;
		if (m >= (2u << 15)) {
			m >>= 1;
			r |= 1 << i;
		}
	}
	return r;
}

// zp_log2q8_tab[p] is zp_log2q8(p) for p in 1..512 (a normalized
// count's cost, every symbol of every table tried; the GPU's lanes would
// otherwise square eight times a symbol).
ZP_TABLE uint16_t zp_log2q8_tab[513] = {
	0, 0, 256, 405, 512, 594, 661, 718, 768, 811, 850, 885, 917, 947, 974, 1000,
	1024, 1046, 1067, 1087, 1106, 1124, 1141, 1158, 1173, 1188, 1203, 1217, 1230, 1243, 1256, 1268,
	1280, 1291, 1302, 1313, 1323, 1333, 1343, 1353, 1362, 1371, 1380, 1389, 1397, 1405, 1414, 1421,
	1429, 1437, 1444, 1452, 1459, 1466, 1473, 1480, 1486, 1493, 1499, 1505, 1512, 1518, 1524, 1530,
	1536, 1541, 1547, 1552, 1558, 1563, 1569, 1574, 1579, 1584, 1589, 1594, 1599, 1604, 1609, 1613,
	1618, 1622, 1627, 1632, 1636, 1640, 1645, 1649, 1653, 1657, 1661, 1665, 1670, 1674, 1677, 1681,
	1685, 1689, 1693, 1697, 1700, 1704, 1708, 1711, 1715, 1718, 1722, 1725, 1729, 1732, 1736, 1739,
	1742, 1745, 1749, 1752, 1755, 1758, 1761, 1765, 1768, 1771, 1774, 1777, 1780, 1783, 1786, 1789,
	1792, 1794, 1797, 1800, 1803, 1806, 1808, 1811, 1814, 1817, 1819, 1822, 1825, 1827, 1830, 1832,
	1835, 1838, 1840, 1843, 1845, 1848, 1850, 1853, 1855, 1857, 1860, 1862, 1865, 1867, 1869, 1872,
	1874, 1876, 1878, 1881, 1883, 1885, 1888, 1890, 1892, 1894, 1896, 1898, 1901, 1903, 1905, 1907,
	1909, 1911, 1913, 1915, 1917, 1919, 1921, 1924, 1926, 1928, 1930, 1932, 1933, 1935, 1937, 1939,
	1941, 1943, 1945, 1947, 1949, 1951, 1953, 1954, 1956, 1958, 1960, 1962, 1964, 1965, 1967, 1969,
	1971, 1973, 1974, 1976, 1978, 1980, 1981, 1983, 1985, 1986, 1988, 1990, 1992, 1993, 1995, 1997,
	1998, 2000, 2001, 2003, 2005, 2006, 2008, 2010, 2011, 2013, 2014, 2016, 2017, 2019, 2021, 2022,
	2024, 2025, 2027, 2028, 2030, 2031, 2033, 2034, 2036, 2037, 2039, 2040, 2042, 2043, 2045, 2046,
	2048, 2049, 2050, 2052, 2053, 2055, 2056, 2057, 2059, 2060, 2062, 2063, 2064, 2066, 2067, 2069,
	2070, 2071, 2073, 2074, 2075, 2077, 2078, 2079, 2081, 2082, 2083, 2085, 2086, 2087, 2088, 2090,
	2091, 2092, 2094, 2095, 2096, 2097, 2099, 2100, 2101, 2102, 2104, 2105, 2106, 2107, 2109, 2110,
	2111, 2112, 2113, 2115, 2116, 2117, 2118, 2119, 2121, 2122, 2123, 2124, 2125, 2126, 2128, 2129,
	2130, 2131, 2132, 2133, 2134, 2136, 2137, 2138, 2139, 2140, 2141, 2142, 2144, 2145, 2146, 2147,
	2148, 2149, 2150, 2151, 2152, 2153, 2154, 2156, 2157, 2158, 2159, 2160, 2161, 2162, 2163, 2164,
	2165, 2166, 2167, 2168, 2169, 2170, 2171, 2172, 2173, 2174, 2175, 2176, 2177, 2179, 2180, 2181,
	2182, 2183, 2184, 2185, 2186, 2187, 2188, 2188, 2189, 2190, 2191, 2192, 2193, 2194, 2195, 2196,
	2197, 2198, 2199, 2200, 2201, 2202, 2203, 2204, 2205, 2206, 2207, 2208, 2209, 2210, 2210, 2211,
	2212, 2213, 2214, 2215, 2216, 2217, 2218, 2219, 2220, 2221, 2221, 2222, 2223, 2224, 2225, 2226,
	2227, 2228, 2229, 2229, 2230, 2231, 2232, 2233, 2234, 2235, 2236, 2236, 2237, 2238, 2239, 2240,
	2241, 2242, 2242, 2243, 2244, 2245, 2246, 2247, 2248, 2248, 2249, 2250, 2251, 2252, 2253, 2253,
	2254, 2255, 2256, 2257, 2257, 2258, 2259, 2260, 2261, 2262, 2262, 2263, 2264, 2265, 2266, 2266,
	2267, 2268, 2269, 2270, 2270, 2271, 2272, 2273, 2273, 2274, 2275, 2276, 2277, 2277, 2278, 2279,
	2280, 2280, 2281, 2282, 2283, 2283, 2284, 2285, 2286, 2287, 2287, 2288, 2289, 2290, 2290, 2291,
	2292, 2293, 2293, 2294, 2295, 2295, 2296, 2297, 2298, 2298, 2299, 2300, 2301, 2301, 2302, 2303,
	2304,
};

ZP_FN int zp_ll_code(uint32_t ll) {
	if (ll < 16) return (int)ll;
	if (ll < 24) return 16 + (int)((ll - 16) >> 1);
	if (ll < 32) return 20 + (int)((ll - 24) >> 2);
	if (ll < 48) return 22 + (int)((ll - 32) >> 3);
	if (ll < 64) return 24;
	return zp_highbit(ll) + 19;
}

ZP_FN int zp_ml_code(uint32_t mlBase) { // match length - 3
	if (mlBase < 32) return (int)mlBase;
	if (mlBase < 40) return 32 + (int)((mlBase - 32) >> 1);
	if (mlBase < 48) return 36 + (int)((mlBase - 40) >> 2);
	if (mlBase < 64) return 38 + (int)((mlBase - 48) >> 3);
	if (mlBase < 96) return 40 + (int)((mlBase - 64) >> 4);
	if (mlBase < 128) return 42;
	return zp_highbit(mlBase) + 36;
}

// ------------------------------------------------------------ bit writer

// Forward bit writer of zstd's backward-read streams: bits fill each byte
// from its low end; zp_bw_close appends the end mark.
typedef struct zp_bw {
	uint64_t acc;
	int n;
	uint8_t *p, *end;
	int ovf;
} zp_bw;

ZP_FN void zp_bw_init(zp_bw *b, uint8_t *p, uint8_t *end) {
	b->acc = 0;
	b->n = 0;
	b->p = p;
	b->end = end;
	b->ovf = 0;
}

ZP_FN void zp_bw_add(zp_bw *b, uint32_t v, int nb) { // nb <= 31, b->n + nb <= 64
	b->acc |= (uint64_t)(v & ((1u << nb) - 1)) << b->n;
	b->n += nb;
}

ZP_FN void zp_bw_flush(zp_bw *b) {
	while (b->n >= 8) {
		if (b->p < b->end)
			*b->p++ = (uint8_t)b->acc;
		else
			b->ovf = 1;
		b->acc >>= 8;
		b->n -= 8;
	}
}

// zp_bw_close writes the end mark and the last byte; it returns the end,
// or NULL when the stream did not fit.
ZP_FN uint8_t *zp_bw_close(zp_bw *b) {
	zp_bw_add(b, 1, 1);
	zp_bw_flush(b);
	if (b->n > 0) {
		if (b->p < b->end)
			*b->p++ = (uint8_t)b->acc;
		else
			b->ovf = 1;
	}
	return b->ovf ? (uint8_t *)0 : b->p;
}

// ------------------------------------------------------------------- FSE

// zp_fse_normalize scales count[0..maxSym] (summing to total, at least two
// symbols present) to a distribution of 1 << tableLog with every present
// symbol at least 1: rounded, then points added where they save the most
// bits and removed where they cost the least (the gain of p -> p+1 is
// count * log2((p+1)/p) ~ count * 2/(2p+1)).
ZP_FN_BIG void zp_fse_normalize(const uint16_t *count, int maxSym, uint32_t total, int tableLog, int16_t *norm) {
	int T = 1 << tableLog, sum = 0;
	for (int s = 0; s <= maxSym; s++) {
		int n = 0;
		if (count[s]) {
			n = (int)((((uint32_t)count[s] << tableLog) + total / 2) / total);
			if (n < 1) n = 1;
		}
		norm[s] = (int16_t)n;
		sum += n;
	}
	while (sum < T) {
		int best = -1;
		for (int s = 0; s <= maxSym; s++) {
			if (!count[s]) continue;
			if (best < 0 || (uint32_t)count[s] * (uint32_t)(2 * norm[best] + 1) > (uint32_t)count[best] * (uint32_t)(2 * norm[s] + 1)) best = s;
		}
		norm[best]++;
		sum++;
	}
	while (sum > T) {
		int best = -1;
		for (int s = 0; s <= maxSym; s++) {
			if (norm[s] <= 1) continue;
			if (best < 0 || (uint32_t)count[s] * (uint32_t)(2 * norm[best] - 1) < (uint32_t)count[best] * (uint32_t)(2 * norm[s] - 1)) best = s;
		}
		norm[best]--;
		sum--;
	}
}

// zp_fse_cost estimates the bits of coding count[] with norm[] (Q8).
ZP_FN_BIG uint32_t zp_fse_cost(const uint16_t *count, int maxSym, const int16_t *norm, int normMax, int tableLog) {
	uint32_t bits = 0;
	for (int s = 0; s <= maxSym; s++) {
		if (!count[s]) continue;
		int p = s <= normMax ? norm[s] : 0;
		if (p == 0) return 0xFFFFFFFFu;
		if (p < 0) p = 1;
		bits += (uint32_t)count[s] * (uint32_t)((tableLog << 8) - (p <= 512 ? zp_log2q8_tab[p] : zp_log2q8((uint32_t)p)));
	}
	return bits;
}

// zp_fse_write_ncount writes the FSE table description of norm[0..maxSym]
// (RFC 8878 4.1.1); it returns its length, or -1 when over cap.
ZP_FN_BIG int zp_fse_write_ncount(uint8_t *out, int cap, const int16_t *norm, int maxSym, int tableLog) {
	uint64_t bits = (uint64_t)(tableLog - 5);
	int nbits = 4, pos = 0;
	int tableSize = 1 << tableLog;
	int remaining = tableSize + 1, threshold = tableSize, nb = tableLog + 1;
	int sym = 0, prev0 = 0;
	while (sym <= maxSym && remaining > 1) {
		if (prev0) {
			int start = sym;
			while (sym <= maxSym && !norm[sym]) sym++;
			if (sym > maxSym) return -1; // cannot happen: the distribution sums to tableSize
			while (sym >= start + 24) {
				start += 24;
				bits |= (uint64_t)0xFFFF << nbits;
				nbits += 16;
				while (nbits >= 8) {
					if (pos >= cap) return -1;
					out[pos++] = (uint8_t)bits;
					bits >>= 8;
					nbits -= 8;
				}
			}
			while (sym >= start + 3) {
				start += 3;
				bits |= (uint64_t)3 << nbits;
				nbits += 2;
			}
			bits |= (uint64_t)(sym - start) << nbits;
			nbits += 2;
		}
		{
			int count = norm[sym++];
			int max = (2 * threshold - 1) - remaining;
			remaining -= count < 0 ? -count : count;
			count++;
			if (count >= threshold) count += max;
			bits |= (uint64_t)count << nbits;
			nbits += nb;
			nbits -= (count < max);
			prev0 = (count == 1);
			if (remaining < 1) return -1;
			while (remaining < threshold) {
				nb--;
				threshold >>= 1;
			}
		}
		while (nbits >= 8) {
			if (pos >= cap) return -1;
			out[pos++] = (uint8_t)bits;
			bits >>= 8;
			nbits -= 8;
		}
	}
	if (remaining != 1) return -1;
	if (nbits > 0) {
		if (pos >= cap) return -1;
		out[pos++] = (uint8_t)bits;
	}
	return pos;
}

// zp_fse_symbol sets a symbol's deltaNbBits and deltaFindState from its
// normalized count n (-1: "less than 1") and the states of the symbols
// before it (before), as FSE_buildCTable does.
ZP_FN void zp_fse_symbol(int n, int tableLog, int before, uint32_t *dnb, int16_t *dfs) {
	const uint32_t tableSize = 1u << tableLog;
	if (n == 0) {
		*dnb = ((uint32_t)(tableLog + 1) << 16) - tableSize;
		*dfs = 0;
	} else if (n == -1 || n == 1) {
		*dnb = ((uint32_t)tableLog << 16) - tableSize;
		*dfs = (int16_t)(before - 1);
	} else {
		const int maxBitsOut = tableLog - zp_highbit((uint32_t)(n - 1));
		*dnb = ((uint32_t)maxBitsOut << 16) - ((uint32_t)n << maxBitsOut);
		*dfs = (int16_t)(before - n);
	}
}

// zp_fse_build fills an encoding table from norm[0..maxSym] (-1: "less
// than 1"), spreading symbols exactly as the decoder does (RFC 8878
// 4.1.1): tsym is tableSize bytes of scratch, cumul maxSym + 2 entries.
ZP_FN_BIG void zp_fse_build(uint16_t *state, int16_t *dfs, uint32_t *dnb, const int16_t *norm, int maxSym, int tableLog,
	uint8_t *tsym, uint16_t *cumul) {
	int tableSize = 1 << tableLog, mask = tableSize - 1;
	int step = (tableSize >> 1) + (tableSize >> 3) + 3;
	int high = tableSize - 1;
	cumul[0] = 0;
	for (int s = 1; s <= maxSym + 1; s++) {
		if (norm[s - 1] == -1) {
			cumul[s] = (uint16_t)(cumul[s - 1] + 1);
			tsym[high--] = (uint8_t)(s - 1);
		} else {
			cumul[s] = (uint16_t)(cumul[s - 1] + norm[s - 1]);
		}
	}
	int pos = 0;
	for (int s = 0; s <= maxSym; s++) {
		for (int i = 0; i < norm[s]; i++) {
			tsym[pos] = (uint8_t)s;
			pos = (pos + step) & mask;
			while (pos > high) pos = (pos + step) & mask;
		}
	}
	for (int u = 0; u < tableSize; u++) {
		int s = tsym[u];
		state[cumul[s]++] = (uint16_t)(tableSize + u);
	}
	int total = 0;
	for (int s = 0; s <= maxSym; s++) {
		zp_fse_symbol(norm[s], tableLog, total, &dnb[s], &dfs[s]);
		total += norm[s] == -1 ? 1 : norm[s];
	}
}

// zp_fse_init returns the first state of a stream for symbol s: the
// symbol's lowest state, as FSE_initCState2 picks.
ZP_FN uint32_t zp_fse_init(const uint16_t *state, const int16_t *dfs, const uint32_t *dnb, int s) {
	uint32_t nbOut = (dnb[s] + (1u << 15)) >> 16;
	uint32_t v = (nbOut << 16) - dnb[s];
	return state[(int)(v >> nbOut) + dfs[s]];
}

ZP_FN uint32_t zp_fse_encode(zp_bw *b, uint32_t st, const uint16_t *state, const int16_t *dfs, const uint32_t *dnb, int s) {
	uint32_t nbOut = (st + dnb[s]) >> 16;
	zp_bw_add(b, st, (int)nbOut);
	return state[(int)(st >> nbOut) + dfs[s]];
}

// --------------------------------------------------------- 1: sequences

ZP_FN uint32_t zp_hash(const uint8_t *s, int p, int mm, int hb) {
	if (mm == 4) return (zp_rd32(s, p) * 2654435761u) >> (32 - hb);
	if (mm == 3) return ((zp_rd32(s, p) << 8) * 2654435761u) >> (32 - hb);
	return (uint32_t)(((zp_rd64(s, p) << (64 - 8 * mm)) * 0xCF1BBCDCB7A56463ull) >> (64 - hb));
}

// zp_match_len counts the bytes from b that equal those from a (a < b),
// up to the end of the page.
ZP_FN int zp_match_len(const uint8_t *s, int a, int b) {
	int n = 0;
	while (b + n + 8 <= ZP_PAGE) {
		uint64_t x = zp_ld64(s, a + n) ^ zp_ld64(s, b + n);
		if (x) return n + (zp_ctz64(x) >> 3);
		n += 8;
	}
	while (b + n < ZP_PAGE && s[a + n] == s[b + n]) n++;
	return n;
}

// zp_offval returns the offset value coding a match at offset off after
// ll literals, given the repeat offsets (RFC 8878 3.1.2.5).
ZP_FN uint32_t zp_offval(uint32_t off, uint32_t ll, const uint32_t *rep) {
	if (ll > 0) {
		if (off == rep[0]) return 1;
		if (off == rep[1]) return 2;
		if (off == rep[2]) return 3;
	} else {
		if (off == rep[1]) return 1;
		if (off == rep[2]) return 2;
		if (off == rep[0] - 1) return 3;
	}
	return off + 3;
}

ZP_FN void zp_rep_update(uint32_t *rep, uint32_t offval, uint32_t ll) {
	if (offval > 3) {
		rep[2] = rep[1];
		rep[1] = rep[0];
		rep[0] = offval - 3;
		return;
	}
	uint32_t idx = offval - 1 + (ll == 0);
	if (idx == 0) return;
	uint32_t r = idx == 3 ? rep[0] - 1 : rep[idx];
	if (idx != 1) rep[2] = rep[1];
	rep[1] = rep[0];
	rep[0] = r;
}

// Match scoring (tuned on the corpus, see internal/zstdpage's TestSweep):
// a match's gain is ZP_GAIN_BYTE per byte, less the bits of its offset
// value, plus ZP_REP_BONUS for a repeat code; a match one (two) positions
// later replaces it when its gain is more than ZP_LAZY1 (ZP_LAZY2)
// higher; a match needs a gain of ZP_MIN_GAIN.
#ifndef ZP_GAIN_BYTE
#define ZP_GAIN_BYTE 3
#endif
#ifndef ZP_REP_BONUS
#define ZP_REP_BONUS 1
#endif
#ifndef ZP_LAZY1
#define ZP_LAZY1 3
#endif
#ifndef ZP_LAZY2
#define ZP_LAZY2 5
#endif
#ifndef ZP_MIN_GAIN
#define ZP_MIN_GAIN -1000
#endif

#ifndef ZP_NO_CHAIN_MF // the host's match finder (the GPU kernel has its own)
typedef struct zp_match {
	int ml, off, gain;
} zp_match;

// Matcher state of stage 1.
typedef struct zp_mf {
	const uint8_t *src;
	uint16_t *head, *chain;
	int hb, mm, rep_min, depth, use_rep;
	int next_ins, hlimit, anchor;
	uint32_t rep[3];
} zp_mf;

// zp_search inserts the positions up to p in the hash chains and returns
// the best-scoring match at p (ml 0 when none): the repeat offsets first,
// then up to depth chain candidates, nearest first.
ZP_FN zp_match zp_search(zp_mf *m, int p) {
	zp_match best;
	best.ml = 0;
	best.off = 0;
	best.gain = -0x7FFFFFFF;
	int lim = p < m->hlimit ? p : m->hlimit;
	while (m->next_ins <= lim) {
		int q = m->next_ins++;
		uint32_t h = zp_hash(m->src, q, m->mm, m->hb);
		m->chain[q] = m->head[h];
		m->head[h] = (uint16_t)q;
	}
	uint32_t ll = (uint32_t)(p - m->anchor);
	if (m->use_rep) {
		for (int i = 0; i < 3; i++) {
			uint32_t off = ll > 0 ? m->rep[i] : (i < 2 ? m->rep[i + 1] : m->rep[0] - 1);
			if (off == 0 || off > (uint32_t)p) continue;
			int ml = zp_match_len(m->src, p - (int)off, p);
			if (ml < m->rep_min) continue;
			int gain = ml * ZP_GAIN_BYTE - zp_highbit((uint32_t)i + 1) + ZP_REP_BONUS;
			if (gain > best.gain) {
				best.ml = ml;
				best.off = (int)off;
				best.gain = gain;
			}
		}
	}
	if (p <= m->hlimit && p + best.ml < ZP_PAGE) {
		// Chain candidates come nearest first: a later one wins only by
		// being longer than every match so far, so it must first agree at
		// that length.
		int longest = best.ml > m->mm - 1 ? best.ml : m->mm - 1;
		uint32_t c = m->chain[p];
		for (int d = 0; d < m->depth && c != ZP_EMPTY; d++) {
			if (m->src[c + longest] == m->src[p + longest]) {
				int ml = zp_match_len(m->src, (int)c, p);
				if (ml > longest) {
					longest = ml;
					uint32_t off = (uint32_t)p - c;
					uint32_t ov = m->use_rep ? zp_offval(off, ll, m->rep) : off + 3;
					int gain = ml * ZP_GAIN_BYTE - zp_highbit(ov) + (ov <= 3 ? ZP_REP_BONUS : 0);
					if (gain > best.gain) {
						best.ml = ml;
						best.off = (int)off;
						best.gain = gain;
					}
					if (p + ml >= ZP_PAGE) break;
				}
			}
			c = m->chain[c];
		}
	}
	return best;
}

// zp_find_sequences parses the page into ws->seq_* with options o (as
// zp_sanitize leaves them); it returns the number of sequences; the
// literals after the last one run to the end of the page.
ZP_FN int zp_find_sequences(const uint8_t *src, zp_workspace *ws, const zp_options *o) {
	zp_mf m;
	m.src = src;
	m.head = ws->u.mf.head;
	m.chain = ws->u.mf.chain;
	m.hb = o->hash_bits;
	m.mm = o->min_match;
	m.rep_min = o->rep_min;
	m.depth = o->depth;
	m.use_rep = o->rep;
	m.next_ins = 0;
	m.hlimit = ZP_PAGE - (m.mm > 4 ? m.mm : 4);
	m.anchor = 0;
	m.rep[0] = 1;
	m.rep[1] = 4;
	m.rep[2] = 8;
	for (int i = 0; i < (1 << m.hb); i++) m.head[i] = (uint16_t)ZP_EMPTY;
	int minml = m.mm < m.rep_min ? m.mm : m.rep_min;
	int ilimit = ZP_PAGE - minml;
	int nseq = 0, ip = 1;
	while (ip <= ilimit && nseq < ZP_MAX_SEQ) {
		zp_match best = zp_search(&m, ip);
		if (best.ml == 0 || best.gain < ZP_MIN_GAIN) {
			ip++;
			continue;
		}
		int start = ip;
		// Lazy look-ahead: a match one (two) positions later must beat this
		// one by more than the literal it leaves.
		for (;;) {
			if (o->lazy >= 1 && start + 1 <= ilimit) {
				zp_match c = zp_search(&m, start + 1);
				if (c.ml && c.gain > best.gain + ZP_LAZY1) {
					best = c;
					start++;
					continue;
				}
				if (o->lazy >= 2 && start + 2 <= ilimit) {
					c = zp_search(&m, start + 2);
					if (c.ml && c.gain > best.gain + ZP_LAZY2) {
						best = c;
						start += 2;
						continue;
					}
				}
			}
			break;
		}
		// Extend the match backwards over equal literals.
		int ml = best.ml, off = best.off;
		while (start > m.anchor && start - off > 0 && src[start - 1] == src[start - 1 - off]) {
			start--;
			ml++;
		}
		uint32_t ll = (uint32_t)(start - m.anchor);
		uint32_t ov = m.use_rep ? zp_offval((uint32_t)off, ll, m.rep) : (uint32_t)off + 3;
		zp_rep_update(m.rep, ov, ll);
		ws->seq_ll[nseq] = (uint16_t)ll;
		ws->seq_ml[nseq] = (uint16_t)ml;
		ws->seq_of[nseq] = (uint16_t)ov;
		nseq++;
		ip = start + ml;
		m.anchor = ip;
	}
	return nseq;
}

// zp_gather_literals copies the literals to ws->u.lit.lit; it returns
// their number.
#endif

ZP_FN int zp_gather_literals(const uint8_t *src, zp_workspace *ws, int nseq) {
	uint8_t *lit = ws->u.lit.lit;
	int pos = 0, n = 0;
	for (int i = 0; i < nseq; i++) {
		int ll = ws->seq_ll[i];
		for (int k = 0; k < ll; k++) lit[n + k] = src[pos + k];
		n += ll;
		pos += ll + ws->seq_ml[i];
	}
	for (; pos < ZP_PAGE; pos++) lit[n++] = src[pos];
	return n;
}

// ----------------------------------------------------------- 2: literals

ZP_FN int zp_lit_header_raw(uint8_t *op, int type, int n) {
	if (n < 32) {
		op[0] = (uint8_t)(type | (n << 3));
		return 1;
	}
	if (n < 4096) {
		op[0] = (uint8_t)(type | (1 << 2) | ((n & 15) << 4));
		op[1] = (uint8_t)(n >> 4);
		return 2;
	}
	op[0] = (uint8_t)(type | (3 << 2) | ((n & 15) << 4));
	op[1] = (uint8_t)(n >> 4);
	op[2] = (uint8_t)(n >> 12);
	return 3;
}

ZP_FN int zp_lit_header_raw_size(int n) { return n < 32 ? 1 : n < 4096 ? 2 : 3; }

// zp_huf_sort sets ws->u.lit.sym to the present symbols by ascending count,
// ties by symbol (a two-pass LSD radix sort on the count's low 6 and high
// 7 bits, with hcode and depth as scratch), and returns their number.
ZP_FN_BIG int zp_huf_sort(zp_workspace *ws) {
	const uint16_t *hist = ws->u.lit.hist;
	uint16_t *sym = ws->u.lit.sym, *tmp = ws->u.lit.depth, *bucket = ws->u.lit.hcode;
	int n = 0;
	for (int i = 0; i < 64; i++) bucket[i] = 0;
	for (int s = 0; s < 256; s++)
		if (hist[s]) {
			bucket[hist[s] & 63]++;
			n++;
		}
	for (int i = 0, sum = 0; i < 64; i++) {
		int c = bucket[i];
		bucket[i] = (uint16_t)sum;
		sum += c;
	}
	for (int s = 0; s < 256; s++)
		if (hist[s]) tmp[bucket[hist[s] & 63]++] = (uint16_t)s;
	// Two or more symbols: every count is below ZP_PAGE.
	const int high = ZP_PAGE >> 6 < 128 ? 128 : ZP_PAGE >> 6;
	for (int i = 0; i < high; i++) bucket[i] = 0;
	for (int i = 0; i < n; i++) bucket[hist[tmp[i]] >> 6]++;
	for (int i = 0, sum = 0; i < high; i++) {
		int c = bucket[i];
		bucket[i] = (uint16_t)sum;
		sum += c;
	}
	for (int i = 0; i < n; i++) sym[bucket[hist[tmp[i]] >> 6]++] = tmp[i];
	return n;
}

// zp_huf_mk turns the n >= 2 ascending counts in A into the depths of a
// Huffman tree's leaves, A[i] the depth of count i (Moffat & Katajainen,
// in place). The
// heads of both queues stay in registers: vr is A[root] while root < next
// (an internal node's weight; with root == next none waits), vl A[leaf].
ZP_FN_BIG void zp_huf_mk(uint16_t *A, int n) {
	int root = 0, leaf = 2, next;
	A[0] = (uint16_t)(A[0] + A[1]);
	uint32_t vr = A[0], vl = leaf < n ? A[leaf] : 0;
	for (next = 1; next < n - 1; next++) {
		uint32_t w;
		if (leaf >= n || (root < next && vr < vl)) {
			w = vr;
			A[root++] = (uint16_t)next;
			vr = A[root];
		} else {
			w = vl;
			leaf++;
			vl = leaf < n ? A[leaf] : 0;
		}
		if (leaf >= n || (root < next && vr < vl)) {
			w += vr;
			A[root++] = (uint16_t)next;
			vr = A[root];
		} else {
			w += vl;
			leaf++;
			vl = leaf < n ? A[leaf] : 0;
		}
		A[next] = (uint16_t)w;
		if (root == next) vr = w;
	}
	A[n - 2] = 0;
	for (next = n - 3; next >= 0; next--) A[next] = (uint16_t)(A[A[next]] + 1);
	int avbl = 1, used = 0, dpth = 0;
	root = n - 2;
	next = n - 1;
	while (avbl > 0) {
		while (root >= 0 && A[root] == dpth) {
			used++;
			root--;
		}
		while (avbl > used) {
			A[next--] = (uint16_t)dpth;
			avbl--;
		}
		avbl = 2 * used;
		dpth++;
		used = 0;
	}
}

// zp_huf_depths counts the unlimited Huffman code lengths of the n >= 2
// sorted symbols: dc[d] symbols of length d, d <= 32.
ZP_FN_BIG void zp_huf_depths(zp_workspace *ws, int n, int *dc) {
	const uint16_t *hist = ws->u.lit.hist, *sym = ws->u.lit.sym;
	uint16_t *A = ws->u.lit.depth;
	for (int i = 0; i < n; i++) A[i] = hist[sym[i]];
	zp_huf_mk(A, n);
	for (int i = 0; i <= 32; i++) dc[i] = 0;
	for (int i = 0; i < n; i++) dc[A[i] > 32 ? 32 : A[i]]++;
}

// zp_huf_limit sets blc[0..limit] to the counts of code lengths limited
// to limit bits, from the unlimited ones dc, keeping the code complete
// (as miniz does), and returns the longest length used.
ZP_FN int zp_huf_limit(const int *dc, int limit, int *blc) {
	for (int i = 0; i <= limit; i++) blc[i] = dc[i];
	for (int i = limit + 1; i <= 32; i++) blc[limit] += dc[i];
	uint32_t total = 0;
	for (int i = limit; i > 0; i--) total += (uint32_t)blc[i] << (limit - i);
	while (total != (1u << limit)) {
		blc[limit]--;
		for (int i = limit - 1; i > 0; i--) {
			if (blc[i]) {
				blc[i]--;
				blc[i + 1] += 2;
				break;
			}
		}
		total--;
	}
	for (int len = limit; len > 0; len--)
		if (blc[len]) return len;
	return 0;
}

// zp_huf_lengths sets hlen[] to Huffman code lengths of the n >= 2 sorted
// symbols, limited to limit bits (the longest codes to the rarest
// symbols), and returns the longest.
ZP_FN_BIG int zp_huf_lengths(zp_workspace *ws, int n, int limit) {
	const uint16_t *sym = ws->u.lit.sym;
	uint8_t *hlen = ws->u.lit.hlen;
	int dc[33], blc[33];
	zp_huf_depths(ws, n, dc);
	int maxBits = zp_huf_limit(dc, limit, blc);
	for (int s = 0; s < 256; s++) hlen[s] = 0;
	int k = 0;
	for (int len = limit; len > 0; len--)
		for (int c = 0; c < blc[len]; c++) hlen[sym[k++]] = (uint8_t)len;
	return maxBits;
}

// zp_huf_codes assigns the canonical codes of RFC 8878 4.2.1.3 (codes of
// a length in symbol order, longest lengths lowest).
ZP_FN_BIG void zp_huf_codes(zp_workspace *ws, int maxBits) {
	uint16_t nb[ZP_HUF_MAX_BITS + 2], val[ZP_HUF_MAX_BITS + 2];
	for (int i = 0; i < ZP_HUF_MAX_BITS + 2; i++) nb[i] = 0;
	for (int s = 0; s < 256; s++) nb[ws->u.lit.hlen[s]]++;
	uint32_t min = 0;
	for (int n = maxBits; n > 0; n--) {
		val[n] = (uint16_t)min;
		min += nb[n];
		min >>= 1;
	}
	for (int s = 0; s < 256; s++) {
		int l = ws->u.lit.hlen[s];
		ws->u.lit.hcode[s] = l ? val[l]++ : 0;
	}
}

// zp_huf_weights_fse writes the Huffman weights w[0..n-1] FSE-compressed
// with a table of 1 << tl (RFC 8878 4.2.1.2): the table description, then
// one bitstream of two interleaved states (even weights on the first,
// odd ones on the second). It returns the length (estimated, with only the
// table description written, unless exact), or -1 when over cap or when
// the weights have fewer than two values. With counted, ws->u.lit.wcount
// already counts the weights.
ZP_FN_BIG int zp_huf_weights_fse(zp_workspace *ws, const uint8_t *w, int n, int tl, uint8_t *out, int cap, int exact, int counted) {
	uint16_t *cnt = ws->u.lit.wcount;
	int16_t *norm = ws->u.lit.wnorm;
	zp_fse_ct_small *ct = &ws->u.lit.wct;
	int maxW = 0, distinct = 0;
	if (n < 2) return -1;
	if (!counted) {
		for (int i = 0; i < 16; i++) cnt[i] = 0;
		for (int i = 0; i < n; i++) cnt[w[i]]++;
	}
	for (int i = 0; i < 16; i++) {
		if (cnt[i]) {
			maxW = i;
			distinct++;
		}
	}
	if (distinct < 2) return -1;
	zp_fse_normalize(cnt, maxW, (uint32_t)n, tl, norm);
	int h = zp_fse_write_ncount(out, cap, norm, maxW, tl);
	if (h < 0) return -1;
	if (!exact) return h + (int)((zp_fse_cost(cnt, maxW, norm, maxW, tl) + (uint32_t)(2 * tl + 8) * 256) >> 11);
	zp_fse_build(ct->state, ct->dfs, ct->dnb, norm, maxW, tl, ws->u.lit.tsym, ws->u.lit.wcumul);
	zp_bw b;
	zp_bw_init(&b, out + h, out + cap);
	uint32_t st[2];
	st[(n - 1) & 1] = zp_fse_init(ct->state, ct->dfs, ct->dnb, w[n - 1]);
	st[(n - 2) & 1] = zp_fse_init(ct->state, ct->dfs, ct->dnb, w[n - 2]);
	for (int i = n - 3; i >= 0; i--) {
		st[i & 1] = zp_fse_encode(&b, st[i & 1], ct->state, ct->dfs, ct->dnb, w[i]);
		zp_bw_flush(&b);
	}
	zp_bw_add(&b, st[1], tl);
	zp_bw_add(&b, st[0], tl);
	uint8_t *e = zp_bw_close(&b);
	if (!e) return -1;
	return (int)(e - out);
}

// zp_huf_stream writes lit[from..to) as one Huffman-coded stream, last
// literal first, so that the decoder reads the first one first.
ZP_FN_BIG uint8_t *zp_huf_stream(const zp_workspace *ws, int from, int to, uint8_t *op, uint8_t *oend) {
	const uint8_t *lit = ws->u.lit.lit, *hlen = ws->u.lit.hlen;
	const uint16_t *hcode = ws->u.lit.hcode;
	zp_bw b;
	zp_bw_init(&b, op, oend);
	for (int i = to - 1; i >= from; i--) {
		int c = lit[i];
		zp_bw_add(&b, hcode[c], hlen[c]);
		if (b.n >= 32) zp_bw_flush(&b);
	}
	return zp_bw_close(&b);
}

// zp_huf_tree chooses the description of the Huffman tree whose weights
// are in ws->u.lit.weight[0..maxSym) (counted in wcount when counted):
// direct 4-bit weights or FSE-compressed ones, the smaller (treeFse,
// treeLen). It returns its size (estimated unless exact), or 0x7FFF when
// it cannot be written.
ZP_FN_BIG int zp_huf_tree(zp_workspace *ws, int maxSym, int exact, int counted) {
	const uint8_t *w = ws->u.lit.weight;
	uint8_t *tree = ws->u.lit.tree;
	int direct = maxSym <= 128 ? 1 + (maxSym + 1) / 2 : 0x7FFF;
#if ZP_HUF_WEIGHT_LOG5
	int f5 = zp_huf_weights_fse(ws, w, maxSym, 5, tree, 128, exact, counted);
	counted = 1;
#else
	int f5 = 0;
#endif
	int f6 = zp_huf_weights_fse(ws, w, maxSym, 6, tree + 128, 127, exact, counted);
	int fse = 0x7FFF, fseAt = 0;
	if (f5 > 0 && f5 < 128) fse = f5;
	if (f6 > 0 && f6 < 128 && f6 < fse) {
		fse = f6;
		fseAt = 128;
	}
	int treeSize = direct;
	ws->u.lit.treeFse = -1;
	if (1 + fse < direct) {
		treeSize = 1 + fse;
		ws->u.lit.treeFse = (int16_t)fseAt;
		ws->u.lit.treeLen = (int16_t)fse;
	}
	return treeSize >= 0x7FFF ? 0x7FFF : treeSize;
}

// zp_huf_plan builds the Huffman code of the literals limited to limit
// bits and its tree description (direct or FSE weights, the smaller); it
// returns the Compressed_Size of the literals (description, jump table,
// streams; estimated unless exact), or 0x7FFF when the description cannot
// be written.
ZP_FN_BIG int zp_huf_plan(zp_workspace *ws, int n, int nsorted, int maxSym, int limit, int exact) {
	const uint8_t *lit = ws->u.lit.lit, *hlen = ws->u.lit.hlen;
	uint8_t *w = ws->u.lit.weight;
	int maxBits = zp_huf_lengths(ws, nsorted, limit);
	ws->u.lit.maxBits = (uint8_t)maxBits;
	for (int s = 0; s < maxSym; s++) w[s] = (uint8_t)(hlen[s] ? maxBits + 1 - hlen[s] : 0);
	int treeSize = zp_huf_tree(ws, maxSym, exact, 0);
	if (treeSize >= 0x7FFF) return 0x7FFF;
	int four = n > 1023, seg = (n + 3) / 4;
	int streams = 0;
	if (!exact) {
		// Estimate: each stream's end mark and padding taken as 4.5 bits.
		uint32_t bits = 0;
		const uint16_t *hist = ws->u.lit.hist;
		for (int s = 0; s <= maxSym; s++) bits += (uint32_t)hist[s] * hlen[s];
		return treeSize + (four ? 6 : 0) + (int)((2 * bits + (four ? 36 : 9)) >> 4);
	}
	for (int k = 0; k < (four ? 4 : 1); k++) {
		int from = four ? k * seg : 0, to = !four || k == 3 ? n : from + seg;
		uint32_t bits = 0;
		for (int i = from; i < to; i++) bits += hlen[lit[i]];
		streams += (int)((bits + 8) >> 3);
	}
	return treeSize + (four ? 6 : 0) + streams;
}

// zp_encode_literals writes the literals section for the n literals in
// ws->u.lit.lit: raw, RLE, or Huffman when allowed and smaller. It
// returns the end, or NULL when it does not fit before oend.
// zp_frame_header writes what precedes a page's one block: the magic, the
// Frame_Header_Descriptor (Single_Segment, a 2-byte Frame_Content_Size, no
// checksum, no dictionary) and the content size less 256 (7 bytes).
ZP_FN void zp_frame_header(uint8_t *dst) {
	dst[0] = 0x28;
	dst[1] = 0xB5;
	dst[2] = 0x2F;
	dst[3] = 0xFD;
	dst[4] = 0x60;
	dst[5] = (uint8_t)((ZP_PAGE - 256) & 0xFF);
	dst[6] = (uint8_t)((ZP_PAGE - 256) >> 8);
}

// zp_block_header writes the 3-byte header of the last block: type 1 (RLE)
// or 2 (compressed), and its size (for RLE, the bytes it stands for).
ZP_FN void zp_block_header(uint8_t *dst, uint32_t type, uint32_t size) {
	uint32_t bh = size << 3 | type << 1 | 1u;
	dst[0] = (uint8_t)bh;
	dst[1] = (uint8_t)(bh >> 8);
	dst[2] = (uint8_t)(bh >> 16);
}

// zp_lit_plan is how zp_plan_literals lays out a literals section whose
// streams are still to be written (Huffman): stream k of streams covers
// literals [from[k], to[k]) and goes at at[k]; zp_finish_literals writes
// the section's header and jump table once they are.
typedef struct zp_lit_plan {
	int streams; // 0: the section is complete (raw or RLE); else 1 or 4
	int n, comp;
	int from[4], to[4];
	uint8_t *at[4];
	uint8_t *op, *end;
} zp_lit_plan;

// zp_plan_literals writes the literals section of the n literals in
// ws->u.lit.lit, or plans it (see zp_lit_plan); nil when it does not fit
// before oend. With hist_ready, ws->u.lit.hist already counts them.
ZP_FN_BIG int zp_plan_literals(zp_workspace *ws, int n, uint8_t *op, uint8_t *oend, int allow_huf, int hist_ready, zp_lit_plan *pl) {
	const uint8_t *lit = ws->u.lit.lit;
	uint16_t *hist = ws->u.lit.hist;
	pl->streams = 0;
	pl->n = n;
	pl->op = op;
	if (!hist_ready) {
		for (int s = 0; s < 256; s++) hist[s] = 0;
		for (int i = 0; i < n; i++) hist[lit[i]]++;
	}
	int distinct = 0, maxSym = 0;
	for (int s = 0; s < 256; s++) {
		if (hist[s]) {
			distinct++;
			maxSym = s;
		}
	}
	int rawh = zp_lit_header_raw_size(n);
	ZP_PROF(10);
	if (distinct == 1) {
		if (oend - op < rawh + 1) return 0;
		zp_lit_header_raw(op, 1, n);
		op[rawh] = lit[0];
		pl->end = op + rawh + 1;
		return 1;
	}
	if (allow_huf && distinct >= 2) {
		// Try code-length limits from 11 down: a shallower code can
		// cost fewer bits in its description than it adds in the streams.
		int nsorted = zp_huf_sort(ws);
		ZP_PROF(11);
		int bestComp = 0x7FFF, bestLimit = 0, lo = zp_highbit((uint32_t)distinct - 1) + 1;
		if (lo < ZP_HUF_MIN_LIMIT) lo = ZP_HUF_MIN_LIMIT;
		int tries = 0, top = ZP_HUF_MAX_BITS;
#if ZP_HUF_SRC_BITS
		// No deeper than libzstd's bound for n literals: the decoder
		// fills a table of 2^depth entries for every page it reads, and
		// on a page's few literals the deepest codes save little.
		if (zp_highbit((uint32_t)n - 1) - 1 < top) top = zp_highbit((uint32_t)n - 1) - 1;
		if (top < lo) top = lo;
#endif
		for (int limit = top; limit >= lo && tries < ZP_HUF_TRIES; limit--, tries++) {
			int c = zp_huf_plan(ws, n, nsorted, maxSym, limit, 0);
			if (c >= bestComp) break;
			bestComp = c;
			bestLimit = limit;
			// Limits above the unlimited code's depth change nothing.
			if (ws->u.lit.maxBits < limit) limit = ws->u.lit.maxBits;
		}
		ZP_PROF(12);
		int four = n > 1023, hdr = four ? 4 : 3;
		int comp = bestLimit ? zp_huf_plan(ws, n, nsorted, maxSym, bestLimit, 1) : 0x7FFF;
		// Sizes past 14 bits take the 18-bit format (frames of pages).
		if (four && (n > 16383 || comp > 16383)) hdr = 5;
		ZP_PROF(13);
		if (comp < 0x7FFF && (four || comp <= 1023) && hdr + comp < rawh + n) {
			if (oend - op < hdr + comp) return 0;
			zp_huf_codes(ws, ws->u.lit.maxBits);
			ZP_PROF(14);
			uint8_t *p = op + hdr;
			const uint8_t *w = ws->u.lit.weight;
			int tf = ws->u.lit.treeFse;
			if (tf < 0) {
				*p++ = (uint8_t)(127 + maxSym);
				for (int i = 0; i < maxSym; i += 2) *p++ = (uint8_t)(w[i] << 4 | (i + 1 < maxSym ? w[i + 1] : 0));
			} else {
				int len = ws->u.lit.treeLen;
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
				return 1;
			}
			// Each stream's size is known from its code lengths (its
			// bits and the end mark, rounded up to bytes), so all four
			// can be written at once.
			const uint8_t *hlen = ws->u.lit.hlen;
			int seg = (n + 3) / 4;
			uint8_t *jt = p;
			p += 6;
			for (int k = 0; k < 4; k++) {
				int from = k * seg, to = k == 3 ? n : from + seg;
				uint32_t bits = 0;
				for (int i = from; i < to; i++) bits += hlen[lit[i]];
				int size = (int)((bits + 8) >> 3);
				pl->from[k] = from;
				pl->to[k] = to;
				pl->at[k] = p;
				if (k < 3) {
					jt[2 * k] = (uint8_t)size;
					jt[2 * k + 1] = (uint8_t)(size >> 8);
				}
				p += size;
			}
			pl->streams = 4;
			ZP_PROF(15);
			return 1;
		}
	}
	if (oend - op < rawh + n) return 0;
	zp_lit_header_raw(op, 0, n);
	for (int i = 0; i < n; i++) op[rawh + i] = lit[i];
	pl->end = op + rawh + n;
	return 1;
}

// zp_finish_literals writes the header of a planned Huffman section once
// its streams are written, and returns its end.
ZP_FN_BIG uint8_t *zp_finish_literals(const zp_lit_plan *pl) {
	uint8_t *op = pl->op;
	if (pl->streams == 1) {
		uint32_t lh = 2u | (uint32_t)pl->n << 4 | (uint32_t)pl->comp << 14;
		op[0] = (uint8_t)lh;
		op[1] = (uint8_t)(lh >> 8);
		op[2] = (uint8_t)(lh >> 16);
	} else if (pl->streams == 4 && pl->n <= 16383 && pl->comp <= 16383) {
		uint32_t lh = 2u | 2u << 2 | (uint32_t)pl->n << 4 | (uint32_t)pl->comp << 18;
		op[0] = (uint8_t)lh;
		op[1] = (uint8_t)(lh >> 8);
		op[2] = (uint8_t)(lh >> 16);
		op[3] = (uint8_t)(lh >> 24);
	} else if (pl->streams == 4) {
		uint64_t lh = 2u | 3u << 2 | (uint64_t)pl->n << 4 | (uint64_t)pl->comp << 22;
		for (int i = 0; i < 5; i++) op[i] = (uint8_t)(lh >> (8 * i));
	}
	return pl->end;
}

// zp_encode_literals writes the literals section of the n literals in
// ws->u.lit.lit: raw, RLE or Huffman, whichever is smallest; nil when it
// does not fit before oend. (The GPU kernel runs the same plan, its
// streams on four lanes at once.)
ZP_FN_BIG uint8_t *zp_encode_literals(zp_workspace *ws, int n, uint8_t *op, uint8_t *oend, int allow_huf) {
	zp_lit_plan pl;
	if (!zp_plan_literals(ws, n, op, oend, allow_huf, 0, &pl)) return 0;
	for (int k = 0; k < pl.streams; k++) {
		uint8_t *next = k + 1 < pl.streams ? pl.at[k + 1] : pl.end;
		if (zp_huf_stream(ws, pl.from[k], pl.to[k], pl.at[k], next) != next) return 0;
	}
	return zp_finish_literals(&pl);
}

// --------------------------------------------------------- 3: sequences

// zp_seq_header writes the sequences section's count of sequences (nseq >
// 0) and returns its length.
ZP_FN int zp_seq_header(uint8_t *op, int nseq) {
	if (nseq < 128) {
		op[0] = (uint8_t)nseq;
		return 1;
	}
	op[0] = (uint8_t)((nseq >> 8) + 0x80);
	op[1] = (uint8_t)nseq;
	return 2;
}

// zp_seq_code returns the code of sequence i for type t (0 LL, 1 OF, 2 ML).
ZP_FN int zp_seq_code(const zp_workspace *ws, int t, int i) {
	return t == 0 ? zp_ll_code(ws->seq_ll[i]) : t == 1 ? zp_highbit(ws->seq_of[i]) : zp_ml_code((uint32_t)ws->seq_ml[i] - 3);
}

// zp_seq_plan_table chooses how type t is coded, from its counts in
// ws->u.seq.x.b.count[t] of nseq sequences: RLE when one code, else the
// predefined table or an FSE-compressed one (when allowed) of the tableLog
// with the smallest estimated size, its description in ncount[t]. It
// touches only type t's part of the workspace (the GPU plans the three
// types on three lanes) and returns 0 when no table can code the type.
ZP_FN_BIG int zp_seq_plan_table(zp_workspace *ws, int t, int nseq, int allow_fse, zp_seq_plan *sp) {
	const uint16_t *count = ws->u.seq.x.b.count[t];
	int16_t *norm = ws->u.seq.x.b.norm[t];
	uint8_t *ncount = ws->u.seq.x.b.ncount[t];
	const int16_t *def = t == 0 ? zp_ll_def : t == 1 ? zp_of_def : zp_ml_def;
	int defMax = t == 0 ? 35 : t == 1 ? 28 : 52;
	int defLog = t == 1 ? 5 : 6;
	int maxLog = t == 1 ? 8 : 9;
	int distinct = 0, maxSym = 0;
	for (int s = 0; s < 64; s++) {
		if (count[s]) {
			distinct++;
			maxSym = s;
		}
	}
	sp->maxs[t] = maxSym;
	sp->desc[t] = 0;
	if (distinct == 1) {
		sp->mode[t] = 1;
		sp->log[t] = 0;
		sp->desc[t] = 1;
		ncount[0] = (uint8_t)maxSym;
		return 1;
	}
	uint32_t best = zp_fse_cost(count, maxSym, def, defMax, defLog);
	if (best != 0xFFFFFFFFu) best += (uint32_t)defLog << 8;
	sp->mode[t] = 0;
	sp->log[t] = defLog;
	if (allow_fse || best == 0xFFFFFFFFu) {
		int bestLog = 0;
		int minLog = zp_highbit((uint32_t)distinct - 1) + 1;
		if (minLog < 5) minLog = 5;
		for (int tl = minLog; tl <= maxLog && tl <= ZP_FSE_TRY_MAX && tl < minLog + ZP_FSE_TRIES; tl++) {
			zp_fse_normalize(count, maxSym, (uint32_t)nseq, tl, norm);
			int h = zp_fse_write_ncount(ncount, 96, norm, maxSym, tl);
			if (h < 0) continue;
			uint32_t c = zp_fse_cost(count, maxSym, norm, maxSym, tl) + ((uint32_t)tl << 8) + ((uint32_t)h << 11);
			if (c < best) {
				best = c;
				bestLog = tl;
			}
		}
		if (bestLog) {
			sp->mode[t] = 2;
			sp->log[t] = bestLog;
			zp_fse_normalize(count, maxSym, (uint32_t)nseq, bestLog, norm);
			sp->desc[t] = zp_fse_write_ncount(ncount, 96, norm, maxSym, bestLog);
		}
	}
	return sp->mode[t] != 0 || best != 0xFFFFFFFFu;
}

// zp_seq_build_table builds type t's encoding table in ws->u.seq.ct[t]
// (none for RLE); like zp_seq_plan_table it touches only type t's part.
ZP_FN_BIG void zp_seq_build_table(zp_workspace *ws, int t, const zp_seq_plan *sp) {
	zp_fse_ct *ct = &ws->u.seq.ct[t];
	int16_t *norm = ws->u.seq.x.b.norm[t];
	int maxSym = sp->maxs[t];
	if (sp->mode[t] == 1) return;
	if (sp->mode[t] == 0) {
		const int16_t *def = t == 0 ? zp_ll_def : t == 1 ? zp_of_def : zp_ml_def;
		maxSym = t == 0 ? 35 : t == 1 ? 28 : 52;
		for (int s = 0; s <= maxSym; s++) norm[s] = def[s];
	}
	zp_fse_build(ct->state, ct->dfs, ct->dnb, norm, maxSym, sp->log[t], ws->u.seq.x.b.tsym[t], ws->u.seq.x.b.cumul[t]);
}

// zp_encode_sequences writes the sequences section for ws->seq_* (the
// tables as zp_seq_plan_table chooses them; the bitstream written last
// sequence first, the states interleaved as the decoder reads them). It
// returns the end, or NULL when over oend. (kernels/zstd.cu writes the
// same bytes with the warp.)
ZP_FN_BIG uint8_t *zp_encode_sequences(zp_workspace *ws, int nseq, uint8_t *op, uint8_t *oend, int allow_fse) {
	if (nseq == 0) {
		if (op >= oend) return 0;
		*op++ = 0;
		return op;
	}
	if (oend - op < 3) return 0;
	op += zp_seq_header(op, nseq);
	zp_seq_plan *sp = &ws->u.seq.plan;
	for (int t = 0; t < 3; t++)
		for (int s = 0; s < 64; s++) ws->u.seq.x.b.count[t][s] = 0;
	for (int i = 0; i < nseq; i++)
		for (int t = 0; t < 3; t++) ws->u.seq.x.b.count[t][zp_seq_code(ws, t, i)]++;
	ZP_PROF(20);
	for (int t = 0; t < 3; t++)
		if (!zp_seq_plan_table(ws, t, nseq, allow_fse, sp)) return 0;
	ZP_PROF(21);
	if (oend - op < 1 + sp->desc[0] + sp->desc[1] + sp->desc[2]) return 0;
	*op++ = (uint8_t)(sp->mode[0] << 6 | sp->mode[1] << 4 | sp->mode[2] << 2);
	for (int t = 0; t < 3; t++)
		for (int i = 0; i < sp->desc[t]; i++) *op++ = ws->u.seq.x.b.ncount[t][i];
	for (int t = 0; t < 3; t++) zp_seq_build_table(ws, t, sp);
	ZP_PROF(22);
	const int *mode = sp->mode, *log = sp->log;
	const zp_fse_ct *cl = &ws->u.seq.ct[0], *co = &ws->u.seq.ct[1], *cm = &ws->u.seq.ct[2];
	zp_bw b;
	zp_bw_init(&b, op, oend);
	uint32_t sl = 0, so = 0, sm = 0;
	for (int i = nseq - 1; i >= 0; i--) {
		uint32_t ll = ws->seq_ll[i], mlb = (uint32_t)ws->seq_ml[i] - 3, of = ws->seq_of[i];
		int lc = zp_ll_code(ll), mc = zp_ml_code(mlb), oc = zp_highbit(of);
		if (i == nseq - 1) {
			if (mode[2] != 1) sm = zp_fse_init(cm->state, cm->dfs, cm->dnb, mc);
			if (mode[1] != 1) so = zp_fse_init(co->state, co->dfs, co->dnb, oc);
			if (mode[0] != 1) sl = zp_fse_init(cl->state, cl->dfs, cl->dnb, lc);
		} else {
			if (mode[1] != 1) so = zp_fse_encode(&b, so, co->state, co->dfs, co->dnb, oc);
			if (mode[2] != 1) sm = zp_fse_encode(&b, sm, cm->state, cm->dfs, cm->dnb, mc);
			if (mode[0] != 1) sl = zp_fse_encode(&b, sl, cl->state, cl->dfs, cl->dnb, lc);
			zp_bw_flush(&b);
		}
		zp_bw_add(&b, ll - zp_ll_base[lc], zp_ll_bits[lc]);
		zp_bw_add(&b, mlb - zp_ml_base[mc], zp_ml_bits[mc]);
		zp_bw_add(&b, of, oc);
		zp_bw_flush(&b);
	}
	zp_bw_add(&b, sm, log[2]);
	zp_bw_add(&b, so, log[1]);
	zp_bw_add(&b, sl, log[0]);
	uint8_t *end = zp_bw_close(&b);
	ZP_PROF(23);
	return end;
}

// ------------------------------------------------------------- 4: frame

ZP_FN void zp_sanitize(zp_options *o) {
	if (o->hash_bits < 4) o->hash_bits = 4;
	if (o->hash_bits > ZP_HASH_BITS_MAX) o->hash_bits = ZP_HASH_BITS_MAX;
	if (o->min_match < 3) o->min_match = 3;
	if (o->min_match > 8) o->min_match = 8;
	if (o->rep_min < 3) o->rep_min = 3;
	if (o->rep_min > 8) o->rep_min = 8;
	if (o->depth < 1) o->depth = 1;
	if (o->depth > ZP_PAGE) o->depth = ZP_PAGE;
	if (o->lazy < 0) o->lazy = 0;
	if (o->lazy > 2) o->lazy = 2;
}

// zp_compress_page compresses the ZP_PAGE bytes at src into one zstd
// frame in dst and returns its length, or 0 when it would be ZP_PAGE bytes
// or more or longer than dst_cap. opt NULL means zp_defaults.
#ifndef ZP_NO_CHAIN_MF
ZP_FN int zp_compress_page(const uint8_t *src, uint8_t *dst, int dst_cap, zp_workspace *ws, const zp_options *opt) {
	zp_options o;
	if (opt)
		o = *opt;
	else
		zp_defaults(&o);
	zp_sanitize(&o);
	int cap = dst_cap < ZP_PAGE - 1 ? dst_cap : ZP_PAGE - 1;
	if (cap < 11) return 0;
	uint8_t *oend = dst + cap;
	zp_frame_header(dst);
	int same = 1;
	for (int i = 1; i < ZP_PAGE; i++) {
		if (src[i] != src[0]) {
			same = 0;
			break;
		}
	}
	if (same) {
		zp_block_header(dst + 7, 1, ZP_PAGE);
		dst[10] = src[0];
		return 11;
	}
	int nseq = zp_find_sequences(src, ws, &o);
	int nlit = zp_gather_literals(src, ws, nseq);
	uint8_t *op = zp_encode_literals(ws, nlit, dst + 10, oend, o.huffman);
	if (!op) return 0;
	op = zp_encode_sequences(ws, nseq, op, oend, o.fse_custom);
	if (!op) return 0;
	zp_block_header(dst + 7, 2, (uint32_t)(op - (dst + 10)));
	return (int)(op - dst);
}
#endif

#endif
