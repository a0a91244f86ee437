// Objects of several pages: adjacent pages of one write compressed together.

package device

import (
	"encoding/binary"
	"errors"
	"fmt"
	"runtime"
	"sync/atomic"
	"unsafe"

	"github.com/gzramd/gzramd/pkg/codec"
	"github.com/gzramd/gzramd/pkg/dense"
	"github.com/gzramd/gzramd/pkg/pagestore"
)

// Pages written together are compressed together, as one object of up to
// Config.ObjectPages pages: LZ4 finds matches across them, and the
// kernel swaps out clusters of adjacent pages. An object never spans two
// groups of groupPages pages, which share a stripe lock: whatever touches
// an object (a read, a write over part of it, the compactor) holds one
// lock, and finds every page that refers to it among 16 entries.
//
// The store keeps objects of up to a page, so an object of several pages
// is kept as chunks of up to a page each, in the store's own classes: a
// first chunk that begins with a header naming the others, then the
// others. Every chunk is tagged with the object's first page (the owner
// Compact reports). Each page's entry names the first chunk, the page's
// place in the object and the object's pages (table.go). The object's
// stream is one standard LZ4 block: any LZ4 decoder reads it once its
// chunks are put end to end.
//
// A page written again, trimmed or zeroed leaves the object; the object
// is freed when its last page leaves it. Until then it holds the memory
// of all its pages: the compactor does not repack it.
const (
	maxObjectPages = 16
	groupPages     = maxObjectPages
	groupShift     = 4 // log2 of groupPages
	chunkSize      = pageSize
	maxChunks      = maxObjectPages

	// The header: the stream's length (4 bytes), the object's pages
	// (a byte, its top bit set for a zstd stream: builds from before the
	// dense tier find the pages wrong and refuse the state, rather than
	// read zstd as LZ4) and chunks (a byte), two reserved bytes, then the
	// handles of the chunks after the first (6 bytes each).
	headerFixed = 8
	handleBytes = 6
	zstdPages   = 0x80
)

// The codecs of objects' streams: LZ4 as objects of inline writes are,
// zstd in the dense tier (dense.go).
const (
	streamLZ4  = 0
	streamZstd = 1
)

var _ [groupPages - 1<<groupShift]struct{} // groupShift is log2 of groupPages
var _ [1<<groupShift - groupPages]struct{}

// objects owns the format of the objects in the store (above): how a page
// or a run of pages is kept, writing an object's chunks, decoding them in
// the scratch reads take, freeing them, and their counts. It is given the
// store, the codec and the huge threshold. Which pages are in which object
// is the page table's (pageTable), which says what a replaced entry leaves
// for objects to free (freeRef).
type objects struct {
	store         *pagestore.Store // set by Recover once it has rebuilt it
	codec         codec.Codec
	prefix        codec.PrefixDecoder // the codec, where it can stop early
	hugeThreshold int
	// zstd decodes the dense tier's objects: the codec when it is zstd,
	// else one made when the device may hold such objects.
	zstd zstdDecoder
	// fast is the codec of the fast tier's objects of several pages: the
	// device's own, LZ4 or zstd.
	fast byte
	// frames caches the dense tier's frames that reads decoded, made
	// with the dense tier's decoder (holdZstd).
	frames *frameCache
	// scratches holds what reading objects of several pages needs, made
	// with the device when it may hold such objects (nil otherwise): a
	// read waits for one rather than allocating.
	scratches chan *objectScratch

	packedObjects, packedChunks, denseObjects, denseBytes atomic.Int64
}

// zstdDecoder decodes the dense tier's objects: codec.Zstd or
// codec.ZstdDecoder.
type zstdDecoder interface {
	Decompress(dst, src []byte) error
	DecompressPrefix(dst, src []byte, n int) error
	HeldBytes() int64
}

// init readies o for a device of cfg, whose checks it passed: a zstd
// device's objects of several pages need contexts of their own, as the
// codec's are made for pages.
func (o *objects) init(cfg Config) error {
	o.store, o.codec, o.hugeThreshold = cfg.Store, cfg.Codec, cfg.HugeThreshold
	o.prefix, _ = cfg.Codec.(codec.PrefixDecoder)
	if z, ok := cfg.Codec.(zstdDecoder); ok && cfg.Codec.Name() == "zstd" {
		o.zstd, o.fast = z, streamZstd
	}
	if cfg.ObjectPages <= 1 || o.fast != streamZstd {
		return nil
	}
	z, ok := cfg.Codec.(interface{ HoldObjects(pages int) error })
	if !ok {
		return fmt.Errorf("device: the %s codec makes no objects of several pages", cfg.Codec.Name())
	}
	if err := z.HoldObjects(cfg.ObjectPages); err != nil {
		return fmt.Errorf("device: %w", err)
	}
	return nil
}

