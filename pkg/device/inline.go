// Writes of whole pages compressed in the writer's goroutine (inline).

package device

import (
	"fmt"
	"runtime"

	"github.com/gzramd/gzramd/pkg/codec"
	"github.com/gzramd/gzramd/pkg/pagestore"
	"github.com/gzramd/gzramd/pkg/route"
)

// inlinePages bounds the pages a write compresses in its own goroutine at
// a time, and so the scratch memory each such write holds. inlineFrees is
// the handles it frees at once: one a page, and room for the chunks of an
// object of several pages.
const (
	inlinePages = 32
	inlineFrees = inlinePages + maxChunks
)

// inliner stores whole pages that staging does not take, compressed in the
// writer's goroutine: as objects of several pages where they compress well
// together (Config.ObjectPages), else each on its own. It owns the scratch
// such writes take, made with the device, which partial writes share. It
// is given the page table, whose locks it takes to commit, the objects,
// through whose store it stores (Recover points that at the store it
// rebuilds after the inliner is made), the router that compresses and
// counts, and the codec and config values objects are compressed with.
type inliner struct {
	t      *pageTable
	obj    *objects
	router *route.Router
	codec  codec.Codec
	// objectPages and hugeThreshold are Config's.
	objectPages, hugeThreshold int
	// writes are the scratch of writes compressed in their own
	// goroutine: such a write waits for one rather than allocating fresh
	// memory while the kernel waits for it.
	writes chan *inlineWrite
}

// newInliner makes the inliner of a device of cfg, with its scratch
// written.
func newInliner(cfg Config, t *pageTable, obj *objects) inliner {
	in := inliner{
		t: t, obj: obj, router: cfg.Router, codec: cfg.Codec,
		objectPages: cfg.ObjectPages, hugeThreshold: cfg.HugeThreshold,
		// More than can compress at once (one per thread running Go
		// code). Half as many (GOMAXPROCS + 2) held 2.1 MiB less at 16
		// CPUs, and the CPU backend moved 5 % less of a swap trace for
		// 5 % more CPU a GB, its writes waiting for scratch (issue 39).
		writes: make(chan *inlineWrite, 2*runtime.GOMAXPROCS(0)+2),
	}
	for range cap(in.writes) {
		in.writes <- newInlineWrite(cfg.HugeThreshold - 1)
	}
	return in
}

// held is the memory of the scratch.
func (in *inliner) held() int64 {
	return int64(cap(in.writes)) * (inlinePages*(pageSize+8) + inlineFrees*8)
}

// inlineWrite is the scratch of one write compressed in its own goroutine.
type inlineWrite struct {
	batch *codec.Batch // outputs; Pages is the request's own buffer
	// sub is a part of batch: pages of an object that did not compress
	// well enough together, compressed on their own.
	sub     codec.Batch
	sizes   [inlinePages]int
	owners  [inlinePages]uint32
	handles [inlinePages]pagestore.Handle
	// states and data are, for a page kept on its own, how it is
	// stored and its bytes (see objects.alone), at its allocation's index.
	states [inlinePages]int
	data   [inlinePages][]byte
	objs   [inlinePages]inlineObject
	// frees are the objects the write's pages replaced, freed once they
	// are committed, or before when an object of several pages (up to
	// maxChunks chunks) would not fit (objects.queueFree).
	frees []pagestore.Handle
}

// inlineObject is pages [at, at+pages) of an inline write, stored as one
// object (layout set), or each page on its own.
type inlineObject struct {
	at, pages int
	layout    objectLayout // layout.chunks == 0: pages on their own
	alloc     int          // its first allocation in sizes and handles
}

func newInlineWrite(limit int) *inlineWrite {
	b := &codec.Batch{
		Out:     make([]byte, inlinePages*pageSize),
		Offsets: make([]uint32, inlinePages),
		Lens:    make([]uint32, inlinePages),
		Limit:   limit,
	}
	clear(b.Out) // written now, not first while serving
	w := &inlineWrite{batch: b, frees: make([]pagestore.Handle, 0, inlineFrees)}
	clear(w.frees[:cap(w.frees)])
	return w
}

