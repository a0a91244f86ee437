// The zstd codec: pages to standard zstd frames and back, with libzstd.

package codec

/*
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "zstddec.h"

// libzstd's own API, from the C sources github.com/DataDog/zstd compiles
// into the binary (its Go API would cost a copy of every compressed page:
// it wants an output buffer of the worst case's length), including the
// part zstd.h keeps behind ZSTD_STATIC_LINKING_ONLY: contexts in memory
// the caller provides.
typedef struct ZSTD_CCtx_s ZSTD_CCtx;
typedef struct ZSTD_DCtx_s ZSTD_DCtx;
typedef struct {
	unsigned windowLog, chainLog, hashLog, searchLog, minMatch, targetLength;
	int strategy; // ZSTD_strategy, an enum
} ZSTD_compressionParameters;
ZSTD_compressionParameters ZSTD_getCParams(int level, unsigned long long srcSize, size_t dictSize);
size_t ZSTD_estimateCCtxSize_usingCParams(ZSTD_compressionParameters cParams);
size_t ZSTD_estimateDCtxSize(void);
ZSTD_CCtx *ZSTD_initStaticCCtx(void *workspace, size_t size);
ZSTD_DCtx *ZSTD_initStaticDCtx(void *workspace, size_t size);
size_t ZSTD_compressCCtx(ZSTD_CCtx *, void *dst, size_t cap, const void *src, size_t n, int level);
size_t ZSTD_decompressDCtx(ZSTD_DCtx *, void *dst, size_t cap, const void *src, size_t n);
unsigned ZSTD_isError(size_t);
// ZSTD_cParameter is an enum: 100 is ZSTD_c_compressionLevel, 1015
// ZSTD_c_maxBlockSize (ZSTD_c_experimentalParam18, libzstd 1.5.6 on).
size_t ZSTD_CCtx_setParameter(ZSTD_CCtx *, int param, int value);
size_t ZSTD_compress2(ZSTD_CCtx *, void *dst, size_t cap, const void *src, size_t n);
size_t ZSTD_decompressBegin(ZSTD_DCtx *);
size_t ZSTD_nextSrcSizeToDecompress(ZSTD_DCtx *);
size_t ZSTD_decompressContinue(ZSTD_DCtx *, void *dst, size_t cap, const void *src, size_t n);

// gz_zstd_decode_prefix decodes the frame src of n bytes into dst block
// by block (libzstd's buffer-less API, which needs no buffer in the
// context), until at least want bytes are out or the frame ends. It
// returns the bytes out, or (size_t)-1 for a frame that does not decode.
static size_t gz_zstd_decode_prefix(ZSTD_DCtx *d, uint8_t *dst, size_t cap, const uint8_t *src, size_t n, size_t want) {
	if (ZSTD_isError(ZSTD_decompressBegin(d))) return (size_t)-1;
	size_t in = 0, out = 0;
	for (;;) {
		size_t next = ZSTD_nextSrcSizeToDecompress(d);
		if (next == 0 || out >= want) return in == n || out >= want ? out : (size_t)-1;
		if (next > n - in) return (size_t)-1;
		size_t r = ZSTD_decompressContinue(d, dst + out, cap - out, src + in, next);
		if (ZSTD_isError(r)) return (size_t)-1;
		in += next;
		out += r;
	}
}

typedef struct {
	ZSTD_CCtx *c;
	ZSTD_DCtx *d;
	gz_zdec *z; // zstddec.c's tables, tried before d
} gz_zstd_ctx;

// gz_zstd_new_ctxs makes n pairs of contexts for pages at level in one
// block it allocates and writes through first, so that every page of
// them is resident (and, under mlockall, locked) before the first page
// is compressed, and libzstd never allocates: a context made in place
// cannot grow. The block (*size bytes), or NULL without memory.
static void *gz_zstd_new_ctxs(int n, int level, int page, gz_zstd_ctx *out, size_t *size) {
	// page 0: decompression contexts alone.
	size_t cs = page == 0 ? 0 : ZSTD_estimateCCtxSize_usingCParams(ZSTD_getCParams(level, (unsigned long long)page, 0));
	size_t ds = ZSTD_estimateDCtxSize();
	size_t zs = gz_zdec_size();
	cs = (cs + 63) & ~(size_t)63;
	ds = (ds + 63) & ~(size_t)63;
	zs = (zs + 63) & ~(size_t)63;
	*size = (cs + ds + zs) * (size_t)n;
	uint8_t *b = malloc(*size);
	if (b == NULL) return NULL;
	memset(b, 0, *size);
	for (int i = 0; i < n; i++) {
		uint8_t *at = b + (cs + ds + zs) * (size_t)i;
		out[i].c = cs == 0 ? NULL : ZSTD_initStaticCCtx(at, cs);
		out[i].d = ZSTD_initStaticDCtx(at + cs, ds);
		out[i].z = (gz_zdec *)(at + cs + ds);
		if ((cs != 0 && out[i].c == NULL) || out[i].d == NULL) {
			free(b);
			return NULL;
		}
	}
	return b;
}
*/
import "C"