// holdScratch makes the scratch reads decode objects of several pages in:
// one for each thread running Go code, and two more, where writes make
// such objects (inline); else at most two more than the dense tier's
// decoders, as the objects are the dense tier's (reads of idle pages,
// which wait for a decoder anyway) or left by the process before.
func (o *objects) holdScratch(inline bool) {
	n := runtime.GOMAXPROCS(0) + 2
	if !inline {
		n = min(n, denseDecoders+2)
	}
	o.scratches = make(chan *objectScratch, n)
	for range cap(o.scratches) {
		sc := new(objectScratch)
		clear(sc.in[:]) // written now, not first while serving
		clear(sc.out[:])
		o.scratches <- sc
	}
}

// holdZstd makes the decoder of the dense tier's objects, if there is
// none, and the cache of the frames it decodes.
func (o *objects) holdZstd() error {
	if o.frames == nil {
		o.frames = newFrameCache()
	}
	if o.zstd != nil {
		return nil
	}
	z, err := codec.NewZstdDecoder(denseDecoders)
	if err != nil {
		return fmt.Errorf("device: the dense tier's decoder: %w", err)
	}
	o.zstd = z
	return nil
}

// held is the memory o holds from the start: its scratch, and the
// decoder of the dense tier's objects where it made one, and the cache
// of their frames.
func (o *objects) held() (scratch, dense int64) {
	scratch = int64(cap(o.scratches)) * int64(unsafe.Sizeof(objectScratch{}))
	if z, ok := o.zstd.(*codec.ZstdDecoder); ok {
		dense = z.HeldBytes()
	}
	if o.frames != nil {
		dense += o.frames.held()
	}
	return scratch, dense
}

// scratch takes an object scratch, or nil when there is none. It must be
// taken before any stripe lock: a holder may wait for a lock.
func (o *objects) scratch() *objectScratch {
	if o.scratches == nil {
		return nil
	}
	sc := <-o.scratches
	sc.decoded, sc.readPages = 0, 0
	return sc
}

func (o *objects) putScratch(sc *objectScratch) {
	if sc != nil {
		o.scratches <- sc
	}
}

// objectLayout is how an object of a stream of some length is chunked.
type objectLayout struct {
	stream, chunks, header, total int
	codec                         byte // streamLZ4 or streamZstd
}

// layoutFor returns the layout of an object whose stream is n bytes, and
// false when it needs more than maxChunks chunks.
func layoutFor(n int) (objectLayout, bool) {
	for c := 1; c <= maxChunks; c++ {
		h := headerFixed + handleBytes*(c-1)
		if h+n <= c*chunkSize {
			return objectLayout{stream: n, chunks: c, header: h, total: h + n}, true
		}
	}
	return objectLayout{}, false
}

// chunkLen is chunk i's length.
func (l objectLayout) chunkLen(i int) int { return min(chunkSize, l.total-i*chunkSize) }

// objectHeader reads the header at the head of first, a first chunk of
// the given length, and checks it against the entry's pages.
func objectHeader(first []byte, pages int) (objectLayout, error) {
	if len(first) < headerFixed {
		return objectLayout{}, fmt.Errorf("first chunk of %d bytes, shorter than a header", len(first))
	}
	n := int(binary.LittleEndian.Uint32(first))
	l, ok := layoutFor(n)
	switch {
	case !ok:
		return l, fmt.Errorf("a stream of %d bytes", n)
	case int(first[4]&^zstdPages) != pages || int(first[5]) != l.chunks:
		return l, fmt.Errorf("header of %d pages in %d chunks, want %d pages in %d", first[4]&^zstdPages, first[5], pages, l.chunks)
	case l.chunkLen(0) != len(first):
		return l, fmt.Errorf("first chunk of %d bytes, its header says %d", len(first), l.chunkLen(0))
	case first[6] != 0 || first[7] != 0:
		return l, fmt.Errorf("reserved header bytes %d and %d", first[6], first[7])
	}
	if first[4]&zstdPages != 0 {
		l.codec = streamZstd
	}
	return l, nil
}

