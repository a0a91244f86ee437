// zstd frames of several pages compressed hard, for the dense tier: an
// optimal parse (the kind libzstd's highest levels make) over a frame of
// up to ZP_PAGE bytes, coded as one block by zstd_page.h's stages 2 and 3.
// Portable C like zstd_page.h: the host tests it against libzstd
// (internal/zstddeep), and the GPU runs it a warp a frame.
//
// The includer sets ZP_PAGE (the largest frame, a multiple of 4096 up to
// 65535) and ZP_MAX_SEQ before including this header, and defines
// ZP_NO_CHAIN_MF: the page encoder's own match finder is not used.
//
// The parse, for each position of the frame in order:
//   - the matches that start there: the three repeat offsets as each of
//     the position's two ways in leaves them, the nearest earlier position with
//     the same three bytes, and up to ZD_DEPTH earlier positions with the
//     same four (a hash chain), each kept only where it is longer than
//     every nearer one. All but the repeat offsets are found for a block
//     of ZD_BLOCK positions before the parse walks them, each position's
//     alone, so that a warp can find a block's a lane a position;
//   - every length of those matches is priced (its literal length's, match
//     length's and offset's codes and extra bits, in 1/256 bits, from
//     statistics below), and the cheapest way to reach each of the next
//     ZD_RING positions by a match, and the cheapest by a literal, are
//     kept with the repeat offsets they leave (zd_node). A match
//     of ZD_SUFFICIENT bytes or more is taken at once, and the parse goes
//     on from its end, as libzstd's optimal parser does.
// The cheapest path to the frame's end is then walked back into
// sequences. The statistics are the frame's bytes and zstd's predefined
// distributions at first; the frame is then parsed again (ZD_PASSES in
// all) with those of the parse before, as libzstd's btultra2 does; each
// pass's statistics are nearer the frame's own (4 passes store 0.3 % more
// than 3 on the corpus).
//
// zd_compress_frame returns the frame's length, or 0 when it would not be
// smaller than its content or not fit dst_cap. It writes only below
// dst + dst_cap and reads only the n bytes of src.

#ifndef GZRAMD_ZSTD_DEEP_H
#define GZRAMD_ZSTD_DEEP_H

#include "zstd_page.h"

// On the GPU a warp compresses a frame: its lanes find a block's
// candidates, a lane a position, and lane 0 does the rest; on the host one
// thread does all of it. Both write the same bytes.
#ifdef __CUDACC__
#define ZD_LANES 32
#define ZD_LANE ((int)(threadIdx.x & 31))
#define ZD_SYNC() __syncwarp()
#define ZD_BCAST(x) __shfl_sync(0xFFFFFFFFu, (x), 0)
#else
#define ZD_LANES 1
#define ZD_LANE 0
#define ZD_SYNC()
#define ZD_BCAST(x) (x)
#endif

#ifndef ZD_HASH_BITS
#define ZD_HASH_BITS 14
#endif
#ifndef ZD_HASH3_BITS
#define ZD_HASH3_BITS 12
#endif
#ifndef ZD_DEPTH
#define ZD_DEPTH 64
#endif
#ifndef ZD_SUFFICIENT
#define ZD_SUFFICIENT 200
#endif
#ifndef ZD_PASSES
#define ZD_PASSES 4
#endif
// Candidates a position keeps beside its repeat offsets: the 3-byte one,
// and those of the chain that were longer than every nearer one.
#ifndef ZD_CANDS
#define ZD_CANDS 16
#endif
// Positions whose candidates are found together (a warp's lanes on the
// GPU), and the positions ahead whose cheapest ways in are kept (more than
// ZD_SUFFICIENT, a power of two).
#define ZD_BLOCK 32
#ifndef ZD_RING
#define ZD_RING 256
#endif
#define ZD_NONE 0xFFFFu
#define ZD_INF 0x7FFFFFFF

// A way into a position: its price, the match that ends there (len 0
// for a literal) and its offset, the literals since the last match, the
// repeat offsets the path leaves, and the way (ZD_MATCHED or ZD_LITERAL)
// into the position the step left from.
typedef struct zd_node {
	int32_t price;
	uint16_t len, off, lit, from;
	uint16_t rep[3];
} zd_node;

