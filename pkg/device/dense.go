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
// (RunDense) decodes such a group and compresses its pages together as
// one zstd frame, stored as an object of several pages (object.go) whose
// entries carry the dense bit. The pages of a group compressed together
// gain what a larger window and one set of entropy tables find across
// them: on the shared corpus, zstd -1 over 64 KiB stores 13 % more than
// over single pages, and zstd 40-50 % more than LZ4.
//
// A page of the group written, trimmed or zeroed leaves the object as it
// leaves any object, into the fast tier; the object goes with its last
// page. A read decodes the whole object (zstd cannot stop early), so a
// group that is read again is costlier to read than the fast tier's
// pages: it is the price of the idle ones' memory.
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
	// Level is zstd's level (default 3: on the shared corpus 2 % denser
	// than 1, for a fifth more of the recompressor's CPU).
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
	// denseBlock is the input of one block of a dense object's frame: a
	// read decodes the blocks up to the one that holds the page it wants.
	denseBlock = 16 << 10
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
	sizes   [maxChunks]int
	owners  [maxChunks]uint32
	handles [maxChunks]pagestore.Handle
	frees   []pagestore.Handle

	// gpu, when set, recompresses groups in batches (SetDenseGPU).
	gpu atomic.Pointer[denseGPU]

	groups, pages, raced, kept atomic.Uint64
	bytesIn, bytesOut          atomic.Uint64
	onGPU, declined            atomic.Uint64
	busy, gpuTime              atomic.Int64 // nanoseconds
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
		cfg.Level = 3
	}
	switch {
	case cfg.After < 0:
		return nil, fmt.Errorf("device: dense tier after %v: want a duration above zero", cfg.After)
	case cfg.CPU < 0.01 || cfg.CPU > 1:
		return nil, fmt.Errorf("device: dense tier CPU share %v: want 0.01 to 1", cfg.CPU)
	}
	comp, err := codec.NewZstdObjects(cfg.Level, groupPages*pageSize, denseBlock)
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
	return d.commitDense(g, age, &t.snap, pages, t.compress(raw, before), before, stored)
}

// compress compresses raw on the CPU into the tier's stream, and returns
// the frame, or nil where it would not be smaller than before.
func (t *denseTier) compress(raw []byte, before int) []byte {
	n := t.comp.Compress(t.stream[:min(len(t.stream), before)], raw)
	if n <= 0 {
		return nil
	}
	return t.stream[:n]
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
			settled, cerr = d.commitDense(qg.g, qg.age, &q.snaps[i], groupPages, frame, qg.before, qg.stored)
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

// commitDense stores frame, the pages of group g compressed together,
// as the group's dense object, if no page of the group was accessed since
// snap was taken at age age (nothing else changes a group's age while the
// recompressor works; an access zeroes it before it changes an entry)
// and if frame is smaller than the before bytes the group's stored pages
// took. It reports whether the group is settled.
func (d *Device) commitDense(g, age uint32, snap *[groupPages]entry, pages int, frame []byte, before, stored int) (settled bool, err error) {
	t := d.dense
	lo := g << groupShift
	// Kept only when it is smaller than what it replaces.
	l, ok := layoutFor(len(frame))
	if len(frame) == 0 || !ok || l.total >= before {
		t.kept.Add(1)
		return true, nil
	}
	l.codec = streamZstd
	for c := range l.chunks {
		t.sizes[c], t.owners[c] = l.chunkLen(c), lo
	}
	if k, _, err := d.cfg.Store.AllocBatch(t.sizes[:l.chunks], t.owners[:l.chunks], t.handles[:l.chunks], 0); err != nil {
		d.cfg.Store.FreeBatch(t.handles[:k])
		return false, nil // the store is full: tried again later
	}
	d.writeObject(t.handles[:l.chunks], l, pages, frame)
	s := d.stripe(lo)
	s.mu.Lock()
	changed := t.ages[g].Load() != age
	for k := range pages {
		changed = changed || d.table[lo+uint32(k)] != snap[k]
	}
	if changed {
		s.mu.Unlock()
		d.cfg.Store.FreeBatch(t.handles[:l.chunks])
		t.raced.Add(1)
		return false, nil
	}
	for k := range pages {
		if storedState(snap[k]) {
			e := partEntry(t.handles[0], k, pages, l.chunkLen(0)) | denseBit
			t.frees = d.queueFree(t.frees, d.swapLocked(s, lo+uint32(k), e))
		}
	}
	d.packedObjects.Add(1)
	d.packedChunks.Add(int64(l.chunks))
	d.denseObjects.Add(1)
	d.denseBytes.Add(int64(l.total))
	s.mu.Unlock()
	d.cfg.Store.FreeBatch(t.frees)
	t.frees = t.frees[:0]
	t.groups.Add(1)
	t.pages.Add(uint64(stored))
	t.bytesIn.Add(uint64(before))
	t.bytesOut.Add(uint64(l.total))
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
// pages from lo, if any, are all in one zstd object: a dense one, or the
// fast tier's own over the whole group (zstd with --object-pages 16),
// which recompressing would only make again, after decoding it. The
// caller holds the group's lock.
func (d *Device) asDenseAsItGets(lo uint32, pages int) bool {
	var h pagestore.Handle
	for k := range pages {
		e := d.table[lo+uint32(k)]
		switch {
		case e.state() == statePart && (e.dense() || d.fastStream == streamZstd) && (h == 0 || e.handle() == h):
			h = e.handle()
		case e.state() == stateStaged || storedState(e):
			return false
		}
	}
	return h != 0
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
