package codec

/*
#cgo LDFLAGS: -l:libzstd.a
#include <zstd.h>
*/
import "C"

import "unsafe"

// Zstd is libzstd at a fixed level: a better ratio than LZ4 for more CPU.
type Zstd struct {
	level int
	cctxs chan *C.ZSTD_CCtx
	dctxs chan *C.ZSTD_DCtx
}

// NewZstd returns the libzstd codec at the given compression level.
func NewZstd(level int) *Zstd {
	return &Zstd{level: level, cctxs: make(chan *C.ZSTD_CCtx, 64), dctxs: make(chan *C.ZSTD_DCtx, 64)}
}

// Name implements Codec.
func (*Zstd) Name() string { return "zstd" }

// Compress implements Codec.
func (z *Zstd) Compress(dst, src []byte) int {
	if len(src) == 0 || len(dst) == 0 {
		return 0
	}
	var cc *C.ZSTD_CCtx
	select {
	case cc = <-z.cctxs:
	default:
		cc = C.ZSTD_createCCtx()
		if cc == nil {
			return 0
		}
	}
	n := C.ZSTD_compressCCtx(cc, unsafe.Pointer(&dst[0]), C.size_t(len(dst)),
		unsafe.Pointer(&src[0]), C.size_t(len(src)), C.int(z.level))
	select {
	case z.cctxs <- cc:
	default:
		C.ZSTD_freeCCtx(cc)
	}
	if C.ZSTD_isError(n) != 0 {
		return 0
	}
	return int(n)
}

// Decompress implements Codec.
func (z *Zstd) Decompress(dst, src []byte) error {
	if len(src) == 0 || len(dst) == 0 {
		return ErrCorrupt
	}
	var dc *C.ZSTD_DCtx
	select {
	case dc = <-z.dctxs:
	default:
		dc = C.ZSTD_createDCtx()
		if dc == nil {
			return ErrCorrupt
		}
	}
	n := C.ZSTD_decompressDCtx(dc, unsafe.Pointer(&dst[0]), C.size_t(len(dst)),
		unsafe.Pointer(&src[0]), C.size_t(len(src)))
	select {
	case z.dctxs <- dc:
	default:
		C.ZSTD_freeDCtx(dc)
	}
	if C.ZSTD_isError(n) != 0 || int(n) != len(dst) {
		return ErrCorrupt
	}
	return nil
}