// Each position keeps its cheapest way in by a match and its cheapest by
// a literal. One way alone (the cheapest) loses paths that cost a little
// more to reach a position but leave it better placed: a match that ends
// there starts the next literal run at 0, and the repeat offsets of the
// two differ. libzstd's optimal parser looks one position past a match for
// the same reason.
#define ZD_MATCHED 0
#define ZD_LITERAL 1

// Prices in 1/256 bits: each literal byte, and each code of the three
// sequence types without its extra bits.
typedef struct zd_prices {
	int32_t lit[256];
	int32_t ll[36], ml[53], of[32];
} zd_prices;

// A position's matches from one way in, for the warp's lanes to relax:
// each match's length and offset, the price up to its match length's, and
// the repeat offsets it leaves.
typedef struct zd_offer {
	int32_t nc;
	int32_t cl[3 + ZD_CANDS], co[3 + ZD_CANDS], price[3 + ZD_CANDS];
	uint16_t after[3 + ZD_CANDS][3];
} zd_offer;

typedef struct zd_scratch {
	zd_node ring[ZD_RING][2];
	// Each position's ways in, once final: by a match, the way it left
	// from << 31 | its length << 16 | its offset; by a literal, the way it
	// left from.
	uint32_t back[ZP_PAGE + 1];
	uint8_t litfrom[ZP_PAGE + 1];
	uint16_t head[1 << ZD_HASH_BITS];
	uint16_t head3[1 << ZD_HASH3_BITS];
	uint16_t chain[ZP_PAGE], prev3[ZP_PAGE];
	// A block's candidates (zd_candidates).
	uint16_t cl[ZD_BLOCK][ZD_CANDS], co[ZD_BLOCK][ZD_CANDS];
	uint8_t nc[ZD_BLOCK];
	// The chosen matches, as the walk back finds them (last first).
	uint16_t mstart[ZP_PAGE / 3 + 1], mlen[ZP_PAGE / 3 + 1], moff[ZP_PAGE / 3 + 1];
	zd_prices pr;
	zd_offer offers[2];
	// Counts for the prices, here rather than on a GPU thread's stack.
	uint32_t hist[256], cll[36], cml[53], cof[32];
} zd_scratch;

// On the GPU the ring, the prices and a position's offers, which the parse
// reads and writes at every position, are in the block's shared memory (a
// block is a warp, a frame); on the host they are the scratch's.
#ifdef __CUDACC__
__shared__ zd_node zd_shared_ring[ZD_RING][2];
__shared__ zd_prices zd_shared_prices;
__shared__ zd_offer zd_shared_offers[2];
#define ZD_RING_OF(sc) zd_shared_ring
#define ZD_PRICES_OF(sc) (&zd_shared_prices)
#define ZD_OFFERS_OF(sc) zd_shared_offers
#else
#define ZD_RING_OF(sc) ((sc)->ring)
#define ZD_PRICES_OF(sc) (&(sc)->pr)
#define ZD_OFFERS_OF(sc) ((sc)->offers)
#endif

// zd_rd32 returns bytes p..p+3 of the n at s, 0 past them.
ZP_FN uint32_t zd_rd32(const uint8_t *s, int p, int n) {
	if (p + 4 <= n) return zp_ld32(s, p);
	uint32_t v = 0;
	for (int i = 0; i < 4 && p + i < n; i++) v |= (uint32_t)s[p + i] << (8 * i);
	return v;
}

// zd_match_len counts the bytes from b that equal those from a (a < b),
// up to n.
ZP_FN int zd_match_len(const uint8_t *s, int a, int b, int n) {
	int k = 0;
	while (b + k + 8 <= n) {
		uint64_t x = zp_ld64(s, a + k) ^ zp_ld64(s, b + k);
		if (x) return k + (zp_ctz64(x) >> 3);
		k += 8;
	}
	while (b + k < n && s[a + k] == s[b + k]) k++;
	return k;
}

// zd_cost returns the price of a symbol seen count times in total, with
// every one of nsym symbols counted once more (so that none is free or
// unpriceable).
ZP_FN int32_t zd_cost(uint32_t count, uint32_t total, int nsym) {
	return zp_log2q8(total + (uint32_t)nsym) - zp_log2q8(count + 1);
}

