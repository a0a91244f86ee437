// The page table: its entries (one uint64 per page: what it says of its
// page), mapped from their file, the stripe locks that order every change
// to them, and replacing one.

package device

import (
	"fmt"
	"iter"
	"sync"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/gzramd/gzramd/internal/memfd"
	"github.com/gzramd/gzramd/pkg/pagestore"
)

// A page-table entry is one uint64:
//
//	bits 61-63          state
//	stored, huge, fill: bits 48-60 the allocation's exact length, bits 0-35 its handle
//	part:               bits 48-60 the length of the object's first chunk,
//	                    bit 44 set for an object of the dense tier (zstd),
//	                    bits 40-43 its pages less one, bits 36-39 this
//	                    page's place in it, bits 0-35 its first chunk's handle
//	staged:             bits 0-31 the page's place in the staging area (Files.Staging)
//
// The table is the truth a process taking the device over (Recover)
// rebuilds everything else from, so everything a page needs to be read
// back is in its entry or in the store's allocations.
type entry uint64

const (
	stateEmpty  = 0
	stateSame   = 1 // zero-filled, written
	stateStored = 2 // LZ4/zstd-compressed page
	stateHuge   = 3 // raw page that did not compress enough
	// stateStaged: acknowledged, held raw in the staging area until its
	// batch is compressed and committed.
	stateStaged = 4
	// stateFill: filled with one 8-byte word other than zero, kept in an
	// object of fillLength bytes.
	stateFill = 5
	// stateLost: a staged page Recover could not store; reads fail with
	// EIO until the page is written again.
	stateLost = 6
	// statePart: one page of an object that holds several, compressed
	// together (object.go).
	statePart = 7

	stateShift  = 61
	lengthShift = 48
	lengthMask  = 1<<13 - 1
	handleMask  = 1<<pagestore.HandleBits - 1
	partShift   = pagestore.HandleBits
	denseBit    = 1 << (partShift + 8)
	fillLength  = 8
)

func (e entry) state() int               { return int(e >> stateShift) }
func (e entry) handle() pagestore.Handle { return pagestore.Handle(e & handleMask) }
func (e entry) length() int              { return int(e>>lengthShift) & lengthMask }
func (e entry) hasAllocation() bool {
	st := e.state()
	return st == stateStored || st == stateHuge || st == stateFill
}
func (e entry) stagingPage() int { return int(uint32(e)) }

// partIndex and partPages are, for a part entry, the page's place in its
// object and the object's pages.
func (e entry) partIndex() int { return int(e>>partShift) & 15 }
func (e entry) partPages() int { return int(e>>(partShift+4))&15 + 1 }

// dense reports whether a part entry's object is in the dense tier.
func (e entry) dense() bool { return e&denseBit != 0 }

func partEntry(h pagestore.Handle, k, pages, first int) entry {
	return entry(statePart<<stateShift | uint64(first)<<lengthShift |
		uint64(pages-1)<<(partShift+4) | uint64(k)<<partShift | uint64(h)&handleMask)
}

// withHandle is e naming the object (or first chunk) h instead: the
// compactor moved it.
func (e entry) withHandle(h pagestore.Handle) entry {
	return e&^handleMask | entry(h)&handleMask
}

func handleEntry(state int, h pagestore.Handle, n int) entry {
	return entry(uint64(state)<<stateShift | uint64(n)<<lengthShift | uint64(h)&handleMask)
}

const zeroEntry = entry(stateSame << stateShift)

func stagedEntry(page int) entry {
	return entry(stateStaged<<stateShift | uint64(uint32(page)))
}

// nStripes trades lock memory for contention between unrelated pages.
const nStripes = 1024

type stripe struct {
	mu sync.RWMutex
	// writes counts the entries writers replaced under mu (swapLocked).
	// The dense tier commits a group only where it did not change since
	// the tier's snapshot: entries equal to those it saw prove nothing,
	// as a write may have freed a page's object and the compactor moved
	// the new one into the slot it left, making the same entry.
	writes uint64
	_      [32]byte // a stripe per cache line
}