import (
	"bytes"
	"fmt"
	"runtime"
	"unsafe"

	// The libzstd the declarations above link with.
	_ "github.com/DataDog/zstd"
)

// Zstd is zstd at a fixed level: a better ratio than LZ4 for more CPU. It
// is libzstd compiled from the C sources that github.com/DataDog/zstd
// carries, so building gzramd needs no zstd library. It compresses pages,
// and objects of several pages once HoldObjects has made contexts for
// them: a longer input needs more context memory than a page's, and
// Compress returns 0 for it until then.
type Zstd struct {
	level int
	// ctxs are the compression and decompression contexts, all made in
	// memory NewZstd allocated and wrote: a swap device must not
	// allocate (or fault) while the kernel reclaims.
	ctxs *contextPool[C.gz_zstd_ctx]
	// objects compress inputs of several pages (HoldObjects); nil: none.
	objects chan *ZstdObjects
	held    int64 // the bytes of all of them
}

// objectCompressors is how many objects of several pages a Zstd
// compresses at once: each context for 64 KiB inputs holds about 400 KB
// at level 1, and objects are compressed on the CPU only where the GPU
// does not (inline writes, and batches it leaves to the CPU).
const objectCompressors = 4

// HoldObjects makes the contexts that compress objects of up to pages
// pages, at the codec's level, as frames of a block a page (a read
// decodes up to its page's block). Call it before the codec is used.
func (z *Zstd) HoldObjects(pages int) error {
	if z.objects != nil {
		return nil
	}
	objects := make(chan *ZstdObjects, min(objectCompressors, runtime.GOMAXPROCS(0)))
	var held int64
	for range cap(objects) {
		o, err := NewZstdObjects(z.level, pages*PageSize, PageSize)
		if err != nil {
			return fmt.Errorf("codec: objects of %d pages: %w", pages, err)
		}
		objects <- o
		held += o.HeldBytes()
	}
	z.objects, z.held = objects, z.held+held
	return nil
}

// NewZstd returns the zstd codec at the given compression level.
func NewZstd(level int) (*Zstd, error) {
	// More contexts than can run at once (one per thread running Go
	// code), so that a caller seldom finds them all taken.
	n := min(runtime.GOMAXPROCS(0)+8, 64)
	made := make([]C.gz_zstd_ctx, n)
	var size C.size_t
	block := C.gz_zstd_new_ctxs(C.int(n), C.int(level), PageSize, &made[0], &size)
	if block == nil {
		return nil, fmt.Errorf("codec: no memory for libzstd's contexts (%d bytes)", size)
	}
	z := &Zstd{level: level, held: int64(size), ctxs: newContextPool(made)}
	runtime.AddCleanup(z, func(b unsafe.Pointer) { C.free(b) }, block)
	// Each context must take a page both ways: a level whose contexts
	// need more than the estimate would otherwise store every page raw.
	page, frame, back := make([]byte, PageSize), make([]byte, PageSize), make([]byte, PageSize)
	for i := range page {
		page[i] = byte(i % 251)
	}
	for i := range z.ctxs.s {
		x := z.ctxs.s[i].ctx
		k := z.compress(x, frame, page)
		if k <= 0 || libzstdDecompress(x, back, frame[:k]) != nil || !bytes.Equal(back, page) {
			return nil, fmt.Errorf("codec: libzstd's contexts at level %d do not round-trip a page", level)
		}
	}
	return z, nil
}

// ZstdDecoder decodes zstd frames of any size into flat outputs, with
// contexts made and written ahead as Zstd's are, without Zstd's
// compression contexts: for devices that compress with another codec.
type ZstdDecoder struct {
	ctxs *contextPool[C.gz_zstd_ctx]
	held int64
}

// NewZstdDecoder returns a decoder with n contexts: as many calls run at
// once, and more wait.
func NewZstdDecoder(n int) (*ZstdDecoder, error) {
	made := make([]C.gz_zstd_ctx, n)
	var size C.size_t
	block := C.gz_zstd_new_ctxs(C.int(n), 1, 0, &made[0], &size)
	if block == nil {
		return nil, fmt.Errorf("codec: no memory for libzstd's decompression contexts (%d bytes)", size)
	}
	z := &ZstdDecoder{held: int64(size), ctxs: newContextPool(made)}
	runtime.AddCleanup(z, func(b unsafe.Pointer) { C.free(b) }, block)
	return z, nil
}