// zd_default_prices prices a frame's first parse: literals by the frame's
// bytes, the codes by zstd's predefined distributions.
ZP_FN void zd_default_prices(zd_scratch *sc, const uint8_t *src, int n) {
	zd_prices *pr = ZD_PRICES_OF(sc);
	uint32_t *hist = sc->hist;
	for (int s = 0; s < 256; s++) hist[s] = 0;
	for (int i = 0; i < n; i++) hist[src[i]]++;
	for (int s = 0; s < 256; s++) pr->lit[s] = zd_cost(hist[s], (uint32_t)n, 256);
	// A predefined count of -1 is a probability below 1/64; priced as 1.
	for (int c = 0; c < 36; c++) pr->ll[c] = (6 << 8) - zp_log2q8((uint32_t)(zp_ll_def[c] > 0 ? zp_ll_def[c] : 1));
	for (int c = 0; c < 53; c++) pr->ml[c] = (6 << 8) - zp_log2q8((uint32_t)(zp_ml_def[c] > 0 ? zp_ml_def[c] : 1));
	for (int c = 0; c < 32; c++) pr->of[c] = c < 29 ? (5 << 8) - zp_log2q8((uint32_t)(zp_of_def[c] > 0 ? zp_of_def[c] : 1)) : 8 << 8;
}

// zd_parse_prices prices the next parse by the sequences and literals of
// the last (ws->seq_*, nlit literals in ws->u.lit.lit).
ZP_FN void zd_parse_prices(zd_scratch *sc, const zp_workspace *ws, int nseq, int nlit) {
	zd_prices *pr = ZD_PRICES_OF(sc);
	uint32_t *hist = sc->hist, *ll = sc->cll, *ml = sc->cml, *of = sc->cof;
	for (int s = 0; s < 256; s++) hist[s] = 0;
	for (int i = 0; i < nlit; i++) hist[ws->u.lit.lit[i]]++;
	for (int s = 0; s < 256; s++) pr->lit[s] = zd_cost(hist[s], (uint32_t)nlit, 256);
	for (int c = 0; c < 36; c++) ll[c] = 0;
	for (int c = 0; c < 53; c++) ml[c] = 0;
	for (int c = 0; c < 32; c++) of[c] = 0;
	for (int i = 0; i < nseq; i++) {
		ll[zp_ll_code(ws->seq_ll[i])]++;
		ml[zp_ml_code((uint32_t)ws->seq_ml[i] - 3)]++;
		of[zp_highbit(ws->seq_of[i])]++;
	}
	for (int c = 0; c < 36; c++) pr->ll[c] = zd_cost(ll[c], (uint32_t)nseq, 36);
	for (int c = 0; c < 53; c++) pr->ml[c] = zd_cost(ml[c], (uint32_t)nseq, 53);
	for (int c = 0; c < 32; c++) pr->of[c] = zd_cost(of[c], (uint32_t)nseq, 32);
}

ZP_FN int32_t zd_ll_price(const zd_prices *pr, uint32_t ll) {
	int c = zp_ll_code(ll);
	return pr->ll[c] + ((int32_t)zp_ll_bits[c] << 8);
}

ZP_FN int32_t zd_ml_price(const zd_prices *pr, uint32_t ml) {
	int c = zp_ml_code(ml - 3);
	return pr->ml[c] + ((int32_t)zp_ml_bits[c] << 8);
}

ZP_FN int32_t zd_of_price(const zd_prices *pr, uint32_t offval) {
	int c = zp_highbit(offval);
	return pr->of[c] + ((int32_t)c << 8);
}

ZP_FN uint32_t zd_hash4(uint32_t v) { return (v * 2654435761u) >> (32 - ZD_HASH_BITS); }
ZP_FN uint32_t zd_hash3(uint32_t v) { return ((v << 8) * 2654435761u) >> (32 - ZD_HASH3_BITS); }

// zd_relax offers position t (in the ring) the way in by a match of len
// bytes at offset off, from the way `from` into the match's start, at
// price, leaving the repeat offsets rep.
ZP_FN void zd_relax(zd_node (*ring)[2], int t, int32_t price, int len, uint32_t off, int from, const uint32_t *rep) {
	zd_node *x = &ring[t & (ZD_RING - 1)][ZD_MATCHED];
	if (price >= x->price) return;
	x->price = price;
	x->len = (uint16_t)len;
	x->off = (uint16_t)off;
	x->lit = 0;
	x->from = (uint16_t)from;
	x->rep[0] = (uint16_t)rep[0];
	x->rep[1] = (uint16_t)rep[1];
	x->rep[2] = (uint16_t)rep[2];
}

