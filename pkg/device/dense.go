// The device's side of the dense tier (pkg/dense): a group snapshotted,
// its frames committed as dense objects if it is unchanged.

package device

import (
	"context"
	"fmt"
	"slices"
	"sync/atomic"

	"github.com/gzramd/gzramd/pkg/codec"
	"github.com/gzramd/gzramd/pkg/dense"
	"github.com/gzramd/gzramd/pkg/pagestore"
)

// DenseConfig configures the dense tier (dense.Config).
type DenseConfig = dense.Config

// DenseStats are the dense tier's counters (dense.Stats).
type DenseStats = dense.Stats

const (
	// denseDecoders is how many reads of dense objects run at once on a
	// device whose codec is not zstd: such reads are of idle pages, and
	// each context holds 96 KiB.
	denseDecoders = 4
	// maxDenseChunks is the most chunks a group's frames take: as
	// smaller than the pages they replace, their bytes fill at most
	// maxChunks chunks, and each frame may end in one chunk more.
	maxDenseChunks = maxChunks + dense.MaxFrames
)

var _ [groupPages - dense.GroupPages]struct{} // the tier's groups are the device's
var _ [dense.GroupPages - groupPages]struct{}

// denseSide is the device as the dense tier sees it (dense.Device): a
// group snapshotted, and its frames committed if it is unchanged. It owns
// the scratch of the tier's commits, used by the recompressor's goroutine
// alone. It is given the page table, whose group locks it takes, the
// objects, which it writes the frames as, through their store (Recover
// points that at the store it rebuilds after the side is made), and the
// device's read of a page under its lock (Device.load, a func), which its
// snapshots decode pages with.
type denseSide struct {
	t       *pageTable
	obj     *objects
	load    func(idx uint32, dst []byte, sc *objectScratch, ahead int) error
	sc      objectScratch
	layouts [dense.MaxFrames]objectLayout
	sizes   [maxDenseChunks]int
	owners  [maxDenseChunks]uint32
	handles [maxDenseChunks]pagestore.Handle
	frees   []pagestore.Handle
}

// newDenseSide makes the dense tier's side of the device whose table and
// objects are t and obj, its scratch written now, not first by the
// recompressor.
func newDenseSide(t *pageTable, obj *objects, load func(uint32, []byte, *objectScratch, int) error) *denseSide {
	s := &denseSide{t: t, obj: obj, load: load, frees: make([]pagestore.Handle, 0, inlineFrees)}
	clear(s.sc.in[:])
	clear(s.sc.out[:])
	clear(s.frees[:cap(s.frees)])
	return s
}

// held is the memory of the side's scratch.
func (s *denseSide) held() int64 { return int64(len(s.sc.in) + len(s.sc.out)) }

// SetDenseGPU has the dense tier recompress on gc from now on, in batches
// of its pinned memory (dense.Tier.SetGPU). It does nothing on a device
// without the tier.
func (d *Device) SetDenseGPU(gc codec.GroupCompressor) error { return d.dense.SetGPU(gc) }

// RunDense runs the dense tier's ager and recompressor until ctx is done
// (dense.Tier.Run); it returns at once on a device without the tier.
func (d *Device) RunDense(ctx context.Context) { d.dense.Run(ctx) }

// Snapshot copies group g's entries and pages for the tier
// (dense.Device), under the group's lock.
func (s *denseSide) Snapshot(g uint32, pages int, snap *dense.Snapshot, raw []byte, packed *dense.PackedPages) (stored, before int, err error) {
	lo := g << groupShift
	st := s.t.stripe(lo)
	st.mu.RLock()
	if s.asDenseAsItGets(lo, pages) {
		st.mu.RUnlock()
		return 0, 0, nil
	}
	stored, before, err = s.snapshot(lo, pages, snap, raw, packed)
	snap.Writes = st.writes
	st.mu.RUnlock()
	return stored, before, err
}

