// gzramd's LZ4 block decoder; see lz4dec.c.

#ifndef GZRAMD_LZ4DEC_H
#define GZRAMD_LZ4DEC_H

#include <stdint.h>

// gz_lz4_decode decodes the standard LZ4 block of srclen bytes at src into
// the dstlen bytes at dst and returns 0, or -1 when the block is malformed
// or does not decode to exactly dstlen bytes. It reads nothing outside
// [src, src+srclen) and writes nothing outside [dst, dst+dstlen), whatever
// the input.
int gz_lz4_decode(const uint8_t *src, int srclen, uint8_t *dst, int dstlen);

// gz_lz4_decode_prefix decodes as gz_lz4_decode does, but returns 0 as
// soon as at least the first want bytes of dst hold the block's first
// want bytes: the rest of dst (dstlen, the block's whole length) may hold
// more of it, or nothing. It checks the block only as far as it read it.
int gz_lz4_decode_prefix(const uint8_t *src, int srclen, uint8_t *dst, int dstlen, int want);

#endif
