// The dense tier: groups of pages left idle recompressed as one zstd object.

package device

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/gzramd/gzramd/pkg/codec"
	"github.com/gzramd/gzramd/pkg/pagestore"
)

// Pages the kernel swapped out and has not touched since are mostly never
// read again: they are worth their CPU once more, to be kept denser. The
// device sees every access, so it knows which groups of groupPages pages
// have been idle for Config.Dense.After, and a background recompressor
// (RunDense) decodes such a group and compresses it again with more
// effort, as frames of denseFramePages adjacent pages, each stored as an
// object of several pages (object.go) whose entries carry the dense bit.
// Pages compressed together gain what a larger window and one set of
// entropy tables find across them: on the shared corpus, zstd over 16 KiB
// at level 9 stores 17 % more than zstd -1 over single pages, and 69 %
// more than LZ4.
//
// A frame is small and one block, so that a read of a page idle this long
// (the one a user coming back faults on) decodes 16 KiB at most: the
// frames of 64 KiB this tier wrote first stored as much at level 3 but
// took twice as long to read, and their reads were 18x an LZ4 page's
// decode (bench/results/dense-frames-cpu-2026-11-28.md). The GPU still
// writes a frame a group (SetDenseGPU), and objects of either shape are
// read alike, so a device written by an earlier build is taken over as
// it is.
//
// A page of the group written, trimmed or zeroed leaves its object as it
// leaves any object, into the fast tier; the object goes with its last
// page.
//
// Nothing of the tier is in the device's files beyond its objects and
// entries: idle ages start again at zero in a process that takes the
// device over, so a takeover delays recompression by one threshold.

// DenseConfig configures the dense tier.
type DenseConfig struct {
	// After is how long a group must go untouched (read or written)
	// before it is recompressed; 0 turns the tier off.
	After time.Duration
	// CPU is the share of one CPU the recompressor may use, from 0.01
	// to 1 (default 0.1): it sleeps in proportion to its work, as
	// zram's recompression is bounded by max_pages.
	CPU float64
	// Level is the frames' zstd level, 1 to 19 (default denseLevel):
	// higher stores more for more of the recompressor's CPU, and reads
	// cost the same.
	Level int
}

const (
	// idleTicks is how many ticks of the ager (After/idleTicks) a group
	// must see without an access to be idle.
	idleTicks = 4
	// settledBit marks a group the recompressor has seen idle and left
	// as it is: dense already, or not worth it. An access clears it.
	settledBit = 1 << 31
	ageMask    = 0xff
	// denseDecoders is how many reads of dense objects run at once on a
	// device whose codec is not zstd: such reads are of idle pages, and
	// each context holds 96 KiB.
	denseDecoders = 4
	// denseFramePages is the most pages of a frame the CPU writes: 16
	// KiB, one block, the smallest frame that stores about what the 64
	// KiB frames did with more effort
	// (bench/results/dense-frames-cpu-2026-11-28.md).
	denseFramePages = 4
	// maxDenseChunks is the most chunks a group's frames take: as
	// smaller than the pages they replace, their bytes fill at most
	// maxChunks chunks, and each frame may end in one chunk more.
	maxDenseChunks = maxChunks + groupPages/denseFramePages
	// denseLevel is the frames' zstd level by default. Over 16 KiB
	// frames of the shared corpus (same-filled pages in), level 5 stores
	// 4.03 at 137 MB/s of a core, 0.9 % less than level 3 stored over 64
	// KiB frames, at 2.6 times its CPU; 4 stores 1.7 % less than 5 at
	// 178 MB/s, 6 0.3 % more at 86 MB/s, and 9 1 % more at 31 MB/s
	// (--dense-level).
	denseLevel = 5
	// denseSlice is the work the recompressor does between two sleeps
	// of its budget.
	denseSlice = 2 * time.Millisecond
)

// denseTier is the recompressor's state and its memory, made and written
// with the device.
type denseTier struct {
	cfg DenseConfig
	// ages holds, for each group, the ager's ticks since the group was
	// last accessed (ageMask bits) and settledBit.
	ages []atomic.Uint32
	comp *codec.ZstdObjects
	// Used by the recompressor's goroutine alone.
	sc      objectScratch
	raw     [groupPages * pageSize]byte
	stream  [groupPages * pageSize]byte
	snap    [groupPages]entry
	frames  [groupPages / denseFramePages]denseFrame
	layouts [groupPages / denseFramePages]objectLayout
	sizes   [maxDenseChunks]int
	owners  [maxDenseChunks]uint32
	handles [maxDenseChunks]pagestore.Handle
	frees   []pagestore.Handle

	// gpu, when set, recompresses groups in batches (SetDenseGPU).
	gpu atomic.Pointer[denseGPU]

	groups, pages, raced, kept atomic.Uint64
	bytesIn, bytesOut          atomic.Uint64
	onGPU, declined            atomic.Uint64
	busy, gpuTime              atomic.Int64 // nanoseconds
}