// pageTable is the device's pages: it owns their entries, mapped from the
// table file (Files.Table) so that a process taking the device over finds
// them, the stripe locks every reader and writer of an entry holds, and
// the entries' counts by state. Replacing an entry says what the old one
// leaves to free (released); freeing it is objects'. What an entry's
// object holds, and where a page is read from, it does not know.
//
// Device embeds it; stager, inliner, compactor, recovery and denseSide are
// given it, and take its locks themselves, as their commits' order needs.
type pageTable struct {
	table []entry // mapped from Files.Table: no pointers, no GC scanning
	// backing has the table's pages faulted in ahead of the writes; read
	// entries with at, which never faults a page of table in.
	backing *backing
	pages   uint32
	stripes []stripe
	// groupShift is log2 of the pages that share a stripe: 0, or that
	// of groupPages where there may be objects of several pages. Set
	// before the device is used.
	groupShift uint
	pageCounts
}

// newPageTable makes the table of a device of pages pages, its entries
// not yet mapped (mapEntries).
func newPageTable(pages uint32) pageTable {
	return pageTable{pages: pages, stripes: make([]stripe, nStripes)}
}

// mapEntries maps the table's entries from f: empty when fresh, else
// holding the table of a device of as many pages.
func (t *pageTable) mapEntries(f *memfd.File, fresh bool) error {
	size := int64(t.pages) * 8
	have, err := f.Size()
	switch {
	case err != nil:
		return err
	case fresh && have != 0:
		return fmt.Errorf("device: new device on a table file of %d bytes, not empty (Recover adopts one)", have)
	case !fresh && have != size:
		return fmt.Errorf("device: table file of %d bytes for a device of %d pages (%d bytes)", have, t.pages, size)
	}
	if err := f.Grow(size); err != nil {
		return err
	}
	mem, err := f.Map(0, int(size))
	if err != nil {
		return err
	}
	t.table = unsafe.Slice((*entry)(unsafe.Pointer(&mem[0])), t.pages)
	// Not faulted in whole, as zram's table is (8 bytes per 4 KiB page,
	// 0.2 % of the device): backing faults in the part of it writes reach,
	// ahead of them.
	b, err := newBacking(mem, t.table, f)
	if err == nil {
		err = b.start()
	}
	if err != nil {
		t.table = nil
		unix.Munmap(mem)
		return fmt.Errorf("device: the page table: %w", err)
	}
	t.backing = b
	return nil
}

// unmapEntries undoes mapEntries, if it mapped them.
func (t *pageTable) unmapEntries() error {
	if t.table == nil {
		return nil
	}
	t.backing.close()
	mem := unsafe.Slice((*byte)(unsafe.Pointer(&t.table[0])), len(t.table)*8)
	t.table = nil
	return unix.Munmap(mem)
}

// at returns page idx's entry: empty where its page of table was never
// faulted in, which it leaves so. The caller holds the page's stripe.
func (t *pageTable) at(idx uint32) entry {
	if !t.held(idx) {
		return 0
	}
	return t.table[idx]
}

// held reports whether the page of table holding page idx's entry is
// faulted in: otherwise every entry in it is empty.
func (t *pageTable) held(idx uint32) bool { return t.backing.has(idx >> entryPageShift) }

// entries yields the pages whose entries' page of table is faulted in,
// with their entries: every page but empty ones, for scans of the whole
// table, which fault in none of it.
func (t *pageTable) entries() iter.Seq2[uint32, entry] {
	return func(yield func(uint32, entry) bool) {
		for lo, hi := range t.backing.runs(t.pages) {
			for i := lo; i < hi; i++ {
				if !yield(i, t.table[i]) {
					return
				}
			}
		}
	}
}

// holdGroups has the pages of a group of groupPages share a stripe, as
// the pages of an object of several pages must (object.go).
func (t *pageTable) holdGroups() { t.groupShift = groupShift }

