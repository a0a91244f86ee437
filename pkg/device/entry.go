// The page-table entry: one uint64 per page.

package device

import "github.com/gzramd/gzramd/pkg/pagestore"

// A page-table entry is one uint64:
//
//	bits 61-63          state
//	stored, huge, fill: bits 48-60 the object's exact length, bits 0-47 its handle
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

	stateShift  = 61
	lengthShift = 48
	lengthMask  = 1<<13 - 1
	handleMask  = 1<<48 - 1
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

func objectEntry(state int, h pagestore.Handle, n int) entry {
	return entry(uint64(state)<<stateShift | uint64(n)<<lengthShift | uint64(h)&handleMask)
}

const zeroEntry = entry(stateSame << stateShift)

func stagedEntry(page int) entry {
	return entry(stateStaged<<stateShift | uint64(uint32(page)))
}