// denseFrame is one frame of a group's dense objects: its pages from the
// group's page first, and its bytes.
type denseFrame struct {
	first, pages int
	data         []byte
}

// denseGPU is the recompressor's batch on a GPU: the groups snapshotted
// into b's pages, compressed together by one CompressGroups.
type denseGPU struct {
	gc     codec.GroupCompressor
	b      *codec.Batch
	queued []queuedGroup
	snaps  [][groupPages]entry
	// LZ4 pages go to the GPU as they are stored, packed into the
	// batch's output (lz4At bytes of it so far), and are decoded there:
	// page i of the batch at lz4Offsets[i], lz4Lens[i] bytes (0: the
	// page is decoded into the batch's pages already).
	lz4Offsets, lz4Lens []uint32
	lz4At               int
}

// queuedGroup is a group waiting in the GPU's batch: its index, its age
// when snapshotted, and what snapshotGroup found.
type queuedGroup struct {
	g, age         uint32
	stored, before int
}

const (
	// denseGPUTimeout bounds a batch of groups on the GPU: past it the
	// tier gives the GPU up and recompresses on the CPU.
	denseGPUTimeout = 10 * time.Second
	// denseGPUGroups is the most groups a batch holds: 4 MiB of pinned
	// memory, a batch every few milliseconds, some 290 MB of idle pages
	// a second (bench/results/dense-gpu-h100-2026-11-26.md), more than
	// swap ages.
	denseGPUGroups = 32
)

func newDenseTier(cfg DenseConfig, pages uint32) (*denseTier, error) {
	if cfg.CPU == 0 {
		cfg.CPU = 0.1
	}
	if cfg.Level == 0 {
		cfg.Level = denseLevel
	}
	switch {
	case cfg.After < 0:
		return nil, fmt.Errorf("device: dense tier after %v: want a duration above zero", cfg.After)
	case cfg.CPU < 0.01 || cfg.CPU > 1:
		return nil, fmt.Errorf("device: dense tier CPU share %v: want 0.01 to 1", cfg.CPU)
	case cfg.Level < 1 || cfg.Level > 19:
		return nil, fmt.Errorf("device: dense tier zstd level %d: want 1 to 19", cfg.Level)
	}
	comp, err := codec.NewZstdObjects(cfg.Level, denseFramePages*pageSize, denseFramePages*pageSize)
	if err != nil {
		return nil, fmt.Errorf("device: dense tier: %w", err)
	}
	t := &denseTier{
		cfg:   cfg,
		ages:  make([]atomic.Uint32, (pages+groupPages-1)/groupPages),
		comp:  comp,
		frees: make([]pagestore.Handle, 0, inlineFrees),
	}
	// Written now, not first while serving: a fresh allocation's pages
	// are not faulted in until written, and every request touches its
	// group's age.
	for i := range t.ages {
		t.ages[i].Store(0)
	}
	clear(t.sc.in[:])
	clear(t.sc.out[:])
	clear(t.raw[:])
	clear(t.stream[:])
	clear(t.frees[:cap(t.frees)])
	return t, nil
}

// heldBytes is the memory the tier holds: from the start, and its GPU
// batch once it has one.
func (t *denseTier) heldBytes() int64 {
	held := int64(len(t.ages))*4 + int64(len(t.sc.in)+len(t.sc.out)+len(t.raw)+len(t.stream)) + t.comp.HeldBytes()
	if q := t.gpu.Load(); q != nil {
		held += int64(len(q.b.Pages)+len(q.b.Out)) + int64(len(q.b.Offsets)+len(q.b.Lens)+len(q.lz4Offsets)+len(q.lz4Lens))*4 +
			int64(cap(q.snaps))*groupPages*8
	}
	return held
}

