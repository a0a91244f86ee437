// The zstd codec: pages to standard zstd frames and back, with libzstd.

package codec

/*
#include <stddef.h>

// libzstd's own API, from the C sources github.com/DataDog/zstd compiles
// into the binary (its Go API would cost a copy of every compressed page:
// it wants an output buffer of the worst case's length).
typedef struct ZSTD_CCtx_s ZSTD_CCtx;
typedef struct ZSTD_DCtx_s ZSTD_DCtx;
ZSTD_CCtx *ZSTD_createCCtx(void);
ZSTD_DCtx *ZSTD_createDCtx(void);
size_t ZSTD_freeCCtx(ZSTD_CCtx *);
size_t ZSTD_freeDCtx(ZSTD_DCtx *);
size_t ZSTD_compressCCtx(ZSTD_CCtx *, void *dst, size_t cap, const void *src, size_t n, int level);
size_t ZSTD_decompressDCtx(ZSTD_DCtx *, void *dst, size_t cap, const void *src, size_t n);
unsigned ZSTD_isError(size_t);
*/
import "C"

import (
	"errors"
	"runtime"
	"unsafe"

	// The libzstd the declarations above link with.
	_ "github.com/DataDog/zstd"
)

// Zstd is zstd at a fixed level: a better ratio than LZ4 for more CPU. It
// is libzstd compiled from the C sources that github.com/DataDog/zstd
// carries, so building gzramd needs no zstd library.
type Zstd struct {
	level int
	// ctxs are the compression and decompression contexts, all made and
	// used once by NewZstd: libzstd sizes a context's memory at its first
	// use, and a swap device must not allocate (or fault) while the
	// kernel reclaims. With pages only, later calls reuse that memory.
	ctxs *slots[zstdCtx]
}

type zstdCtx struct {
	c *C.ZSTD_CCtx
	d *C.ZSTD_DCtx
}

// NewZstd returns the zstd codec at the given compression level.
func NewZstd(level int) (*Zstd, error) {
	// More contexts than can run at once (one per thread running Go
	// code), so that a caller seldom finds them all taken.
	n := min(runtime.GOMAXPROCS(0)+8, 64)
	page := make([]byte, PageSize)
	for i := range page {
		page[i] = byte(i % 251)
	}
	frame := make([]byte, PageSize)
	z := &Zstd{level: level}
	z.ctxs = newSlots(n, func() zstdCtx {
		x := zstdCtx{c: C.ZSTD_createCCtx(), d: C.ZSTD_createDCtx()}
		if x.c != nil && x.d != nil {
			// Size both contexts' memory now (see ctxs).
			if k := z.compress(x, frame, page); k > 0 {
				z.decompress(x, page, frame[:k])
			}
		}
		return x
	})
	ok := true
	for i := range z.ctxs.s {
		x := z.ctxs.s[i].ctx
		ok = ok && x.c != nil && x.d != nil
	}
	if !ok {
		freeZstdCtxs(z.ctxs)
		return nil, errors.New("codec: libzstd could not allocate its contexts")
	}
	runtime.AddCleanup(z, freeZstdCtxs, z.ctxs)
	return z, nil
}

func freeZstdCtxs(p *slots[zstdCtx]) {
	for i := range p.s {
		C.ZSTD_freeCCtx(p.s[i].ctx.c) // NULL is a no-op for both
		C.ZSTD_freeDCtx(p.s[i].ctx.d)
	}
}

// Name implements Codec.
func (*Zstd) Name() string { return "zstd" }

// Compress implements Codec.
func (z *Zstd) Compress(dst, src []byte) int {
	if len(src) == 0 || len(dst) == 0 {
		return 0
	}
	s := z.ctxs.get()
	n := z.compress(s.ctx, dst, src)
	s.put()
	return n
}

// Decompress implements Codec.
func (z *Zstd) Decompress(dst, src []byte) error {
	if len(src) == 0 || len(dst) == 0 {
		return ErrCorrupt
	}
	s := z.ctxs.get()
	err := z.decompress(s.ctx, dst, src)
	s.put()
	return err
}

// compress and decompress work with one context.
func (z *Zstd) compress(x zstdCtx, dst, src []byte) int {
	r := C.ZSTD_compressCCtx(x.c, unsafe.Pointer(&dst[0]), C.size_t(len(dst)),
		unsafe.Pointer(&src[0]), C.size_t(len(src)), C.int(z.level))
	if C.ZSTD_isError(r) != 0 {
		return 0 // dstSize_tooSmall among others: the caller keeps it raw
	}
	return int(r)
}

func (z *Zstd) decompress(x zstdCtx, dst, src []byte) error {
	r := C.ZSTD_decompressDCtx(x.d, unsafe.Pointer(&dst[0]), C.size_t(len(dst)),
		unsafe.Pointer(&src[0]), C.size_t(len(src)))
	if C.ZSTD_isError(r) != 0 || int(r) != len(dst) {
		return ErrCorrupt
	}
	return nil
}