// write compresses up to inlinePages whole pages in the caller's
// goroutine, stores them, and commits each. A write that the memory limit
// refuses changes nothing.
func (in *inliner) write(first uint32, pages []byte) error {
	t, store := in.t, in.obj.store
	w := <-in.writes
	defer func() { in.writes <- w }()
	n := len(pages) / pageSize
	// The tags of the objects these pages replace are read when they are
	// freed; they are cold (random pages of the store), so ask for them
	// now, to arrive while the pages compress.
	for j := range n {
		idx := first + uint32(j)
		s := t.stripe(idx)
		s.mu.RLock()
		old := t.at(idx)
		s.mu.RUnlock()
		if old.hasAllocation() {
			store.Prefetch(old.handle())
		}
	}
	b := w.batch
	b.Pages, b.N = pages, n
	defer func() { b.Pages = nil }()
	objs := in.compress(w, first, n)
	// The objects' allocations, in order: an object of several pages
	// takes its chunks, a page on its own its object.
	m := 0
	for o := range objs {
		ob := &objs[o]
		ob.alloc = m
		if ob.layout.chunks > 0 {
			for c := range ob.layout.chunks {
				w.sizes[m], w.owners[m] = ob.layout.chunkLen(c), first+uint32(ob.at)
				m++
			}
			continue
		}
		for j := ob.at; j < ob.at+ob.pages; j++ {
			w.states[m], w.data[m] = in.obj.alone(b, j, pages[j*pageSize:(j+1)*pageSize])
			w.sizes[m], w.owners[m] = len(w.data[m]), first+uint32(j)
			m++
		}
	}
	defer clear(w.data[:m]) // the request's buffer and the outputs are not the scratch's
	if k, _, err := store.AllocBatch(pagestore.Short, w.sizes[:m], w.owners[:m], w.handles[:m], 0); err != nil {
		store.FreeBatch(w.handles[:k])
		return fmt.Errorf("device: storing pages %d-%d: %w", first, first+uint32(n)-1, err)
	}
	for o := range objs {
		in.fill(w, &objs[o])
	}
	// Committed group by group, each under one hold of its lock.
	var held stripeHold
	for o := range objs {
		ob := &objs[o]
		for j := ob.at; j < ob.at+ob.pages; j++ {
			idx := first + uint32(j)
			held.lock(t.stripe(idx))
			var e entry
			if ob.layout.chunks > 0 {
				e = partEntry(w.handles[ob.alloc], j-ob.at, ob.pages, ob.layout.chunkLen(0))
			} else {
				a := ob.alloc + j - ob.at
				e = handleEntry(w.states[a], w.handles[a], w.sizes[a])
			}
			w.frees = in.obj.queueFree(w.frees, t.swapLocked(held.s, idx, e))
		}
	}
	held.release()
	store.FreeBatch(w.frees)
	w.frees = w.frees[:0]
	return nil
}

// compress compresses the n pages of w.batch, whose first is page
// first: as objects of up to Config.ObjectPages pages where they compress
// well enough together, each page on its own otherwise. It returns the
// objects in order.
func (in *inliner) compress(w *inlineWrite, first uint32, n int) []inlineObject {
	b := w.batch
	per := in.objectPages
	if per <= 1 {
		in.router.CompressInline(b)
		w.objs[0] = inlineObject{pages: n}
		return w.objs[:1]
	}
	k := 0
	for at := 0; at < n; {
		// Objects start at multiples of per pages: they never span a
		// group, and a rewrite of the same pages replaces them whole.
		m := min(n-at, per-int(first+uint32(at))%per)
		ob := inlineObject{at: at, pages: m}
		if m > 1 {
			out := b.Out[at*pageSize : (at+m)*pageSize]
			limit := min(len(out), m*in.hugeThreshold-1)
			if l, ok := in.obj.keep(in.codec.Compress(out[:limit], b.Pages[at*pageSize:(at+m)*pageSize]), m); ok {
				ob.layout = l
			}
		}
		if ob.layout.chunks > 0 {
			in.router.CountInline(m)
		} else {
			// Compressed page by page into the same outputs.
			w.sub = codec.Batch{
				Pages: b.Pages[at*pageSize : (at+m)*pageSize], N: m,
				Out: b.Out[at*pageSize : (at+m)*pageSize], Offsets: b.Offsets[at : at+m], Lens: b.Lens[at : at+m],
				Limit: b.Limit,
			}
			in.router.CompressInline(&w.sub)
			for j := at; j < at+m; j++ {
				b.Offsets[j] += uint32(at * pageSize)
			}
			w.sub = codec.Batch{}
		}
		w.objs[k] = ob
		k++
		at += m
	}
	return w.objs[:k]
}

// fill writes an inline write's object into what the store gave it:
// an object of several pages into its chunks, its header first; pages on
// their own into theirs.
func (in *inliner) fill(w *inlineWrite, ob *inlineObject) {
	if l := ob.layout; l.chunks > 0 {
		in.obj.fill(w.handles[ob.alloc:ob.alloc+l.chunks], l, ob.pages, w.batch.Out[ob.at*pageSize:][:l.stream])
		return
	}
	for a := ob.alloc; a < ob.alloc+ob.pages; a++ {
		copy(in.obj.store.Bytes(w.handles[a], w.sizes[a]), w.data[a])
	}
}