// Commit stores frames as group g's dense objects if the group is
// unchanged since snap (dense.Device).
func (s *denseSide) Commit(g uint32, snap *dense.Snapshot, frames []dense.Frame, before int, idle *atomic.Uint32, age uint32) (dense.Commit, int) {
	lo := g << groupShift
	total, chunks := 0, 0
	for i, f := range frames {
		l, ok := layoutFor(len(f.Data))
		if len(f.Data) == 0 || !ok || chunks+l.chunks > len(s.handles) {
			return s.keepLong(lo)
		}
		l.codec = streamZstd
		s.layouts[i] = l
		for c := range l.chunks {
			s.sizes[chunks], s.owners[chunks] = l.chunkLen(c), lo+uint32(f.First)
			chunks++
		}
		total += l.total
	}
	// Kept only when they are smaller than what they replace.
	if len(frames) == 0 || total >= before {
		return s.keepLong(lo)
	}
	handles := s.handles[:chunks]
	if k, _, err := s.obj.store.AllocBatch(pagestore.Long, s.sizes[:chunks], s.owners[:chunks], handles, 0); err != nil {
		s.obj.store.FreeBatch(handles[:k])
		return dense.Full, 0 // tried again later
	}
	at := 0
	for i, f := range frames {
		s.obj.write(handles[at:], s.layouts[i], f.Pages, f.Data)
		at += s.layouts[i].chunks
	}
	st := s.t.stripe(lo)
	st.mu.Lock()
	// The idle age alone would not do: a writer marks the group accessed
	// before it writes, and a write slow enough to span the snapshot
	// leaves the age as the snapshot saw it.
	changed := idle.Load() != age || st.writes != snap.Writes
	for k, f := 0, frames[len(frames)-1]; k < f.First+f.Pages; k++ {
		changed = changed || s.t.table[lo+uint32(k)] != entry(snap.Entries[k])
	}
	if changed {
		st.mu.Unlock()
		s.obj.store.FreeBatch(handles)
		return dense.Raced, 0
	}
	at = 0
	for i, f := range frames {
		l := s.layouts[i]
		for k := range f.Pages {
			if storedState(entry(snap.Entries[f.First+k])) {
				e := partEntry(handles[at], k, f.Pages, l.chunkLen(0)) | denseBit
				s.frees = s.obj.queueFree(s.frees, s.t.replaceLocked(lo+uint32(f.First+k), e))
			}
		}
		at += l.chunks
	}
	s.obj.packedObjects.Add(int64(len(frames)))
	s.obj.packedChunks.Add(int64(chunks))
	s.obj.denseObjects.Add(int64(len(frames)))
	s.obj.denseBytes.Add(int64(total))
	st.mu.Unlock()
	s.obj.store.FreeBatch(s.frees)
	s.frees = s.frees[:0]
	return dense.Committed, total
}

// Swept gives back the fast tier's cached empty slabs after a sweep that
// committed or kept groups (dense.Device): the pages the sweep moved out
// left one in nearly every size class, idle.
func (s *denseSide) Swept() { s.obj.store.DropCaches(pagestore.Short) }

// keepLong moves the allocations of group lo's pages, which the tier keeps
// as they are, into long-lived slabs (pagestore.Long), and reports Kept.
// The group is idle: left in the fast tier's slabs, which the rest of the
// pass empties around it, it would pin them until the compactor moved it.
// It moves them as a commit stores frames: only if, under the group's
// lock, nothing changed since it looked.
func (s *denseSide) keepLong(lo uint32) (dense.Commit, int) {
	store := s.obj.store
	pages := min(groupPages, s.t.pages-lo)
	var seen [groupPages]entry
	st := s.t.stripe(lo)
	st.mu.RLock()
	writes := st.writes
	copy(seen[:pages], s.t.table[lo:lo+pages])
	moving, n := s.shortLived(seen[:pages], lo)
	st.mu.RUnlock()
	if n == 0 {
		return dense.Kept, 0
	}
	news := s.handles[:n]
	if k, _, err := store.AllocBatch(pagestore.Long, s.sizes[:n], s.owners[:n], news, 0); err != nil {
		store.FreeBatch(news[:k])
		return dense.Kept, 0
	}
	olds := news // what goes: the copies, if the group changed
	st.mu.Lock()
	if st.writes == writes && slices.Equal(s.t.table[lo:lo+pages], seen[:pages]) {
		olds = s.moveLong(seen[:pages], lo, moving, news)
	}
	st.mu.Unlock()
	store.FreeBatch(olds)
	return dense.Kept, 0
}