// HeldBytes is the memory the contexts hold.
func (z *ZstdDecoder) HeldBytes() int64 { return z.held }

// Decompress decodes the frame src into dst, which must be exactly as
// long as what it holds; it fails with ErrCorrupt otherwise.
func (z *ZstdDecoder) Decompress(dst, src []byte) error {
	if len(src) == 0 || len(dst) == 0 {
		return ErrCorrupt
	}
	s := z.ctxs.get()
	err := decompress(s.ctx, dst, src)
	s.put()
	return err
}

// DecompressPrefix is Zstd.DecompressPrefix.
func (z *ZstdDecoder) DecompressPrefix(dst, src []byte, n int) error {
	s := z.ctxs.get()
	err := decodePrefix(s.ctx, dst, src, n)
	s.put()
	return err
}

// Name implements Codec.
func (*Zstd) Name() string { return "zstd" }

// Level is the compression level NewZstd was given.
func (z *Zstd) Level() int { return z.level }

// HeldBytes implements Codec.
func (z *Zstd) HeldBytes() int64 { return z.held }

// Compress implements Codec. An input of several pages is compressed as
// one frame of a block a page, when HoldObjects made contexts for it (0
// otherwise).
func (z *Zstd) Compress(dst, src []byte) int {
	if len(src) == 0 || len(dst) == 0 {
		return 0
	}
	if len(src) > PageSize {
		if z.objects == nil {
			return 0
		}
		o := <-z.objects
		n := o.Compress(dst, src)
		z.objects <- o
		return n
	}
	s := z.ctxs.get()
	n := z.compress(s.ctx, dst, src)
	s.put()
	return n
}

// Decompress implements Codec. A page's frame goes to libzstd alone:
// there is no later page to stop before, and zstddec.c decodes zstd -1
// pages no faster (bench/results/zstd-decoder-cpu-2026-12-06.md).
func (z *Zstd) Decompress(dst, src []byte) error {
	if len(src) == 0 || len(dst) == 0 {
		return ErrCorrupt
	}
	s := z.ctxs.get()
	err := libzstdDecompress(s.ctx, dst, src)
	s.put()
	return err
}

// compress and decompress work with one context.
func (z *Zstd) compress(x C.gz_zstd_ctx, dst, src []byte) int {
	r := C.ZSTD_compressCCtx(x.c, unsafe.Pointer(&dst[0]), C.size_t(len(dst)),
		unsafe.Pointer(&src[0]), C.size_t(len(src)), C.int(z.level))
	if C.ZSTD_isError(r) != 0 {
		return 0 // dstSize_tooSmall among others: the caller keeps it raw
	}
	return int(r)
}

// DecompressPrefix decodes src into dst, as long as what it holds, as
// far as its first n bytes at least: a frame of several blocks stops
// after the block that holds byte n-1 (ZstdObjects makes such frames).
func (z *Zstd) DecompressPrefix(dst, src []byte, n int) error {
	s := z.ctxs.get()
	err := decodePrefix(s.ctx, dst, src, n)
	s.put()
	return err
}

// decodePrefix and decompress try zstddec.c first, which can stop inside
// a block (a one-block frame of 4 pages decodes a quarter as far for its
// first page) and costs less before a frame's first byte, and libzstd on
// any frame it returns an error for: it does not take dictionaries, nor
// blocks of more literals than it holds, and it leaves a malformed frame
// to libzstd's verdict.
func decodePrefix(x C.gz_zstd_ctx, dst, src []byte, n int) error {
	if len(src) == 0 || len(dst) == 0 || n <= 0 || n > len(dst) {
		return ErrCorrupt
	}
	if r := zdec(x, dst, src, n); r >= n && (n < len(dst) || r == n) {
		return nil
	}
	return libzstdPrefix(x, dst, src, n)
}

// zdec runs zstddec.c on src with the first n bytes of dst wanted (all
// of them: the whole frame): the bytes it wrote, or a negative error.
func zdec(x C.gz_zstd_ctx, dst, src []byte, n int) int {
	return int(C.gz_zdec_decode(x.z, (*C.uint8_t)(unsafe.Pointer(&src[0])), C.size_t(len(src)),
		(*C.uint8_t)(unsafe.Pointer(&dst[0])), C.size_t(len(dst)), C.size_t(n)))
}

