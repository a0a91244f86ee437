// zstd dictionaries: trained on a device's own pages, used to compress
// small frames, and read by zstddec.c with their tables built once.

package codec

/*
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "zstddec.h"

typedef struct ZSTD_CCtx_s ZSTD_CCtx;
typedef struct ZSTD_DCtx_s ZSTD_DCtx;
typedef struct ZSTD_CDict_s ZSTD_CDict;
typedef struct ZSTD_DDict_s ZSTD_DDict;
ZSTD_CCtx *ZSTD_createCCtx(void);
size_t ZSTD_freeCCtx(ZSTD_CCtx *);
ZSTD_CDict *ZSTD_createCDict(const void *dict, size_t size, int level);
size_t ZSTD_freeCDict(ZSTD_CDict *);
ZSTD_DDict *ZSTD_createDDict_byReference(const void *dict, size_t size);
size_t ZSTD_freeDDict(ZSTD_DDict *);
size_t ZSTD_compress_usingCDict(ZSTD_CCtx *, void *dst, size_t cap, const void *src, size_t n, const ZSTD_CDict *);
size_t ZSTD_decompress_usingDDict(ZSTD_DCtx *, void *dst, size_t cap, const void *src, size_t n, const ZSTD_DDict *);
unsigned ZSTD_isError(size_t);
size_t ZDICT_trainFromBuffer(void *dict, size_t cap, const void *samples, const size_t *sizes, unsigned n);
unsigned ZDICT_isError(size_t);
*/
import "C"

import (
	"encoding/binary"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"unsafe"
)

// TrainZstdDict trains a zstd dictionary of at most size bytes on samples
// cut into pieces of sample bytes (libzstd's ZDICT_trainFromBuffer, with
// its defaults). It allocates as it goes: it is for the background, never
// the path that stores a page.
func TrainZstdDict(samples []byte, sample, size int) ([]byte, error) {
	n := len(samples) / max(sample, 1)
	if n == 0 || size <= 0 {
		return nil, errors.New("codec: no samples to train a dictionary on")
	}
	mem := C.malloc(C.size_t(n)*C.size_t(unsafe.Sizeof(C.size_t(0))) + C.size_t(n*sample) + C.size_t(size))
	if mem == nil {
		return nil, errors.New("codec: no memory to train a dictionary")
	}
	defer C.free(mem)
	sizes := unsafe.Slice((*C.size_t)(mem), n)
	for i := range sizes {
		sizes[i] = C.size_t(sample)
	}
	in := unsafe.Slice((*byte)(unsafe.Add(mem, n*int(unsafe.Sizeof(C.size_t(0))))), n*sample+size)
	copy(in, samples[:n*sample])
	dict := in[n*sample:]
	r := C.ZDICT_trainFromBuffer(unsafe.Pointer(&dict[0]), C.size_t(size), unsafe.Pointer(&in[0]), &sizes[0], C.uint(n))
	if C.ZDICT_isError(r) != 0 {
		return nil, fmt.Errorf("codec: training a zstd dictionary on %d samples failed (ZDICT error %d)", n, int64(r))
	}
	return append([]byte(nil), dict[:r]...), nil
}

// ZstdDict is a zstd dictionary (RFC 8878, section 5) made ready to use:
// its entropy tables built once for zstddec.c, its bytes, and libzstd's
// own forms of it, all outside the Go heap. Decoding with it is safe for
// concurrent use; Compress takes one context, a call at a time.
type ZstdDict struct {
	mem   unsafe.Pointer // gz_zdict, then the dictionary's bytes
	zd    *C.gz_zdict
	ddict *C.ZSTD_DDict // libzstd's, for the frames zstddec.c leaves to it
	id    uint32
	held  int64

	mu    sync.Mutex
	cdict *C.ZSTD_CDict // nil: no level given
	cctx  *C.ZSTD_CCtx
}

