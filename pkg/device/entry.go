// The page-table entry: one uint64 per page.

package device

import "github.com/gzramd/gzramd/pkg/pagestore"

// A page-table entry is one uint64:
//
//	bits 61-63  state
//	stored, huge: bits 48-60 the object's exact length, bits 0-47 its handle
//	same:         bit 0 set when the fill word is in the side table (else 0)
//	staged:       bits 16-31 the staging batch, bits 0-15 the page's index there
type entry uint64

const (
	stateEmpty  = 0
	stateSame   = 1
	stateStored = 2 // LZ4/zstd-compressed object
	stateHuge   = 3 // raw page that did not compress enough
	// stateStaged: acknowledged, held raw in the staging area until its
	// batch is compressed and committed.
	stateStaged = 4

	stateShift  = 61
	lengthShift = 48
	lengthMask  = 1<<13 - 1
	handleMask  = 1<<48 - 1
	sameInSide  = 1
)

func (e entry) state() int               { return int(e >> stateShift) }
func (e entry) handle() pagestore.Handle { return pagestore.Handle(e & handleMask) }
func (e entry) length() int              { return int(e>>lengthShift) & lengthMask }
func (e entry) hasObject() bool          { return e.state() == stateStored || e.state() == stateHuge }
func (e entry) batch() int               { return int(e>>16) & 0xffff }
func (e entry) slot() int                { return int(e) & 0xffff }

func objectEntry(state int, h pagestore.Handle, n int) entry {
	return entry(uint64(state)<<stateShift | uint64(n)<<lengthShift | uint64(h)&handleMask)
}

func sameEntry(inSide bool) entry {
	e := entry(stateSame << stateShift)
	if inSide {
		e |= sameInSide
	}
	return e
}

func stagedEntry(batch, slot int) entry {
	return entry(stateStaged<<stateShift | uint64(batch&0xffff)<<16 | uint64(slot&0xffff))
}