// header reads the header of an object whose first chunk is first for
// e, an entry of a page of it, and checks that the object's codec is
// e's tier's: zstd in the dense tier, the device's codec in the fast one.
func (o *objects) header(first []byte, e entry) (objectLayout, error) {
	l, err := objectHeader(first, e.partPages())
	want := o.fast
	if e.dense() {
		want = streamZstd
	}
	if err == nil && l.codec != want {
		err = fmt.Errorf("codec %d, named by an entry of a tier of codec %d", l.codec, want)
	}
	return l, err
}

// putHeader writes an object's header at the head of its first chunk.
func putHeader(first []byte, l objectLayout, pages int) {
	binary.LittleEndian.PutUint32(first, uint32(l.stream))
	first[4], first[5], first[6], first[7] = byte(pages), byte(l.chunks), 0, 0
	if l.codec == streamZstd {
		first[4] |= zstdPages
	}
}

// keep returns the layout of an object of pages pages whose stream
// is n bytes, and whether it is worth keeping as one: it compressed (n >
// 0) below the huge threshold of its pages, into no more chunks than it
// has pages.
func (o *objects) keep(n, pages int) (objectLayout, bool) {
	if n <= 0 || n > pages*o.hugeThreshold-1 {
		return objectLayout{}, false
	}
	l, ok := layoutFor(n)
	if !ok || l.chunks > pages {
		return objectLayout{}, false
	}
	l.codec = o.fast
	return l, true
}

// alone returns how page i of b, whose raw bytes are raw, is stored: its
// compressed bytes, or raw when it did not compress below the huge
// threshold.
func (o *objects) alone(b *codec.Batch, i int, raw []byte) (state int, obj []byte) {
	c := b.Compressed(i)
	if len(c) == 0 || len(c) >= o.hugeThreshold {
		return stateHuge, raw
	}
	return stateStored, c
}

// fill writes an object of several pages of the fast tier into its
// chunks hs (write) and counts it.
func (o *objects) fill(hs []pagestore.Handle, l objectLayout, pages int, stream []byte) {
	o.write(hs, l, pages, stream)
	o.packedObjects.Add(1)
	o.packedChunks.Add(int64(l.chunks))
}

// write writes an object of several pages into its chunks hs, which
// the store gave it: its header, then its stream.
func (o *objects) write(hs []pagestore.Handle, l objectLayout, pages int, stream []byte) {
	first := o.store.Bytes(hs[0], l.chunkLen(0))
	putHeader(first, l, pages)
	for c := 1; c < l.chunks; c++ {
		setChunkHandle(first, c, hs[c])
	}
	n := copy(first[l.header:], stream)
	for c := 1; c < l.chunks; c++ {
		n += copy(o.store.Bytes(hs[c], l.chunkLen(c)), stream[n:])
	}
}

// chunkHandle and setChunkHandle read and write the handle of chunk i
// (i >= 1) in a first chunk's header.
func chunkHandle(first []byte, i int) pagestore.Handle {
	b := first[headerFixed+handleBytes*(i-1):]
	return pagestore.Handle(uint64(binary.LittleEndian.Uint32(b)) | uint64(binary.LittleEndian.Uint16(b[4:]))<<32)
}

func setChunkHandle(first []byte, i int, h pagestore.Handle) {
	b := first[headerFixed+handleBytes*(i-1):]
	binary.LittleEndian.PutUint32(b, uint32(h))
	binary.LittleEndian.PutUint16(b[4:], uint16(h>>32))
}

// objectScratch is what reading an object of several pages needs: its
// chunks put end to end, and its pages decoded. Reads and partial writes
// take one before any stripe lock (see objects.scratch).
type objectScratch struct {
	in  [maxObjectPages * pageSize]byte
	out [maxObjectPages * pageSize]byte
	// decoded is the first chunk of the object in out, 0 for none, and
	// decodedTo how many of its bytes are. They are valid while the lock
	// of that object's group is held without a break.
	decoded   pagestore.Handle
	decodedTo int
	// readPages is the pages of the read (ReadAt) the scratch serves: 0
	// for any other use, which leaves the cache of dense frames alone.
	readPages int
}

