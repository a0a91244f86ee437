// gzramd's zstd frame decoder; see zstddec.c.

#ifndef GZRAMD_ZSTDDEC_H
#define GZRAMD_ZSTDDEC_H

#include <stddef.h>
#include <stdint.h>

// gz_zdec is a decoder's memory: its tables and literals. It holds no
// pointers to anything outside itself between calls, so it may be
// zeroed, copied or reused for any frame.
typedef struct gz_zdec gz_zdec;

// gz_zdec_size is the bytes a gz_zdec takes.
size_t gz_zdec_size(void);

// The errors gz_zdec_decode returns. Any of them means that libzstd
// should decode the frame instead: the first is an input this decoder
// finds malformed, which libzstd may still name better; the others are
// standard inputs it leaves to libzstd.
#define GZ_ZDEC_CORRUPT (-1)
#define GZ_ZDEC_UNSUPPORTED (-2) // another dictionary's frames, skippable frames
#define GZ_ZDEC_TOO_LARGE (-3)   // more literals in a block than z holds
#define GZ_ZDEC_DST_SMALL (-4)   // more output than dstlen

// gz_zdec_decode decodes the single zstd frame of srclen bytes at src
// into dst, and returns the bytes it wrote, or one of the errors above.
// With want < dstlen it may stop as soon as it has written want bytes
// (it returns at least want then, unless the frame is shorter), and it
// checks the frame only as far as it read it; with want >= dstlen it
// decodes the whole frame and requires src to be exactly it. It reads
// nothing outside [src, src+srclen), writes nothing outside [dst,
// dst+dstlen) and z, whatever the input; bytes of dst past what it
// returns may have been written.
ptrdiff_t gz_zdec_decode(gz_zdec *z, const uint8_t *src, size_t srclen, uint8_t *dst, size_t dstlen, size_t want);

// gz_zdict is a zstd dictionary's tables, built once for every frame
// compressed with it; its content stays where it was when loaded.
typedef struct gz_zdict gz_zdict;

// gz_zdict_size is the bytes a gz_zdict takes.
size_t gz_zdict_size(void);

// gz_zdict_load reads the zstd dictionary (RFC 8878, section 5) of n bytes
// at dict into d, with z as scratch, and returns the offset of its content
// in dict, or GZ_ZDEC_CORRUPT. d refers to the content in place: dict's
// memory must outlive d's use. A raw-content dictionary (no magic number)
// is not read.
ptrdiff_t gz_zdict_load(gz_zdict *d, gz_zdec *z, const uint8_t *dict, size_t n);

// gz_zdec_decode_dict is gz_zdec_decode for a frame compressed with the
// dictionary d (a frame with none decodes too).
ptrdiff_t gz_zdec_decode_dict(gz_zdec *z, const gz_zdict *d, const uint8_t *src, size_t srclen, uint8_t *dst,
		size_t dstlen, size_t want);

// gz_zdec_use_bmi2 turns the decoder's build for BMI2 on (where the
// processor has it) or off, and returns whether it was on: for tests of
// both builds. It is not safe while a decode runs.
int gz_zdec_use_bmi2(int on);

#endif