// zd_chains fills sc->chain and sc->prev3: for each position of src[0..n),
// the nearest earlier one with the same 4-byte hash (ZD_NONE for none) and
// the nearest with the same 3-byte hash.
ZP_FN void zd_chains(const uint8_t *src, int n, zd_scratch *sc) {
	for (int i = 0; i < (1 << ZD_HASH_BITS); i++) sc->head[i] = ZD_NONE;
	for (int i = 0; i < (1 << ZD_HASH3_BITS); i++) sc->head3[i] = ZD_NONE;
	for (int p = 0; p + 3 <= n; p++) {
		const uint32_t v = zd_rd32(src, p, n);
		const uint32_t h3 = zd_hash3(v);
		sc->prev3[p] = sc->head3[h3];
		sc->head3[h3] = (uint16_t)p;
		if (p + 4 <= n) {
			const uint32_t h = zd_hash4(v);
			sc->chain[p] = sc->head[h];
			sc->head[h] = (uint16_t)p;
		}
	}
}

// zd_candidates finds the matches at positions first..first+ZD_BLOCK-1
// that do not depend on the parse (all but the repeat offsets): the
// nearest earlier position with the same 3 bytes, then up to ZD_DEPTH
// along the chain, each kept only when longer than every one before it.
// Each position's are independent of the others' (the GPU finds a block's
// a lane a position).
ZP_FN void zd_candidates(const uint8_t *src, int n, int first, zd_scratch *sc) {
	for (int k = ZD_LANE; k < ZD_BLOCK; k += ZD_LANES) {
		const int p = first + k;
		int nc = 0, longest = 2;
		if (p + 3 <= n) {
			const int q3 = sc->prev3[p];
			if (q3 != (int)ZD_NONE) {
				const int l = zd_match_len(src, q3, p, n);
				if (l > longest) {
					longest = l;
					sc->cl[k][nc] = (uint16_t)l, sc->co[k][nc] = (uint16_t)(p - q3), nc++;
				}
			}
		}
		if (p + 4 <= n) {
			int q = sc->chain[p];
			for (int d = 0; d < ZD_DEPTH && q != (int)ZD_NONE && nc < ZD_CANDS && longest < n - p; d++) {
				// Longer than the longest so far only if equal at its end.
				if (src[q + longest] == src[p + longest]) {
					const int l = zd_match_len(src, q, p, n);
					if (l > longest) {
						longest = l;
						sc->cl[k][nc] = (uint16_t)l, sc->co[k][nc] = (uint16_t)(p - q), nc++;
					}
				}
				q = sc->chain[q];
			}
		}
		sc->nc[k] = (uint8_t)nc;
	}
}

// zd_matches lists the matches at p for a path that arrives with the
// way in at: its repeat offsets first, then the block's candidates (k is
// p's place in the block) longer than them, each longer than every one
// before it. It returns their number; cl and co get their lengths and
// offsets.
ZP_FN int zd_matches(const uint8_t *src, int n, int p, int k, const zd_node *at, const zd_scratch *sc, int *cl, int *co) {
	int nc = 0, longest = 2;
	for (int i = 0; i < 3; i++) {
		const uint32_t off = at->lit > 0 ? at->rep[i] : (i < 2 ? at->rep[i + 1] : (uint32_t)at->rep[0] - 1);
		if (off == 0 || off > (uint32_t)p) continue;
		const int l = zd_match_len(src, p - (int)off, p, n);
		if (l > longest) {
			longest = l;
			cl[nc] = l, co[nc] = (int)off, nc++;
		}
	}
	for (int i = 0; i < sc->nc[k]; i++) {
		if (sc->cl[k][i] > longest) {
			longest = sc->cl[k][i];
			cl[nc] = longest, co[nc] = sc->co[k][i], nc++;
		}
	}
	return nc;
}