const (
	// zdecMaxLiterals is the most literals a block may have for zstddec.c
	// (ZD_LIT_MAX): the dense tier's frames, and objects' blocks of a
	// page, have 16 KiB at most.
	zdecMaxLiterals = 16 << 10
	// zdecTooLarge is its answer to a block with more (GZ_ZDEC_TOO_LARGE).
	zdecTooLarge = C.GZ_ZDEC_TOO_LARGE
)

// zdecUseBMI2 turns zstddec.c's build for BMI2 on or off (tests of both
// builds) and returns whether it was on.
func zdecUseBMI2(on bool) bool {
	v := 0
	if on {
		v = 1
	}
	return C.gz_zdec_use_bmi2(C.int(v)) != 0
}

func libzstdPrefix(x C.gz_zstd_ctx, dst, src []byte, n int) error {
	r := C.gz_zstd_decode_prefix(x.d, (*C.uint8_t)(unsafe.Pointer(&dst[0])), C.size_t(len(dst)),
		(*C.uint8_t)(unsafe.Pointer(&src[0])), C.size_t(len(src)), C.size_t(n))
	if r == ^C.size_t(0) || int(r) < n || (n == len(dst) && int(r) != n) {
		return ErrCorrupt
	}
	return nil
}

func decompress(x C.gz_zstd_ctx, dst, src []byte) error {
	if zdec(x, dst, src, len(dst)) == len(dst) {
		return nil
	}
	return libzstdDecompress(x, dst, src)
}

func libzstdDecompress(x C.gz_zstd_ctx, dst, src []byte) error {
	if libzstdDecode(x, dst, src) != len(dst) {
		return ErrCorrupt
	}
	return nil
}

// libzstdDecode decodes src into dst with libzstd and returns the bytes
// out, or -1.
func libzstdDecode(x C.gz_zstd_ctx, dst, src []byte) int {
	r := C.ZSTD_decompressDCtx(x.d, unsafe.Pointer(&dst[0]), C.size_t(len(dst)),
		unsafe.Pointer(&src[0]), C.size_t(len(src)))
	if C.ZSTD_isError(r) != 0 {
		return -1
	}
	return int(r)
}

// ZstdObjects compresses inputs of up to a fixed size, larger than a
// page (objects of several pages), into standard zstd frames, with one
// context made and written ahead: it is for one goroutine at a time.
// Its frames decode with Zstd, whose contexts take frames of any size
// into a flat output.
type ZstdObjects struct {
	level, max int
	ctx        C.gz_zstd_ctx
	held       int64
}

// NewZstdObjects returns a compressor of inputs of up to max bytes at the
// given level, into frames of blocks of block bytes of input at most
// (0: libzstd's 128 KiB), each of which decodes once those before it
// have (DecompressPrefix stops after the block it needs); matches still
// reach back across blocks.
func NewZstdObjects(level, max, block int) (*ZstdObjects, error) {
	var made C.gz_zstd_ctx
	var size C.size_t
	mem := C.gz_zstd_new_ctxs(1, C.int(level), C.int(max), &made, &size)
	if mem == nil {
		return nil, fmt.Errorf("codec: no memory for libzstd's context for %d-byte inputs (%d bytes)", max, size)
	}
	z := &ZstdObjects{level: level, max: max, ctx: made, held: int64(size)}
	runtime.AddCleanup(z, func(b unsafe.Pointer) { C.free(b) }, mem)
	if C.ZSTD_isError(C.ZSTD_CCtx_setParameter(made.c, 100, C.int(level))) != 0 ||
		C.ZSTD_isError(C.ZSTD_CCtx_setParameter(made.c, 1015, C.int(block))) != 0 {
		return nil, fmt.Errorf("codec: libzstd refuses level %d in blocks of %d bytes", level, block)
	}
	in, frame := make([]byte, max), make([]byte, max)
	for i := range in {
		in[i] = byte(i % 251)
	}
	if z.Compress(frame, in) <= 0 {
		return nil, fmt.Errorf("codec: libzstd's context at level %d does not take a %d-byte input", level, max)
	}
	return z, nil
}

// HeldBytes is the memory the context holds.
func (z *ZstdObjects) HeldBytes() int64 { return z.held }

// Compress compresses src, at most the size NewZstdObjects was given,
// into dst and returns the frame's length, or 0 when it would not fit in
// len(dst).
func (z *ZstdObjects) Compress(dst, src []byte) int {
	if len(src) == 0 || len(src) > z.max || len(dst) == 0 {
		return 0
	}
	r := C.ZSTD_compress2(z.ctx.c, unsafe.Pointer(&dst[0]), C.size_t(len(dst)),
		unsafe.Pointer(&src[0]), C.size_t(len(src)))
	if C.ZSTD_isError(r) != 0 {
		return 0
	}
	return int(r)
}
