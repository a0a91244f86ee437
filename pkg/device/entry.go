// The page-table entry, one uint64 per page, and replacing one: the
// counts by state kept, and what the old entry leaves to free.

package device

import (
	"sync/atomic"

	"github.com/gzramd/gzramd/pkg/pagestore"
)

// A page-table entry is one uint64:
//
//	bits 61-63          state
//	stored, huge, fill: bits 48-60 the object's exact length, bits 0-35 its handle
//	part:               bits 48-60 the length of the object's first chunk,
//	                    bit 44 set for an object of the dense tier (zstd),
//	                    bits 40-43 its pages less one, bits 36-39 this
//	                    page's place in it, bits 0-35 its first chunk's handle
//	staged:             bits 0-31 the page's place in the staging area (Files.Staging)
//
// The table is the truth a process taking the device over (Recover)
// rebuilds everything else from, so everything a page needs to be read
// back is in its entry or in the store's objects.
type entry uint64

const (
	stateEmpty  = 0
	stateSame   = 1 // zero-filled, written
	stateStored = 2 // LZ4/zstd-compressed object
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
func (e entry) hasObject() bool {
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

func objectEntry(state int, h pagestore.Handle, n int) entry {
	return entry(uint64(state)<<stateShift | uint64(n)<<lengthShift | uint64(h)&handleMask)
}

const zeroEntry = entry(stateSame << stateShift)

func stagedEntry(page int) entry {
	return entry(stateStaged<<stateShift | uint64(uint32(page)))
}

// pageCounts are the page table's entries counted by state, for Stats:
// entries are counted as they change (Device.swapLocked).
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

// swapLocked replaces page idx's entry with a writer's, whose stripe s
// is locked for writing, and keeps the counters; the caller frees what
// the old entry leaves (released) once it has released the lock.
func (d *Device) swapLocked(s *stripe, idx uint32, e entry) objectRef {
	s.writes++
	return d.replaceLocked(idx, e)
}

// replaceLocked is swapLocked for the dense tier's commit, which changes
// what holds the group's pages, not what they hold: it counts no write.
func (d *Device) replaceLocked(idx uint32, e entry) objectRef {
	old := d.table[idx]
	d.table[idx] = e
	d.count(old, -1)
	d.count(e, +1)
	return d.released(idx, old)
}

// released returns what replacing page idx's entry old leaves to free: an
// object of its own, or an object of several pages when no other page of
// the group refers to it any more. The caller holds the group's lock.
func (d *Device) released(idx uint32, old entry) objectRef {
	switch {
	case old.hasObject():
		return objectRef(old.handle())
	case old.state() != statePart:
		return 0
	}
	h := old.handle()
	lo := idx &^ (groupPages - 1)
	for i := lo; i < min(lo+groupPages, d.pages); i++ {
		if e := d.table[i]; e.state() == statePart && e.handle() == h {
			return 0
		}
	}
	if old.dense() {
		return partRef | denseRef | objectRef(h)
	}
	return partRef | objectRef(h)
}
