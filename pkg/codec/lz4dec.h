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

#endif