// SetDenseGPU has the dense tier recompress on gc from now on, in batches
// of its pinned memory (allocated here: 4 MiB for up to denseGPUGroups
// groups). LZ4 pages go to it as they are stored, to be
// decoded there. It does nothing on a device without the tier.
func (d *Device) SetDenseGPU(gc codec.GroupCompressor) error {
	t := d.dense
	if t == nil {
		return nil
	}
	groups := min(gc.MaxGroups(), denseGPUGroups)
	if groups < 1 {
		return fmt.Errorf("device: dense tier: the GPU takes %d groups at a time", groups)
	}
	b, err := gc.NewBatch(groups * groupPages)
	if err != nil {
		return fmt.Errorf("device: dense tier: the GPU's batch: %w", err)
	}
	// Written now, not first by the recompressor: faulted in here.
	clear(b.Pages)
	clear(b.Out)
	q := &denseGPU{gc: gc, b: b, queued: make([]queuedGroup, 0, groups), snaps: make([][groupPages]entry, groups)}
	if d.cfg.Codec.Name() == "lz4" {
		q.lz4Offsets, q.lz4Lens = make([]uint32, groups*groupPages), make([]uint32, groups*groupPages)
	}
	t.gpu.Store(q)
	return nil
}

// touch marks the groups of [off, off+length) accessed.
func (d *Device) touch(off, length int64) {
	if d.dense == nil || length <= 0 {
		return
	}
	first, last := off/pageSize>>groupShift, (off+length-1)/pageSize>>groupShift
	for g := first; g <= last; g++ {
		// Loaded first: a group read over and over is not written
		// over and over, nor its cache line taken from other cores.
		if a := &d.dense.ages[g]; a.Load() != 0 {
			a.Store(0)
		}
	}
}

// RunDense runs the dense tier's ager and recompressor until ctx is done;
// it returns at once on a device without the tier.
func (d *Device) RunDense(ctx context.Context) {
	t := d.dense
	if t == nil {
		return
	}
	tick := max(t.cfg.After/idleTicks, 50*time.Microsecond)
	tk := time.NewTicker(tick)
	defer tk.Stop()
	var busy time.Duration
	for {
		select {
		case <-ctx.Done():
			return
		case <-tk.C:
		}
		for g := range t.ages {
			a := &t.ages[g]
			v := a.Load()
			if v&ageMask < ageMask {
				if !a.CompareAndSwap(v, v+1) {
					continue // accessed just now
				}
				v++
			}
			if v&settledBit != 0 || v&ageMask < idleTicks {
				continue
			}
			start := time.Now()
			var onGPU time.Duration // waiting for the GPU: not the budget's
			if q := t.gpu.Load(); q != nil && d.queue(q, uint32(g), v) {
				if len(q.queued) == cap(q.queued) {
					onGPU = d.flushGPU(ctx, q)
				}
			} else {
				settled, err := d.recompress(uint32(g), v)
				d.settle(uint32(g), v, settled, err)
			}
			took := time.Since(start) - onGPU
			t.busy.Add(int64(took))
			if busy += took; busy >= denseSlice {
				pause := time.Duration(float64(busy) * (1 - t.cfg.CPU) / t.cfg.CPU)
				busy = 0
				select {
				case <-ctx.Done():
					return
				case <-time.After(pause):
				}
			}
		}
		if q := t.gpu.Load(); q != nil && len(q.queued) > 0 {
			start := time.Now()
			onGPU := d.flushGPU(ctx, q)
			t.busy.Add(int64(time.Since(start) - onGPU))
		}
	}
}

// settle marks group g, of age age, settled if it is (or its recompression
// failed: it is not tried again until it is accessed), unless it was
// accessed since.
func (d *Device) settle(g, age uint32, settled bool, err error) {
	if err != nil {
		d.log.Error("dense tier: a group could not be recompressed", "page", g<<groupShift, "err", err)
		settled = true
	}
	if settled {
		d.dense.ages[g].CompareAndSwap(age, age|settledBit)
	}
}

// recompress moves group g, whose age was age, into the dense tier on the
// CPU: its stored pages decoded, compressed together, and committed if
// the group was not accessed meanwhile. It reports whether the group is
// settled (dense, or not worth it) rather than to be tried again.
func (d *Device) recompress(g, age uint32) (settled bool, err error) {
	t := d.dense
	lo := g << groupShift
	pages := int(min(groupPages, d.pages-lo))
	if pages < 2 {
		return true, nil // an object has two pages at least
	}
	raw := t.raw[:pages*pageSize]
	s := d.stripe(lo)
	s.mu.RLock()
	if d.asDenseAsItGets(lo, pages) {
		s.mu.RUnlock()
		return true, nil
	}
	stored, before, err := d.snapshotGroup(lo, pages, &t.snap, raw, nil)
	s.mu.RUnlock()
	switch {
	case err != nil:
		return false, err
	case stored < 0: // a page is staged: its batch commits it soon
		return false, nil
	case stored == 0:
		return true, nil
	}
	return d.commitDense(g, age, &t.snap, t.compress(raw, &t.snap, pages, before), before, stored)
}