// decode decodes the object of which e is a page into sc.out, as far
// as its first upto pages at least (LZ4 and zstd stop there: a
// read of one page decodes half an object on average), unless that much
// is there already, and returns its pages. The caller holds the lock of
// the page's group.
func (o *objects) decode(idx uint32, e entry, sc *objectScratch, upto int) ([]byte, error) {
	pages := e.partPages()
	out := sc.out[:pages*pageSize]
	want := upto * pageSize
	if sc.decoded == e.handle() && sc.decodedTo >= want {
		return out, nil
	}
	sc.decoded = 0
	first := o.store.Bytes(e.handle(), e.length())
	l, err := o.header(first, e)
	if err != nil {
		return nil, fmt.Errorf("device: page %d: object %#x: %w", idx, e.handle(), err)
	}
	src := first[l.header:]
	if l.chunks > 1 {
		n := copy(sc.in[:], src)
		for i := 1; i < l.chunks; i++ {
			n += copy(sc.in[n:], o.store.Bytes(chunkHandle(first, i), l.chunkLen(i)))
		}
		src = sc.in[:n]
	}
	// A read's frame of the dense tier comes from the cache of decoded
	// frames where it holds that much. A read of several pages decodes a
	// frame it does not find whole: the kernel's next readahead window
	// begins in the frame this one ends in.
	cached := l.codec == streamZstd && o.frames != nil && sc.readPages > 0 && pages <= dense.FramePages
	if cached {
		if n := o.frames.get(e.handle(), pages, src, out, want); n > 0 {
			sc.decoded, sc.decodedTo = e.handle(), n
			return out, nil
		}
		if sc.readPages > 1 {
			want = len(out)
		}
	}
	switch {
	case l.codec == streamZstd && o.zstd == nil:
		err = errors.New("no zstd decoder")
	case l.codec == streamZstd && want < len(out):
		err = o.zstd.DecompressPrefix(out, src, want)
	case l.codec == streamZstd:
		err, want = o.zstd.Decompress(out, src), len(out)
	case o.prefix != nil && want < len(out):
		err = o.prefix.DecompressPrefix(out, src, want)
	default:
		err, want = o.codec.Decompress(out, src), len(out)
	}
	if err != nil {
		return nil, fmt.Errorf("device: page %d: object of %d pages does not decode: %w", idx, pages, err)
	}
	if cached {
		o.frames.put(e.handle(), pages, src, out[:want])
	}
	sc.decoded, sc.decodedTo = e.handle(), want
	return out, nil
}

// freeRef is what an entry that was replaced leaves to free: the handle
// of its allocation in the store, with partRef set for an object of several pages (its
// first chunk, which names the others), and denseRef for one of the dense
// tier's. 0 is nothing.
type freeRef uint64

const (
	partRef  = 1 << 63
	denseRef = 1 << 62
)

// appendChunks appends the handles ref frees to hs. Once no entry refers
// to an object, nothing changes it: the compactor finds no page to move
// it for.
func (o *objects) appendChunks(hs []pagestore.Handle, ref freeRef) []pagestore.Handle {
	if ref == 0 {
		return hs
	}
	h := pagestore.Handle(ref &^ (partRef | denseRef))
	if ref&partRef != 0 {
		first := o.store.Bytes(h, chunkSize)
		if n := int(first[5]); n <= maxChunks {
			for i := 1; i < n; i++ {
				hs = append(hs, chunkHandle(first, i))
			}
			o.packedObjects.Add(-1)
			o.packedChunks.Add(-int64(n))
			if l, ok := layoutFor(int(binary.LittleEndian.Uint32(first))); ok && ref&denseRef != 0 {
				o.denseObjects.Add(-1)
				o.denseBytes.Add(-int64(l.total))
			}
		}
	}
	return append(hs, h)
}

// queueFree appends what ref frees to hs, first freeing what hs holds
// when it has no room left for an object's chunks: hs never grows.
func (o *objects) queueFree(hs []pagestore.Handle, ref freeRef) []pagestore.Handle {
	if ref == 0 {
		return hs
	}
	if cap(hs)-len(hs) < maxChunks {
		o.store.FreeBatch(hs)
		hs = hs[:0]
	}
	return o.appendChunks(hs, ref)
}

// free frees what ref names.
func (o *objects) free(ref freeRef) {
	switch {
	case ref == 0:
	case ref&partRef == 0:
		o.store.Free(pagestore.Handle(ref))
	default:
		var hs [maxChunks]pagestore.Handle
		o.store.FreeBatch(o.appendChunks(hs[:0], ref))
	}
}