// zd_step takes position p (first is its block's) out of the ring, its
// ways in final, and offers what follows from them: a literal to p+1, and
// the matches at p from each way in (ZD_OFFERS_OF(sc), for zd_relax_offers).
// A match of ZD_SUFFICIENT bytes or more, the cheapest of either way in, is
// taken at once instead: the ring is emptied, the match's end offered its
// way in, and zd_step returns the end; it returns 0 otherwise. Lane 0's.
ZP_FN int zd_step(const uint8_t *src, int n, int p, int first, zd_scratch *sc) {
	zd_node(*ring)[2] = ZD_RING_OF(sc);
	const zd_prices *pr = ZD_PRICES_OF(sc);
	zd_offer *offers = ZD_OFFERS_OF(sc);
	zd_node *const slot = ring[p & (ZD_RING - 1)];
	const zd_node in[2] = {slot[0], slot[1]};
	slot[0].price = slot[1].price = ZD_INF;
	sc->back[p] = (uint32_t)in[ZD_MATCHED].from << 31 | (uint32_t)in[ZD_MATCHED].len << 16 | in[ZD_MATCHED].off;
	sc->litfrom[p] = (uint8_t)in[ZD_LITERAL].from;
	offers[0].nc = offers[1].nc = 0;
	// A literal: its byte, and what it adds to the literal length.
	for (int w = 0; w < 2; w++) {
		if (in[w].price == ZD_INF) continue;
		const int32_t c = in[w].price + pr->lit[src[p]] + zd_ll_price(pr, in[w].lit + 1u) - zd_ll_price(pr, in[w].lit);
		zd_node *t = &ring[(p + 1) & (ZD_RING - 1)][ZD_LITERAL];
		if (c < t->price) {
			*t = in[w];
			t->price = c;
			t->len = 0, t->off = 0;
			t->lit = (uint16_t)(in[w].lit + 1);
			t->from = (uint16_t)w;
		}
	}
	if (p + 3 > n) return 0;
	const int32_t ll_price0 = zd_ll_price(pr, 0);
	int32_t jump_price = ZD_INF;
	int jump_len = 0, jump_off = 0, jump_from = 0;
	uint32_t jump_rep[3] = {0, 0, 0};
	for (int w = 0; w < 2; w++) {
		if (in[w].price == ZD_INF) continue;
		zd_offer *o = &offers[w];
		const int nc = zd_matches(src, n, p, p - first, &in[w], sc, o->cl, o->co);
		if (nc == 0) continue;
		const uint32_t litlen = in[w].lit;
		const uint32_t rep[3] = {in[w].rep[0], in[w].rep[1], in[w].rep[2]};
		const int32_t base = in[w].price + ll_price0;
		if (o->cl[nc - 1] >= ZD_SUFFICIENT) {
			const uint32_t off = (uint32_t)o->co[nc - 1];
			const uint32_t ov = zp_offval(off, litlen, rep);
			const int32_t c = base + zd_of_price(pr, ov) + zd_ml_price(pr, (uint32_t)o->cl[nc - 1]);
			if (c < jump_price) {
				jump_price = c, jump_len = o->cl[nc - 1], jump_off = (int)off, jump_from = w;
				jump_rep[0] = rep[0], jump_rep[1] = rep[1], jump_rep[2] = rep[2];
				zp_rep_update(jump_rep, ov, litlen);
			}
			continue;
		}
		for (int c = 0; c < nc; c++) {
			const uint32_t ov = zp_offval((uint32_t)o->co[c], litlen, rep);
			uint32_t after[3] = {rep[0], rep[1], rep[2]};
			zp_rep_update(after, ov, litlen);
			o->price[c] = base + zd_of_price(pr, ov);
			o->after[c][0] = (uint16_t)after[0], o->after[c][1] = (uint16_t)after[1], o->after[c][2] = (uint16_t)after[2];
		}
		o->nc = nc;
	}
	if (jump_price == ZD_INF) return 0;
	for (int i = 0; i < ZD_RING; i++) ring[i][0].price = ring[i][1].price = ZD_INF;
	const int e = p + jump_len;
	zd_relax(ring, e, jump_price, jump_len, (uint32_t)jump_off, jump_from, jump_rep);
	return e;
}

