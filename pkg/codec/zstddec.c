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

static ptrdiff_t zd_decode_plain(gz_zdec *z, const uint8_t *src, size_t srclen, uint8_t *dst, size_t dstlen, size_t want) {
	return zd_decode(z, src, srclen, dst, dstlen, want);
}

#if defined(__x86_64__)
__attribute__((target("bmi2"))) static ptrdiff_t zd_decode_bmi2(gz_zdec *z, const uint8_t *src, size_t srclen,
		uint8_t *dst, size_t dstlen, size_t want) {
	return zd_decode(z, src, srclen, dst, dstlen, want);
}
#endif

ptrdiff_t gz_zdec_decode(gz_zdec *z, const uint8_t *src, size_t srclen, uint8_t *dst, size_t dstlen, size_t want) {
#if defined(__x86_64__)
	if (zd_bmi2) return zd_decode_bmi2(z, src, srclen, dst, dstlen, want);
#endif
	return zd_decode_plain(z, src, srclen, dst, dstlen, want);
}

int gz_zdec_use_bmi2(int on) {
	int was = zd_bmi2;
#if defined(__x86_64__)
	zd_bmi2 = on && __builtin_cpu_supports("bmi2");
#endif
	return was;
}
