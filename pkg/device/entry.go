// The page-table entry, one uint64 per page: what it says of its page.

package device

import "github.com/gzramd/gzramd/pkg/pagestore"

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
// back is in its entry or in the store's allocations.
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
