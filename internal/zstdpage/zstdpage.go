// Package zstdpage runs kernels/zstd_page.h, the zstd page encoder written
// for the GPU, on the host through cgo: the tests check its frames with
// libzstd and measure its ratio per stage on the memory-page corpus.
package zstdpage

/*
#cgo CFLAGS: -O2
#include "zstd_page.h"

static int zp_go_compress(const uint8_t *src, uint8_t *dst, int cap, zp_workspace *ws, const zp_options *o) {
	return zp_compress_page(src, dst, cap, ws, o);
}

// zp_go_compress_run compresses n consecutive pages, frame i at
// dst + i*ZP_PAGE with its length in lens[i], in one cgo call.
static void zp_go_compress_run(const uint8_t *src, int n, uint8_t *dst, int *lens, zp_workspace *ws, const zp_options *o) {
	for (int i = 0; i < n; i++) lens[i] = zp_compress_page(src + (size_t)i * ZP_PAGE, dst + (size_t)i * ZP_PAGE, ZP_PAGE, ws, o);
}

static void zp_go_defaults(zp_options *o) { zp_defaults(o); }

// zp_go_parse runs stage 1 only and returns the number of sequences.
static int zp_go_parse(const uint8_t *src, zp_workspace *ws, const zp_options *o) {
	zp_options c = *o;
	zp_sanitize(&c);
	return zp_find_sequences(src, ws, &c);
}

// zp_go_log2_table_errors counts the entries of zp_log2q8_tab that differ
// from zp_log2q8.
static int zp_go_log2_table_errors(void) {
	int bad = 0;
	for (uint32_t p = 1; p <= 512; p++) bad += zp_log2q8_tab[p] != zp_log2q8(p);
	return bad;
}

static void zp_go_huf_mk(uint16_t *a, int n) { zp_huf_mk(a, n); }
*/
import "C"

import (
	"sync"
	"unsafe"
)

// PageSize is the only input size.
const PageSize = C.ZP_PAGE

// WorkspaceSize is the encoder's scratch memory per page in flight.
const WorkspaceSize = C.ZP_WORKSPACE_SIZE

// Options select the encoder's stages and match finder. The zero value is
// the default configuration; Default shows its match-finder values.
type Options struct {
	NoHuffman   bool // literals raw or RLE only
	NoFSETables bool // sequences with predefined (or RLE) tables only
	NoRepeat    bool // offsets coded as offset+3 only, no repeat codes
	HashBits    int  // head-table bits (4 to the compiled maximum); 0: default
	MinMatch    int  // shortest new-offset match, 3..8; 0: default
	RepMin      int  // shortest repeat-offset match, 3..8; 0: default
	Depth       int  // hash-chain candidates per position; 0: default
	Lazy        int  // look-ahead positions, 0..2; -1: greedy; 0: default
}

// Default returns the default options with the match-finder values filled in.
func Default() Options {
	var c C.zp_options
	C.zp_go_defaults(&c)
	return Options{HashBits: int(c.hash_bits), MinMatch: int(c.min_match), RepMin: int(c.rep_min), Depth: int(c.depth), Lazy: int(c.lazy)}
}

func (o Options) c() C.zp_options {
	var c C.zp_options
	C.zp_go_defaults(&c)
	if o.NoHuffman {
		c.huffman = 0
	}
	if o.NoFSETables {
		c.fse_custom = 0
	}
	if o.NoRepeat {
		c.rep = 0
	}
	if o.HashBits != 0 {
		c.hash_bits = C.int(o.HashBits)
	}
	if o.MinMatch != 0 {
		c.min_match = C.int(o.MinMatch)
	}
	if o.RepMin != 0 {
		c.rep_min = C.int(o.RepMin)
	}
	if o.Depth != 0 {
		c.depth = C.int(o.Depth)
	}
	switch {
	case o.Lazy < 0:
		c.lazy = 0
	case o.Lazy > 0:
		c.lazy = C.int(o.Lazy)
	}
	return c
}

var workspaces = sync.Pool{New: func() any { return new(C.zp_workspace) }}

// Compress writes src, one page, as a zstd frame into dst and returns its
// length; 0 means the frame would be PageSize bytes or more, or longer
// than dst (the page is then stored raw), or src is not one page.
func Compress(dst, src []byte, opts Options) int {
	if len(src) != PageSize || len(dst) == 0 {
		return 0
	}
	ws := workspaces.Get().(*C.zp_workspace)
	o := opts.c()
	n := C.zp_go_compress((*C.uint8_t)(unsafe.Pointer(&src[0])), (*C.uint8_t)(unsafe.Pointer(&dst[0])), C.int(min(len(dst), 1<<30)), ws, &o)
	workspaces.Put(ws)
	return int(n)
}

// CompressPages compresses each page of src (a whole number of pages)
// into dst at the same offset and sets lens[i] to page i's frame length
// (0: stored raw), in one cgo call.
func CompressPages(dst, src []byte, lens []int32, opts Options) {
	n := len(src) / PageSize
	if n == 0 || len(dst) < n*PageSize || len(lens) < n {
		panic("zstdpage: CompressPages: short dst or lens")
	}
	ws := workspaces.Get().(*C.zp_workspace)
	o := opts.c()
	C.zp_go_compress_run((*C.uint8_t)(unsafe.Pointer(&src[0])), C.int(n), (*C.uint8_t)(unsafe.Pointer(&dst[0])), (*C.int)(unsafe.Pointer(&lens[0])), ws, &o)
	workspaces.Put(ws)
}

// sequence is one parsed sequence: literal length, match length, offset
// value (1-3: repeat code, else offset + 3).
type sequence struct{ ll, ml, of int }

// parse returns the sequences stage 1 finds in page (for tests).
func parse(page []byte, opts Options) []sequence {
	ws := workspaces.Get().(*C.zp_workspace)
	defer workspaces.Put(ws)
	o := opts.c()
	n := int(C.zp_go_parse((*C.uint8_t)(unsafe.Pointer(&page[0])), ws, &o))
	seqs := make([]sequence, n)
	for i := range seqs {
		seqs[i] = sequence{int(ws.seq_ll[i]), int(ws.seq_ml[i]), int(ws.seq_of[i])}
	}
	return seqs
}

// log2TableErrors counts the wrong entries of the encoder's log2 table.
func log2TableErrors() int { return int(C.zp_go_log2_table_errors()) }

// hufDepths returns the depths zp_huf_mk gives the leaves of a Huffman
// tree of counts (ascending, at least two), deepest first.
func hufDepths(counts []uint16) []uint16 {
	a := append([]uint16(nil), counts...)
	C.zp_go_huf_mk((*C.uint16_t)(unsafe.Pointer(&a[0])), C.int(len(a)))
	return a
}