// zd_relax_offers offers every length of position p's matches (zd_step's
// offers) to the position where it ends, each length priced with the
// nearest match that reaches it (the matches grow in length and, past the
// repeat offsets, in offset). On the GPU the warp's lanes take the lengths
// a lane a length: each position is one lane's, so each is offered its
// ways in the order the host offers them.
ZP_FN void zd_relax_offers(int p, zd_scratch *sc) {
	zd_node(*ring)[2] = ZD_RING_OF(sc);
	const zd_prices *pr = ZD_PRICES_OF(sc);
	const zd_offer *offers = ZD_OFFERS_OF(sc);
	for (int w = 0; w < 2; w++) {
		const zd_offer *o = &offers[w];
		int from = 3;
		for (int c = 0; c < o->nc; c++) {
			const uint32_t after[3] = {o->after[c][0], o->after[c][1], o->after[c][2]};
			for (int l = from + ZD_LANE; l <= o->cl[c]; l += ZD_LANES)
				zd_relax(ring, p + l, o->price[c] + zd_ml_price(pr, (uint32_t)l), l, (uint32_t)o->co[c], w, after);
			from = o->cl[c] + 1;
		}
	}
}

// zd_parse finds the cheapest parse of src[0..n) by the prices
// (ZD_PRICES_OF(sc)) into ws->seq_* and returns the number of sequences
// (at most ZP_MAX_SEQ; the rest of the frame is then literals); on the
// GPU, every lane of the warp calls it, and lane 0 gets the parse.
//
// Positions go in blocks of ZD_BLOCK: the block's candidates first
// (zd_candidates), then its positions in order. The cheapest ways into
// the next ZD_RING positions, by a match and by a literal, are kept in a
// ring; a position leaves it, its ways in final, as the parse reaches it
// (zd_step: sc->back, sc->litfrom). A match of ZD_SUFFICIENT bytes or more
// is taken at once, as libzstd's optimal parser takes one: the parse goes
// on from its end with the ring emptied.
ZP_FN int zd_parse(const uint8_t *src, int n, zd_scratch *sc, zp_workspace *ws) {
	zd_node(*ring)[2] = ZD_RING_OF(sc);
	const zd_prices *pr = ZD_PRICES_OF(sc);
	ZD_SYNC(); // lane 0 is done with the last pass's ring and has set the prices
	for (int i = ZD_LANE; i < ZD_RING; i += ZD_LANES) ring[i][0].price = ring[i][1].price = ZD_INF;
	ZD_SYNC();
	const int32_t ll_price0 = zd_ll_price(pr, 0);
	if (ZD_LANE == 0) {
		zd_node *s = &ring[0][ZD_MATCHED];
		s->price = ll_price0;
		s->len = 0, s->off = 0, s->lit = 0, s->from = ZD_MATCHED;
		s->rep[0] = 1, s->rep[1] = 4, s->rep[2] = 8;
	}
	int p = 0;
	while (p < n) {
		const int first = p;
		ZD_SYNC();
		zd_candidates(src, n, first, sc);
		ZD_SYNC();
		for (; p < n && p < first + ZD_BLOCK; p++) {
			int e = 0;
			if (ZD_LANE == 0) e = zd_step(src, n, p, first, sc);
			e = ZD_BCAST(e);
			ZD_SYNC(); // the offers (or the emptied ring) are every lane's
			if (e) {
				p = e;
				break;
			}
			zd_relax_offers(p, sc);
			ZD_SYNC(); // the ring is whole before lane 0 takes p+1 out
		}
	}
	if (ZD_LANE != 0) return 0;
	const zd_node *end = ring[n & (ZD_RING - 1)];
	sc->back[n] = (uint32_t)end[ZD_MATCHED].from << 31 | (uint32_t)end[ZD_MATCHED].len << 16 | end[ZD_MATCHED].off;
	sc->litfrom[n] = (uint8_t)end[ZD_LITERAL].from;
	// The frame's last literals are no sequence: neither way's literal
	// length is paid.
	int way = ZD_MATCHED;
	if (end[ZD_LITERAL].price != ZD_INF &&
			(end[ZD_MATCHED].price == ZD_INF ||
			 end[ZD_LITERAL].price - zd_ll_price(pr, end[ZD_LITERAL].lit) < end[ZD_MATCHED].price - ll_price0))
		way = ZD_LITERAL;
	// The path, walked back from the end.
	int nm = 0;
	for (int e = n; e > 0;) {
		if (way == ZD_LITERAL) {
			way = sc->litfrom[e];
			e--;
			continue;
		}
		const uint32_t b = sc->back[e];
		const int len = (int)(b >> 16 & 0x7FFF);
		way = (int)(b >> 31);
		e -= len;
		sc->mstart[nm] = (uint16_t)e, sc->mlen[nm] = (uint16_t)len, sc->moff[nm] = (uint16_t)(b & 0xFFFF);
		nm++;
	}
	uint32_t rep[3] = {1, 4, 8};
	int anchor = 0, nseq = 0;
	for (int k = nm - 1; k >= 0 && nseq < ZP_MAX_SEQ; k--) {
		const uint32_t ll = (uint32_t)(sc->mstart[k] - anchor);
		const uint32_t ov = zp_offval(sc->moff[k], ll, rep);
		zp_rep_update(rep, ov, ll);
		ws->seq_ll[nseq] = (uint16_t)ll;
		ws->seq_ml[nseq] = sc->mlen[k];
		ws->seq_of[nseq] = (uint16_t)ov;
		nseq++;
		anchor = sc->mstart[k] + sc->mlen[k];
	}
	return nseq;
}

