// libzstd's dictionaries, for the measurement of small dense frames with a
// dictionary trained on the device's own pages (dict_test.go).

package denseframes

/*
#include <stddef.h>
#include <stdlib.h>

// libzstd's API, from the C sources github.com/DataDog/zstd compiles into
// the binary (pkg/codec declares the part gzramd uses the same way).
typedef struct ZSTD_CCtx_s ZSTD_CCtx;
typedef struct ZSTD_DCtx_s ZSTD_DCtx;
typedef struct ZSTD_CDict_s ZSTD_CDict;
typedef struct ZSTD_DDict_s ZSTD_DDict;
ZSTD_CCtx *ZSTD_createCCtx(void);
ZSTD_DCtx *ZSTD_createDCtx(void);
size_t ZSTD_freeCCtx(ZSTD_CCtx *);
size_t ZSTD_freeDCtx(ZSTD_DCtx *);
ZSTD_CDict *ZSTD_createCDict(const void *dict, size_t size, int level);
ZSTD_DDict *ZSTD_createDDict(const void *dict, size_t size);
size_t ZSTD_freeCDict(ZSTD_CDict *);
size_t ZSTD_freeDDict(ZSTD_DDict *);
size_t ZSTD_compressCCtx(ZSTD_CCtx *, void *dst, size_t cap, const void *src, size_t n, int level);
size_t ZSTD_decompressDCtx(ZSTD_DCtx *, void *dst, size_t cap, const void *src, size_t n);
size_t ZSTD_compress_usingCDict(ZSTD_CCtx *, void *dst, size_t cap, const void *src, size_t n, const ZSTD_CDict *);
size_t ZSTD_decompress_usingDDict(ZSTD_DCtx *, void *dst, size_t cap, const void *src, size_t n, const ZSTD_DDict *);
unsigned ZSTD_isError(size_t);
*/
import "C"

import (
	"errors"
	"fmt"
	"unsafe"

	_ "github.com/DataDog/zstd" // libzstd's C sources
)

// dictCodec compresses and decodes frames with one context each, made
// ahead and reused as gzramd's are, and a dictionary (none where nil).
type dictCodec struct {
	level int
	cctx  *C.ZSTD_CCtx
	dctx  *C.ZSTD_DCtx
	cdict *C.ZSTD_CDict
	ddict *C.ZSTD_DDict
}

func newDictCodec(dict []byte, level int) (*dictCodec, error) {
	c := &dictCodec{level: level, cctx: C.ZSTD_createCCtx(), dctx: C.ZSTD_createDCtx()}
	if c.cctx == nil || c.dctx == nil {
		return nil, errors.New("no memory for libzstd's contexts")
	}
	if len(dict) > 0 {
		c.cdict = C.ZSTD_createCDict(unsafe.Pointer(&dict[0]), C.size_t(len(dict)), C.int(level))
		c.ddict = C.ZSTD_createDDict(unsafe.Pointer(&dict[0]), C.size_t(len(dict)))
		if c.cdict == nil || c.ddict == nil {
			return nil, errors.New("no memory for libzstd's dictionaries")
		}
	}
	return c, nil
}

func (c *dictCodec) close() {
	C.ZSTD_freeCCtx(c.cctx)
	C.ZSTD_freeDCtx(c.dctx)
	if c.cdict != nil {
		C.ZSTD_freeCDict(c.cdict)
		C.ZSTD_freeDDict(c.ddict)
	}
}

// compress returns src's frame's length in dst, 0 where it does not fit.
func (c *dictCodec) compress(dst, src []byte) int {
	d, s := unsafe.Pointer(&dst[0]), unsafe.Pointer(&src[0])
	var r C.size_t
	if c.cdict != nil {
		r = C.ZSTD_compress_usingCDict(c.cctx, d, C.size_t(len(dst)), s, C.size_t(len(src)), c.cdict)
	} else {
		r = C.ZSTD_compressCCtx(c.cctx, d, C.size_t(len(dst)), s, C.size_t(len(src)), C.int(c.level))
	}
	if C.ZSTD_isError(r) != 0 {
		return 0
	}
	return int(r)
}

// decompress decodes the frame src into dst, which it must fill.
func (c *dictCodec) decompress(dst, src []byte) error {
	d, s := unsafe.Pointer(&dst[0]), unsafe.Pointer(&src[0])
	var r C.size_t
	if c.ddict != nil {
		r = C.ZSTD_decompress_usingDDict(c.dctx, d, C.size_t(len(dst)), s, C.size_t(len(src)), c.ddict)
	} else {
		r = C.ZSTD_decompressDCtx(c.dctx, d, C.size_t(len(dst)), s, C.size_t(len(src)))
	}
	if C.ZSTD_isError(r) != 0 || int(r) != len(dst) {
		return fmt.Errorf("a frame of %d bytes does not decode to %d", len(src), len(dst))
	}
	return nil
}