// compress compresses the group's pages pages in raw on the CPU, as frames
// of denseFramePages pages (framePages) into the tier's stream, and returns
// the frames, none for pages of which none is stored, or nil where they
// would not come out smaller than before bytes together.
func (t *denseTier) compress(raw []byte, snap *[groupPages]entry, pages, before int) []denseFrame {
	frames := t.frames[:0]
	end := min(len(t.stream), before)
	at := 0
	for first, n := 0, 0; first < pages; first += n {
		n = framePages(first, pages)
		stored := false
		for _, e := range snap[first : first+n] {
			stored = stored || storedState(e)
		}
		if !stored {
			continue
		}
		if at >= end {
			return nil
		}
		size := t.comp.Compress(t.stream[at:end], raw[first*pageSize:(first+n)*pageSize])
		if size <= 0 {
			return nil
		}
		frames = append(frames, denseFrame{first: first, pages: n, data: t.stream[at : at+size]})
		at += size
	}
	return frames
}

// framePages is the pages of the frame that begins at page first of a
// group of pages pages: denseFramePages, fewer at the group's end, and
// one fewer where a single page would be left after it (an object has
// two pages at least; a group of one page is not recompressed).
func framePages(first, pages int) int {
	n := min(denseFramePages, pages-first)
	if pages-first-n == 1 && n > 2 {
		n--
	}
	return n
}

// queue snapshots group g, of age age, into the GPU's batch. It reports
// false where the group is for the CPU (the device's last group, when
// short).
func (d *Device) queue(q *denseGPU, g, age uint32) bool {
	lo := g << groupShift
	if d.pages-lo < groupPages {
		return false
	}
	i := len(q.queued)
	raw := q.b.Pages[i*groupPages*pageSize : (i+1)*groupPages*pageSize]
	var lz4 *lz4Pages
	if q.lz4Lens != nil {
		lz4 = &lz4Pages{packed: q.b.Out, at: q.lz4At,
			offsets: q.lz4Offsets[i*groupPages : (i+1)*groupPages], lens: q.lz4Lens[i*groupPages : (i+1)*groupPages]}
	}
	s := d.stripe(lo)
	s.mu.RLock()
	if d.asDenseAsItGets(lo, groupPages) {
		s.mu.RUnlock()
		d.settle(g, age, true, nil)
		return true
	}
	stored, before, err := d.snapshotGroup(lo, groupPages, &q.snaps[i], raw, lz4)
	s.mu.RUnlock()
	switch {
	case err != nil:
		d.settle(g, age, true, err)
	case stored < 0:
	case stored == 0:
		d.settle(g, age, true, nil)
	default:
		q.queued = append(q.queued, queuedGroup{g: g, age: age, stored: stored, before: before})
		if lz4 != nil {
			q.lz4At = lz4.at
		}
	}
	return true
}

// lz4Pages is where snapshotGroup leaves a group's LZ4 pages as they are
// stored: packed from at, each page's offset and length (0 for a page it
// decoded).
type lz4Pages struct {
	packed        []byte
	at            int
	offsets, lens []uint32
}