// stripe is the lock of page idx: of its group of groupPages pages where
// the device may hold objects of several pages (object.go), of the page
// alone otherwise, as unrelated writers then meet least.
func (t *pageTable) stripe(idx uint32) *stripe { return &t.stripes[(idx>>t.groupShift)%nStripes] }

// swapLocked replaces page idx's entry with a writer's, whose stripe s
// is locked for writing, and keeps the counters; the caller frees what
// the old entry leaves (released) once it has released the lock.
func (t *pageTable) swapLocked(s *stripe, idx uint32, e entry) freeRef {
	s.writes++
	return t.replaceLocked(idx, e)
}

// moveObjectLocked points the pages in [from, end) that are part of the
// object whose first chunk is old at the first chunk new: a copy of it,
// made by whoever moves the object. The caller holds the group's lock.
func (t *pageTable) moveObjectLocked(from, end uint32, old, new pagestore.Handle) {
	for i := from; i < end; i++ {
		if e := t.table[i]; e.state() == statePart && e.handle() == old {
			t.table[i] = e.withHandle(new)
		}
	}
}

// replaceLocked is swapLocked for the dense tier's commit, which changes
// what holds the group's pages, not what they hold: it counts no write.
func (t *pageTable) replaceLocked(idx uint32, e entry) freeRef {
	held := t.held(idx)
	var old entry // empty where its page of table is not held
	switch {
	case held:
		old = t.table[idx]
	case e == 0:
		return 0 // empty for empty: no page of table to fault in
	}
	t.table[idx] = e
	t.backing.written(idx, held)
	t.count(old, -1)
	t.count(e, +1)
	return t.released(idx, old)
}

// released returns what replacing page idx's entry old leaves to free: an
// object of its own, or an object of several pages when no other page of
// the group refers to it any more. The caller holds the group's lock.
func (t *pageTable) released(idx uint32, old entry) freeRef {
	switch {
	case old.hasAllocation():
		return freeRef(old.handle())
	case old.state() != statePart:
		return 0
	}
	h := old.handle()
	lo := idx &^ (groupPages - 1)
	for i := lo; i < min(lo+groupPages, t.pages); i++ {
		if e := t.table[i]; e.state() == statePart && e.handle() == h {
			return 0
		}
	}
	if old.dense() {
		return partRef | denseRef | freeRef(h)
	}
	return partRef | freeRef(h)
}

// pageCounts are the page table's entries counted by state, for Stats:
// entries are counted as they change (pageTable.replaceLocked).
type pageCounts struct {
	storedPages, samePages, hugePages, stagedPages atomic.Int64
	lostPages                                      atomic.Int64
	packedPages, densePages                        atomic.Int64 // of storedPages
}

func (c *pageCounts) count(e entry, delta int64) {
	switch e.state() {
	case stateSame, stateFill:
		c.samePages.Add(delta)
	case stateStored:
		c.storedPages.Add(delta)
	case statePart:
		c.storedPages.Add(delta)
		c.packedPages.Add(delta)
		if e.dense() {
			c.densePages.Add(delta)
		}
	case stateHuge:
		c.storedPages.Add(delta)
		c.hugePages.Add(delta)
	case stateStaged:
		c.stagedPages.Add(delta)
	case stateLost:
		c.lostPages.Add(delta)
	}
}

// stripeHold holds one stripe's lock at a time, for a loop over pages in
// order: pages of one group are visited under one hold of its lock.
type stripeHold struct {
	s    *stripe
	read bool // read locks, not write locks
}

// lock holds s, releasing the stripe held before if it is another, and
// reports whether it took s now.
func (h *stripeHold) lock(s *stripe) bool {
	if s == h.s {
		return false
	}
	h.release()
	h.s = s
	if h.read {
		s.mu.RLock()
	} else {
		s.mu.Lock()
	}
	return true
}

// release lets go of the stripe held, if any.
func (h *stripeHold) release() {
	switch {
	case h.s == nil:
	case h.read:
		h.s.mu.RUnlock()
	default:
		h.s.mu.Unlock()
	}
	h.s = nil
}