// shortLived lists in s.sizes and s.owners the allocations of the group
// whose entries are seen (its first page lo) that short-lived slabs hold:
// a page's own, or the chunks of a fast-tier object it starts. It returns
// the pages whose allocations it listed (bit k for page k) and how many
// it listed. The group's lock is held.
func (s *denseSide) shortLived(seen []entry, lo uint32) (moving uint32, n int) {
	store := s.obj.store
	for k, e := range seen {
		if !(e.hasAllocation() || e.state() == statePart && e.partIndex() == 0 && !e.dense()) ||
			store.LifetimeOf(e.handle()) == pagestore.Long {
			continue
		}
		chunks := 1
		var l objectLayout
		if !e.hasAllocation() {
			var err error
			if l, err = objectHeader(store.Bytes(e.handle(), e.length()), e.partPages()); err != nil {
				continue
			}
			chunks = l.chunks
		}
		if n+chunks > len(s.handles) {
			continue
		}
		for c := range chunks {
			size := e.length()
			if !e.hasAllocation() {
				size = l.chunkLen(c)
			}
			s.sizes[n], s.owners[n] = size, lo+uint32(k)
			n++
		}
		moving |= 1 << k
	}
	return moving, n
}

// moveLong points the pages of the group whose entries are seen (its
// first page lo), those in moving, at copies of their allocations in
// news, listed as shortLived listed them, and returns the allocations
// they leave. The group's lock is held for writing, and its entries are
// still those seen.
func (s *denseSide) moveLong(seen []entry, lo, moving uint32, news []pagestore.Handle) []pagestore.Handle {
	store := s.obj.store
	olds := s.frees[:0]
	at := 0
	for k, e := range seen {
		if moving&(1<<k) == 0 {
			continue
		}
		if e.hasAllocation() {
			copy(store.Bytes(news[at], e.length()), store.Bytes(e.handle(), e.length()))
			s.t.table[lo+uint32(k)] = e.withHandle(news[at])
			olds = append(olds, e.handle())
			at++
			continue
		}
		// An object, moved as the compactor moves one, so that a process
		// killed meanwhile leaves what Recover takes over: its other
		// chunks first, the first naming each copy as it is made (read
		// from the first now: the compactor may have moved them since
		// the look), then the first copied and the object's pages
		// pointed at the copy.
		first := store.Bytes(e.handle(), e.length())
		l, _ := objectHeader(first, e.partPages())
		for c := 1; c < l.chunks; c++ {
			old := chunkHandle(first, c)
			copy(store.Bytes(news[at+c], l.chunkLen(c)), store.Bytes(old, l.chunkLen(c)))
			setChunkHandle(first, c, news[at+c])
			olds = append(olds, old)
		}
		copy(store.Bytes(news[at], e.length()), first)
		olds = append(olds, e.handle())
		s.t.moveObjectLocked(lo+uint32(k), lo+uint32(len(seen)), e.handle(), news[at])
		at += l.chunks
	}
	return olds
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

// snapshot copies the group's entries into snap and decodes its stored
// pages into out (the others as zeroes), but for its compressed pages
// where packed is not nil: those it copies there as they are stored. It returns the
// stored pages (-1 if one is staged) and the bytes they take in the
// store. The caller holds the group's lock.
func (s *denseSide) snapshot(lo uint32, pages int, snap *dense.Snapshot, out []byte, packed *dense.PackedPages) (stored, before int, err error) {
	s.sc.decoded = 0
	snap.Stored = 0
	var seen [groupPages]pagestore.Handle
	objects := 0
	for k := range pages {
		idx := lo + uint32(k)
		e := s.t.at(idx)
		snap.Entries[k] = uint64(e)
		raw := out[k*pageSize : (k+1)*pageSize]
		if packed != nil {
			packed.Lens[k] = 0
		}
		switch {
		case e.state() == stateStaged:
			return -1, 0, nil
		case !storedState(e):
			clear(raw)
			continue
		case e.state() == stateStored && packed != nil:
			packed.Offsets[k], packed.Lens[k] = uint32(packed.At), uint32(e.length())
			packed.At += copy(packed.Packed[packed.At:], s.obj.store.Bytes(e.handle(), e.length()))
		default:
			if err := s.load(idx, raw, &s.sc, pages-1-k); err != nil {
				return 0, 0, err
			}
		}
		snap.Stored |= 1 << k
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
			l, err := objectHeader(s.obj.store.Bytes(e.handle(), e.length()), e.partPages())
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
func (s *denseSide) asDenseAsItGets(lo uint32, pages int) bool {
	var fast pagestore.Handle
	inDense := false
	for k := range pages {
		e := s.t.at(lo + uint32(k))
		switch {
		case e.state() == statePart && e.dense():
			inDense = true
		case e.state() == statePart && s.obj.fast == streamZstd && (fast == 0 || e.handle() == fast):
			fast = e.handle()
		case e.state() == stateStaged || storedState(e):
			return false
		}
	}
	return inDense != (fast != 0)
}
