// gzramd's zstd frame decoder on the host: zstddec_core.h's decoder, in a
// plain build and one for BMI2, chosen at start.

#include "zstddec.h"

#include <string.h>

#include "zstddec_core.h"

size_t gz_zdec_size(void) { return sizeof(gz_zdec); }

// zd_bmi2 chooses the build of the decoder that uses BMI2.
static int zd_bmi2;

__attribute__((constructor)) static void zd_init(void) {
#if defined(__x86_64__)
	__builtin_cpu_init();
	zd_bmi2 = __builtin_cpu_supports("bmi2");
#endif
	zd_build(ll_pre, ll_pre_norm, ZD_LL_MAX, 6, ll_base, ll_bits);
	zd_build(ml_pre, ml_pre_norm, ZD_ML_MAX, 6, ml_base, ml_bits);
	zd_build(of_pre, of_pre_norm, 28, 5, of_base, of_bits);
}

static ptrdiff_t zd_decode_plain(gz_zdec *z, const gz_zdict *d, const uint8_t *src, size_t srclen, uint8_t *dst,
		size_t dstlen, size_t want) {
	return zd_decode_dict(z, d, src, srclen, dst, dstlen, want);
}

#if defined(__x86_64__)
__attribute__((target("bmi2"))) static ptrdiff_t zd_decode_bmi2(gz_zdec *z, const gz_zdict *d, const uint8_t *src,
		size_t srclen, uint8_t *dst, size_t dstlen, size_t want) {
	return zd_decode_dict(z, d, src, srclen, dst, dstlen, want);
}
#endif

ptrdiff_t gz_zdec_decode_dict(gz_zdec *z, const gz_zdict *d, const uint8_t *src, size_t srclen, uint8_t *dst,
		size_t dstlen, size_t want) {
#if defined(__x86_64__)
	if (zd_bmi2) return zd_decode_bmi2(z, d, src, srclen, dst, dstlen, want);
#endif
	return zd_decode_plain(z, d, src, srclen, dst, dstlen, want);
}

ptrdiff_t gz_zdec_decode(gz_zdec *z, const uint8_t *src, size_t srclen, uint8_t *dst, size_t dstlen, size_t want) {
	return gz_zdec_decode_dict(z, NULL, src, srclen, dst, dstlen, want);
}

size_t gz_zdict_size(void) { return sizeof(gz_zdict); }

static uint32_t zd_le32(const uint8_t *p) {
	return p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

ptrdiff_t gz_zdict_load(gz_zdict *d, gz_zdec *z, const uint8_t *dict, size_t n) {
	const uint8_t *ip = dict + 8, *end = dict + n;
	if (n < 8 + 12 || zd_le32(dict) != 0xEC30A437u) return GZ_ZDEC_CORRUPT;
	memset(d, 0, sizeof *d);
	d->id = zd_le32(dict + 4);
	int used = zd_huf_table(z, &d->huflog, ip, (size_t)(end - ip));
	if (used < 0) return GZ_ZDEC_CORRUPT;
	memcpy(d->huf, z->huf, sizeof d->huf);
	ip += used;
	// The sequences' tables: offsets, match lengths, literal lengths.
	zd_frame f;
	memset(&f, 0, sizeof f);
	static const int order[3] = {1, 2, 0};
	for (int k = 0; k < 3; k++) {
		if (zd_table(z, &f, order[k], 2, &ip, end) < 0) return GZ_ZDEC_CORRUPT;
		d->log[order[k]] = f.log[order[k]];
	}
	memcpy(d->ll, z->ll, sizeof d->ll);
	memcpy(d->of, z->of, sizeof d->of);
	memcpy(d->ml, z->ml, sizeof d->ml);
	if (end - ip < 12) return GZ_ZDEC_CORRUPT;
	d->content = ip + 12;
	d->contentlen = (size_t)(end - d->content);
	for (int i = 0; i < 3; i++) {
		d->rep[i] = zd_le32(ip + 4 * i);
		if (d->rep[i] == 0 || d->rep[i] > d->contentlen) return GZ_ZDEC_CORRUPT;
	}
	return d->content - dict;
}

int gz_zdec_use_bmi2(int on) {
	int was = zd_bmi2;
#if defined(__x86_64__)
	zd_bmi2 = on && __builtin_cpu_supports("bmi2");
#endif
	return was;
}