// flushGPU compresses the groups queued on the GPU and commits them; a
// group the GPU declines is recompressed on the CPU. If the GPU fails, the
// tier gives it up (it may still write the batch's output) and goes on
// on the CPU, with this batch's groups. It returns the time it waited for
// the GPU.
func (d *Device) flushGPU(ctx context.Context, q *denseGPU) time.Duration {
	t := d.dense
	b := q.b
	b.N = len(q.queued) * groupPages
	var lz4Offsets, lz4Lens []uint32
	if q.lz4Lens != nil {
		lz4Offsets, lz4Lens = q.lz4Offsets[:b.N], q.lz4Lens[:b.N]
	}
	cctx, cancel := context.WithTimeout(ctx, denseGPUTimeout)
	start := time.Now()
	err := q.gc.CompressGroups(cctx, b, lz4Offsets, lz4Lens)
	waited := time.Since(start)
	cancel()
	t.gpuTime.Add(int64(waited))
	if err != nil {
		t.gpu.Store(nil)
		d.log.Error("dense tier: recompression on the GPU failed; recompressing on the CPU from now on", "err", err)
	}
	for i, qg := range q.queued {
		var frame []byte
		if err == nil {
			frame = b.Compressed(i)
		}
		var settled bool
		var cerr error
		switch {
		case frame != nil && len(frame) < qg.before:
			t.onGPU.Add(1)
			t.frames[0] = denseFrame{first: 0, pages: groupPages, data: frame}
			settled, cerr = d.commitDense(qg.g, qg.age, &q.snaps[i], t.frames[:1], qg.before, qg.stored)
		case frame != nil || err == nil && b.Offsets[i] == codec.GroupNotSmaller:
			// Not smaller: the CPU's would not be either.
			t.onGPU.Add(1)
			t.kept.Add(1)
			settled = true
		default:
			if err == nil && frame == nil {
				t.declined.Add(1)
			}
			// Its pages may be in the batch only as LZ4 blocks: the CPU
			// takes the group from the table again.
			settled, cerr = d.recompress(qg.g, qg.age)
		}
		d.settle(qg.g, qg.age, settled, cerr)
	}
	q.queued = q.queued[:0]
	q.lz4At = 0
	return waited
}

// commitDense stores frames, the pages of group g compressed again, as the
// group's dense objects, if no page of the group was accessed since snap
// was taken at age age (nothing else changes a group's age while the
// recompressor works; an access zeroes it before it changes an entry)
// and if the objects are smaller than the before bytes the group's
// stored pages took. It reports whether the group is settled.
func (d *Device) commitDense(g, age uint32, snap *[groupPages]entry, frames []denseFrame, before, stored int) (settled bool, err error) {
	t := d.dense
	lo := g << groupShift
	total, chunks := 0, 0
	for i, f := range frames {
		l, ok := layoutFor(len(f.data))
		if len(f.data) == 0 || !ok || chunks+l.chunks > len(t.handles) {
			t.kept.Add(1)
			return true, nil
		}
		l.codec = streamZstd
		t.layouts[i] = l
		for c := range l.chunks {
			t.sizes[chunks], t.owners[chunks] = l.chunkLen(c), lo+uint32(f.first)
			chunks++
		}
		total += l.total
	}
	// Kept only when they are smaller than what they replace.
	if len(frames) == 0 || total >= before {
		t.kept.Add(1)
		return true, nil
	}
	handles := t.handles[:chunks]
	if k, _, err := d.cfg.Store.AllocBatch(t.sizes[:chunks], t.owners[:chunks], handles, 0); err != nil {
		d.cfg.Store.FreeBatch(handles[:k])
		return false, nil // the store is full: tried again later
	}
	at := 0
	for i, f := range frames {
		d.writeObject(handles[at:], t.layouts[i], f.pages, f.data)
		at += t.layouts[i].chunks
	}
	s := d.stripe(lo)
	s.mu.Lock()
	changed := t.ages[g].Load() != age
	for k, f := 0, frames[len(frames)-1]; k < f.first+f.pages; k++ {
		changed = changed || d.table[lo+uint32(k)] != snap[k]
	}
	if changed {
		s.mu.Unlock()
		d.cfg.Store.FreeBatch(handles)
		t.raced.Add(1)
		return false, nil
	}
	at = 0
	for i, f := range frames {
		l := t.layouts[i]
		for k := range f.pages {
			if storedState(snap[f.first+k]) {
				e := partEntry(handles[at], k, f.pages, l.chunkLen(0)) | denseBit
				t.frees = d.queueFree(t.frees, d.swapLocked(s, lo+uint32(f.first+k), e))
			}
		}
		at += l.chunks
	}
	d.packedObjects.Add(int64(len(frames)))
	d.packedChunks.Add(int64(chunks))
	d.denseObjects.Add(int64(len(frames)))
	d.denseBytes.Add(int64(total))
	s.mu.Unlock()
	d.cfg.Store.FreeBatch(t.frees)
	t.frees = t.frees[:0]
	t.groups.Add(1)
	t.pages.Add(uint64(stored))
	t.bytesIn.Add(uint64(before))
	t.bytesOut.Add(uint64(total))
	return true, nil
}

// storedState reports whether e's page is held in the store as data: the
// pages a dense object takes in.
func storedState(e entry) bool {
	switch e.state() {
	case stateStored, stateHuge, statePart:
		return true
	}
	return false
}

