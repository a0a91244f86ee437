// Package codec holds the page compressors gzramd can use and the batch
// type that carries pages between the batcher and a compression backend.
//
// Every LZ4 producer (the CPU codec here and the CUDA kernels in pkg/gpu)
// emits the standard LZ4 block format, so any stored page can be decoded by
// any LZ4 decoder.
package codec

import (
	"context"
	"errors"
	"fmt"
	"unsafe"
)

// PageSize is the unit the device stores and the codecs compress.
const PageSize = 4096

// ErrCorrupt reports compressed input that does not decode to exactly one page.
var ErrCorrupt = errors.New("codec: corrupt compressed page")

// Codec compresses and decompresses single pages. Implementations are safe
// for concurrent use.
type Codec interface {
	// Name is the algorithm as the operator names it: "lz4" or "zstd".
	Name() string
	// Compress compresses src into dst and returns the compressed length,
	// or 0 when the result would not fit in len(dst) (the caller then keeps
	// the page raw).
	Compress(dst, src []byte) int
	// Decompress decodes src into dst, which must be exactly as long as the
	// original; it fails with ErrCorrupt on malformed input.
	Decompress(dst, src []byte) error
	// HeldBytes is the memory the codec allocated and wrote when it was
	// made, for the contexts its calls use: they allocate nothing.
	HeldBytes() int64
}

// New returns the codec with the given name.
func New(name string) (Codec, error) {
	switch name {
	case "lz4":
		return NewLZ4(), nil
	case "zstd":
		return NewZstd(1)
	}
	return nil, fmt.Errorf("codec: unknown algorithm %q (want lz4 or zstd)", name)
}

// Batch carries up to Cap pages to a BatchCompressor and the results back.
// Backends that need special memory (pinned host buffers for the GPU) make
// their own batches; the slices must not be reallocated by the user.
type Batch struct {
	// Pages holds page i at Pages[i*PageSize:(i+1)*PageSize]; len is Cap*PageSize.
	Pages []byte
	// N is the number of pages in use.
	N int
	// Out receives compressed pages; len is Cap*PageSize.
	Out []byte
	// Offsets[i] and Lens[i] locate page i's compressed bytes in Out.
	// Lens[i] == 0 means the page did not compress below PageSize and is
	// to be stored raw from Pages.
	Offsets []uint32
	Lens    []uint32
	// Limit, when between 1 and PageSize-1, is the longest compressed page
	// worth keeping: a page that does not compress below it may be
	// reported raw (Lens[i] == 0) without finishing, which saves most of
	// the work on incompressible pages. 0 means PageSize-1.
	Limit int
	// Objects, when not nil, groups adjacent pages into objects of
	// several pages, each compressed as one stream: Objects[i] is the
	// number of pages (1 to MaxObjectPages) of the object that starts at
	// page i, 0 for a page within an object that starts before it. An
	// object of several pages has its stream at Offsets[i], Lens[i]
	// bytes (0: it did not compress below ObjectLimit, with Offsets[i]
	// GroupNotSmaller where the compressor found it no smaller than its
	// pages), and its other pages length 0. Objects of one page are
	// pages as without Objects.
	Objects []uint8
}

// MaxObjectPages is the most pages an object of Batch.Objects holds: 64
// KiB, as far back as an LZ4 match reaches.
const MaxObjectPages = 16

// ObjectLimit is the longest stream worth keeping for an object of pages
// pages: shorter than pages times the bound of a page (Limit).
func (b *Batch) ObjectLimit(pages int) int { return pages*(b.limit()+1) - 1 }

// CheckObjects reports whether b.Objects, when not nil, describes whole
// objects of 1 to MaxObjectPages pages over b's N pages.
func (b *Batch) CheckObjects() error {
	if b.Objects == nil {
		return nil
	}
	if len(b.Objects) < b.N {
		return fmt.Errorf("codec: objects given for %d of %d pages", len(b.Objects), b.N)
	}
	for i := 0; i < b.N; {
		p := int(b.Objects[i])
		if p < 1 || p > MaxObjectPages || i+p > b.N {
			return fmt.Errorf("codec: page %d starts an object of %d pages, of a batch of %d", i, p, b.N)
		}
		for j := i + 1; j < i+p; j++ {
			if b.Objects[j] != 0 {
				return fmt.Errorf("codec: page %d, within an object from page %d, starts one of %d pages", j, i, b.Objects[j])
			}
		}
		i += p
	}
	return nil
}

// limit is the output bound for one page.
func (b *Batch) limit() int {
	if b.Limit <= 0 || b.Limit > PageSize-1 {
		return PageSize - 1
	}
	return b.Limit
}

// NewBatch allocates a batch of cap pages on the Go heap (pointer-free
// byte slices, so the GC does not scan them).
func NewBatch(cap int) *Batch {
	return &Batch{
		Pages:   make([]byte, cap*PageSize),
		Out:     make([]byte, cap*PageSize),
		Offsets: make([]uint32, cap),
		Lens:    make([]uint32, cap),
	}
}