// NewZstdDict reads dict, a zstd dictionary such as TrainZstdDict makes,
// and, with level above 0, prepares to compress with it at that level.
func NewZstdDict(dict []byte, level int) (*ZstdDict, error) {
	zs, zds := int(C.gz_zdict_size()), int(C.gz_zdec_size())
	zs = (zs + 63) &^ 63
	mem := C.malloc(C.size_t(zs + len(dict) + zds))
	if mem == nil {
		return nil, errors.New("codec: no memory for a zstd dictionary")
	}
	d := &ZstdDict{mem: mem, zd: (*C.gz_zdict)(mem), held: int64(zs + len(dict))}
	runtime.SetFinalizer(d, (*ZstdDict).free)
	bytes := unsafe.Slice((*byte)(unsafe.Add(mem, zs)), len(dict))
	copy(bytes, dict)
	scratch := (*C.gz_zdec)(unsafe.Add(mem, zs+len(dict)))
	if len(dict) == 0 || C.gz_zdict_load(d.zd, scratch, (*C.uint8_t)(unsafe.Pointer(&bytes[0])), C.size_t(len(dict))) < 0 {
		d.free()
		return nil, fmt.Errorf("codec: not a zstd dictionary (%d bytes): %w", len(dict), ErrCorrupt)
	}
	d.id = binary.LittleEndian.Uint32(dict[4:]) // the load read it there
	if d.ddict = C.ZSTD_createDDict_byReference(unsafe.Pointer(&bytes[0]), C.size_t(len(dict))); d.ddict == nil {
		d.free()
		return nil, errors.New("codec: libzstd does not take the dictionary")
	}
	if level > 0 {
		d.cdict = C.ZSTD_createCDict(unsafe.Pointer(&bytes[0]), C.size_t(len(dict)), C.int(level))
		d.cctx = C.ZSTD_createCCtx()
		if d.cdict == nil || d.cctx == nil {
			d.free()
			return nil, fmt.Errorf("codec: libzstd does not compress with the dictionary at level %d", level)
		}
	}
	return d, nil
}

// free gives back what d holds.
func (d *ZstdDict) free() {
	if d.cctx != nil {
		C.ZSTD_freeCCtx(d.cctx)
	}
	if d.cdict != nil {
		C.ZSTD_freeCDict(d.cdict)
	}
	if d.ddict != nil {
		C.ZSTD_freeDDict(d.ddict)
	}
	C.free(d.mem)
	d.mem, d.zd, d.ddict, d.cdict, d.cctx = nil, nil, nil, nil, nil
	runtime.SetFinalizer(d, nil)
}

// ID is the dictionary's ID, which its frames name.
func (d *ZstdDict) ID() uint32 { return d.id }

// HeldBytes is the memory zstddec.c's tables and the dictionary's bytes
// take (libzstd's forms of it are not counted).
func (d *ZstdDict) HeldBytes() int64 { return d.held }

// Compress compresses src into dst as one frame with the dictionary, and
// returns its length, or 0 where it does not fit (or no level was given).
// It allocates in libzstd's context as it goes: not for the serving path.
func (d *ZstdDict) Compress(dst, src []byte) int {
	if d.cdict == nil || len(dst) == 0 || len(src) == 0 {
		return 0
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	r := C.ZSTD_compress_usingCDict(d.cctx, unsafe.Pointer(&dst[0]), C.size_t(len(dst)),
		unsafe.Pointer(&src[0]), C.size_t(len(src)), d.cdict)
	if C.ZSTD_isError(r) != 0 {
		return 0
	}
	return int(r)
}

// DecompressDict decodes src, a frame compressed with dict, into dst, as
// long as what it holds, as far as its first n bytes at least (all of
// them for n == len(dst), where the frame must be exactly that long).
func (z *ZstdDecoder) DecompressDict(dst, src []byte, dict *ZstdDict, n int) error {
	if len(src) == 0 || len(dst) == 0 || n <= 0 || n > len(dst) {
		return ErrCorrupt
	}
	s := z.ctxs.get()
	defer s.put()
	if r := zdecDict(s.ctx.z, dict, dst, src, n); r >= n && (n < len(dst) || r == n) {
		return nil
	}
	// zstddec.c leaves the frame to libzstd, which decodes it whole.
	if libzstdDecodeDict(s.ctx.d, dict, dst, src) != len(dst) {
		return ErrCorrupt
	}
	return nil
}

// zdecDict is zdec with a dictionary: zstddec.c's bytes out, or a negative
// error.
func zdecDict(z *C.gz_zdec, dict *ZstdDict, dst, src []byte, n int) int {
	return int(C.gz_zdec_decode_dict(z, dict.zd, (*C.uint8_t)(unsafe.Pointer(&src[0])), C.size_t(len(src)),
		(*C.uint8_t)(unsafe.Pointer(&dst[0])), C.size_t(len(dst)), C.size_t(n)))
}

// libzstdDecodeDict is libzstdDecode with a dictionary.
func libzstdDecodeDict(d *C.ZSTD_DCtx, dict *ZstdDict, dst, src []byte) int {
	r := C.ZSTD_decompress_usingDDict(d, unsafe.Pointer(&dst[0]), C.size_t(len(dst)),
		unsafe.Pointer(&src[0]), C.size_t(len(src)), dict.ddict)
	if C.ZSTD_isError(r) != 0 {
		return -1
	}
	return int(r)
}