// snapshotGroup copies the group's entries into snap and decodes its
// stored pages into out (the others as zeroes, which cost a zstd frame
// nothing), but for its LZ4 pages where lz4 is not nil: those it copies
// there as they are stored. It returns the stored pages (-1 if one is
// staged) and the bytes they take in the store. The caller holds the
// group's lock.
func (d *Device) snapshotGroup(lo uint32, pages int, snap *[groupPages]entry, out []byte, lz4 *lz4Pages) (stored, before int, err error) {
	t := d.dense
	t.sc.decoded = 0
	var seen [groupPages]pagestore.Handle
	objects := 0
	for k := range pages {
		idx := lo + uint32(k)
		e := d.table[idx]
		snap[k] = e
		raw := out[k*pageSize : (k+1)*pageSize]
		if lz4 != nil {
			lz4.lens[k] = 0
		}
		switch {
		case e.state() == stateStaged:
			return -1, 0, nil
		case !storedState(e):
			clear(raw)
			continue
		case e.state() == stateStored && lz4 != nil:
			lz4.offsets[k], lz4.lens[k] = uint32(lz4.at), uint32(e.length())
			lz4.at += copy(lz4.packed[lz4.at:], d.cfg.Store.Bytes(e.handle(), e.length()))
		default:
			if err := d.load(idx, raw, &t.sc, pages-1-k); err != nil {
				return 0, 0, err
			}
		}
		stored++
		if e.state() != statePart {
			before += e.length()
			continue
		}
		known := false
		for _, h := range seen[:objects] {
			known = known || h == e.handle()
		}
		if !known {
			seen[objects] = e.handle()
			objects++
			l, err := objectHeader(d.cfg.Store.Bytes(e.handle(), e.length()), e.partPages())
			if err != nil {
				return 0, 0, fmt.Errorf("page %d: %w", idx, err)
			}
			before += l.total
		}
	}
	return stored, before, nil
}

// asDenseAsItGets reports whether the stored pages of the group of pages
// pages from lo, if any, are all in dense objects (frames the CPU wrote,
// the GPU's frame of the group, or an earlier build's), or all in one zstd
// object of the fast tier's over the whole group (zstd with --object-pages
// 16), which recompressing would only make again, after decoding it. The
// caller holds the group's lock.
func (d *Device) asDenseAsItGets(lo uint32, pages int) bool {
	var fast pagestore.Handle
	dense := false
	for k := range pages {
		e := d.table[lo+uint32(k)]
		switch {
		case e.state() == statePart && e.dense():
			dense = true
		case e.state() == statePart && d.fastStream == streamZstd && (fast == 0 || e.handle() == fast):
			fast = e.handle()
		case e.state() == stateStaged || storedState(e):
			return false
		}
	}
	return dense != (fast != 0)
}

// DenseStats are the dense tier's counters.
type DenseStats struct {
	// Groups recompressed, the pages they held, and the bytes those
	// took in the store before and after.
	Groups, Pages     uint64
	BytesIn, BytesOut uint64
	// Raced: groups written while being recompressed (the work is
	// dropped); Kept: groups that did not compress smaller.
	Raced, Kept uint64
	// Busy is the time the recompressor worked on the CPU.
	Busy time.Duration
	// OnGPU: groups compressed on the GPU (SetDenseGPU); Declined:
	// groups the GPU gave back, compressed on the CPU; GPUTime: the time
	// the recompressor waited for the GPU.
	OnGPU, Declined uint64
	GPUTime         time.Duration
}

func (t *denseTier) stats() DenseStats {
	if t == nil {
		return DenseStats{}
	}
	return DenseStats{
		Groups: t.groups.Load(), Pages: t.pages.Load(),
		BytesIn: t.bytesIn.Load(), BytesOut: t.bytesOut.Load(),
		Raced: t.raced.Load(), Kept: t.kept.Load(),
		Busy:  time.Duration(t.busy.Load()),
		OnGPU: t.onGPU.Load(), Declined: t.declined.Load(),
		GPUTime: time.Duration(t.gpuTime.Load()),
	}
}

// denseSettled reports whether the recompressor has seen every group idle
// and left it settled, for tests and benchmarks that age a device.
func (d *Device) denseSettled() bool {
	for i := range d.dense.ages {
		if d.dense.ages[i].Load()&settledBit == 0 {
			return false
		}
	}
	return true
}