// OutputSetBytes is the memory OutputSets lays sets output sets of
// capacity pages over.
func OutputSetBytes(sets, capacity int) int { return sets * capacity * (PageSize + 8) }

// OutputSets lays sets batches of capacity pages with outputs only (Out,
// Offsets and Lens, no Pages) over mem, which must hold OutputSetBytes:
// memory of one kind (pinned, registered with an accelerator) for output
// sets made together.
func OutputSets(mem []byte, sets, capacity int) []*Batch {
	bs := make([]*Batch, sets)
	one := capacity * (PageSize + 8)
	for i := range bs {
		m := mem[i*one : (i+1)*one]
		meta := m[capacity*PageSize:]
		bs[i] = &Batch{
			Out:     m[:capacity*PageSize],
			Offsets: unsafe.Slice((*uint32)(unsafe.Pointer(&meta[0])), capacity),
			Lens:    unsafe.Slice((*uint32)(unsafe.Pointer(&meta[4*capacity])), capacity),
		}
	}
	return bs
}

// Cap is the number of pages the batch can hold.
func (b *Batch) Cap() int { return len(b.Offsets) }

// Page returns page i of the input.
func (b *Batch) Page(i int) []byte { return b.Pages[i*PageSize : (i+1)*PageSize] }

// Compressed returns page i's compressed bytes, or nil if it is stored raw.
func (b *Batch) Compressed(i int) []byte {
	if b.Lens[i] == 0 {
		return nil
	}
	return b.Out[b.Offsets[i] : b.Offsets[i]+b.Lens[i]]
}

// PrefixDecoder is a Codec that can stop decoding once the first bytes
// wanted are out (LZ4): see LZ4.DecompressPrefix.
type PrefixDecoder interface {
	DecompressPrefix(dst, src []byte, n int) error
}

// BatchCompressor compresses whole batches. The CPU implementation is
// CPUBatch; pkg/gpu provides the CUDA one.
type BatchCompressor interface {
	Name() string
	// CompressBatch fills b.Offsets and b.Lens for pages [0, b.N), and
	// for the objects of b.Objects when it is not nil (a compressor that
	// cannot make objects returns an error). It must
	// not modify b.Pages: on error the caller falls back to another
	// compressor with the same batch.
	CompressBatch(ctx context.Context, b *Batch) error
}

// BatchAllocator is implemented by backends that need batches in special
// memory (the GPU's pinned host buffers); `gzramd bench` measures a
// backend with batches from here when it offers them.
type BatchAllocator interface {
	NewBatch(cap int) (*Batch, error)
}

// GroupPages is how many adjacent pages a GroupCompressor compresses
// together: the dense tier's groups.
const GroupPages = 16

// A GroupCompressor compresses groups of GroupPages pages, each group as
// zstd frames of FramePages pages: the dense tier's recompression on the
// GPU. A frame of the whole group has a block a page, so that a decoder
// that stops at a block reads one page of it without decoding the pages
// after it; smaller frames are one block, which ZstdDecoder.DecompressPrefix
// (zstddec.c) also decodes only as far as the page wanted. The frames
// decode with any zstd decoder.
type GroupCompressor interface {
	BatchAllocator
	// MaxGroups is the most groups one CompressGroups takes.
	MaxGroups() int
	// FramePages is the pages of each frame: GroupPages, or a divisor of
	// it.
	FramePages() int
	// Decodes reports whether CompressGroups takes pages of the named
	// codec ("lz4", "zstd": a Codec's Name) as they are stored, to decode
	// them itself.
	Decodes(codec string) bool
	// CompressGroups compresses the b.N/GroupPages groups of b.Pages (b.N
	// a multiple of GroupPages), but for the pages packed gives as stored,
	// which the compressor decodes first: b.Out is read before it is
	// written. Offsets[f] and Lens[f] locate frame f in b.Out, frame k of
	// group g being f = g*GroupPages/FramePages() + k. Lens[f] == 0 is a
	// frame it did not compress (or with a packed page that did not
	// decode), which the caller compresses some other way or leaves as it
	// is; with Offsets[f] == GroupNotSmaller, one that would not be
	// smaller than its pages, which there is no point in compressing
	// elsewhere. b.Pages is only read.
	CompressGroups(ctx context.Context, b *Batch, packed Packed) error
}

// Packed is the pages of a GroupCompressor's batch given as stored: page
// i is not in the batch's Pages but a page of Codec at Out[Offsets[i]:],
// Lens[i] bytes, where Lens[i] > 0. A Packed without Lens gives none.
type Packed struct {
	Codec         string // a codec the compressor Decodes
	Offsets, Lens []uint32
}

// GroupNotSmaller is the offset a GroupCompressor gives a group of length
// 0 whose frame would not be smaller than its pages.
const GroupNotSmaller = ^uint32(0)
