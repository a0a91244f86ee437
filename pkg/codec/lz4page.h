// gzramd's LZ4 block compressor for 4 KiB pages (and, as a fallback, other
// inputs of up to 64 KiB); see lz4page.c.

#ifndef GZRAMD_LZ4PAGE_H
#define GZRAMD_LZ4PAGE_H

#include <stdint.h>

#define GZ_LZ4_PAGE 4096
// 4096 two-byte entries: 8 KiB, cleared per page, in L1 with the page.
#define GZ_LZ4_HASHLOG 12

typedef struct gz_lz4_ctx {
	uint16_t table[1 << GZ_LZ4_HASHLOG];
} gz_lz4_ctx;

// gz_lz4_page compresses the GZ_LZ4_PAGE bytes at src into dst as one
// standard LZ4 block and returns its length, or 0 when it would be longer
// than limit bytes. It writes nothing at or past dst+limit and reads
// nothing outside the page.
int gz_lz4_page(gz_lz4_ctx *ctx, const uint8_t *src, uint8_t *dst, int limit);

// The longest input gz_lz4_block takes: its offsets fit the table's 16 bits.
#define GZ_LZ4_MAX_INPUT 65536

// gz_lz4_block is gz_lz4_page for an input of n bytes, 0 < n <=
// GZ_LZ4_MAX_INPUT; it returns 0 for any other n.
int gz_lz4_block(gz_lz4_ctx *ctx, const uint8_t *src, int n, uint8_t *dst, int limit);

#endif