// zd_gather_literals copies the literals of the nseq sequences of the n
// bytes at src to ws->u.lit.lit and returns their number.
ZP_FN int zd_gather_literals(const uint8_t *src, int n, zp_workspace *ws, int nseq) {
	uint8_t *lit = ws->u.lit.lit;
	int pos = 0, k = 0;
	for (int i = 0; i < nseq; i++) {
		int ll = ws->seq_ll[i];
		for (int j = 0; j < ll; j++) lit[k + j] = src[pos + j];
		k += ll;
		pos += ll + ws->seq_ml[i];
	}
	for (; pos < n; pos++) lit[k++] = src[pos];
	return k;
}

// zd_frame_header writes the frame's header: Single_Segment, a 2-byte
// Frame_Content_Size of n (256 <= n < 65792), no checksum, no dictionary.
ZP_FN void zd_frame_header(uint8_t *dst, int n) {
	dst[0] = 0x28;
	dst[1] = 0xB5;
	dst[2] = 0x2F;
	dst[3] = 0xFD;
	dst[4] = 0x60;
	dst[5] = (uint8_t)((n - 256) & 0xFF);
	dst[6] = (uint8_t)((n - 256) >> 8);
}

// zd_compress_frame compresses the n bytes at src (256 <= n <= ZP_PAGE)
// into one zstd frame at dst (see the top of this file).
ZP_FN int zd_compress_frame(const uint8_t *src, int n, uint8_t *dst, int dst_cap, zp_workspace *ws, zd_scratch *sc) {
	if (n < 256 || n > ZP_PAGE) return 0;
	int cap = dst_cap < n - 1 ? dst_cap : n - 1;
	if (cap < 11) return 0;
	int same = 1;
	if (ZD_LANE == 0) {
		zd_frame_header(dst, n);
		for (int i = 1; i < n; i++) {
			if (src[i] != src[0]) {
				same = 0;
				break;
			}
		}
		if (same) {
			zp_block_header(dst + 7, 1, (uint32_t)n);
			dst[10] = src[0];
		}
	}
	if (ZD_BCAST(same)) return 11;
	if (ZD_LANE == 0) {
		zd_default_prices(sc, src, n);
		zd_chains(src, n, sc);
	}
	int nseq = 0, nlit = 0;
	for (int pass = 0; pass < ZD_PASSES; pass++) {
		if (pass > 0 && ZD_LANE == 0) zd_parse_prices(sc, ws, nseq, nlit);
		nseq = zd_parse(src, n, sc, ws);
		if (ZD_LANE == 0) nlit = zd_gather_literals(src, n, ws, nseq);
	}
	int len = 0;
	if (ZD_LANE == 0) {
		uint8_t *const oend = dst + cap;
		uint8_t *op = zp_encode_literals(ws, nlit, dst + 10, oend, 1);
		if (op) op = zp_encode_sequences(ws, nseq, op, oend, 1);
		if (op) {
			zp_block_header(dst + 7, 2, (uint32_t)(op - (dst + 10)));
			len = (int)(op - dst);
		}
	}
	return ZD_BCAST(len);
}

#endif
