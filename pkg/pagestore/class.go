// Size classes and slab geometry.

package pagestore

// Allocations are grouped in size classes 16 bytes apart, so an allocation
// wastes at most 15 bytes to rounding (about 0.5% of a typical 1.7 KiB
// compressed page). The last class holds raw 4096-byte pages.
const (
	// MaxAllocSize is the largest allocation Alloc accepts: one raw page.
	MaxAllocSize = 4096

	pageSize   = 4096
	classShift = 4
	classStep  = 1 << classShift
	numClasses = MaxAllocSize / classStep

	// A handle is slab<<cellBits | cell; slab 0 is never used, so no
	// valid handle is 0.
	cellBits = 12
	maxCells = 1 << cellBits
	cellMask = maxCells - 1

	// Each cell carries a 5-byte tag at the head of its slab: the owner
	// (4 bytes) and how many bytes short of the class size the allocation is
	// (1 byte), which is how Free knows the allocation's size. A free cell's
	// owner field holds freeTag | the next free cell + 1 instead, so the
	// free list costs nothing and Alloc and Free touch one cache line of
	// the slab.
	tagSize = 5
	freeTag = 0xFFFF0000

	// MaxOwner is the largest owner Alloc accepts.
	MaxOwner = freeTag - 1

	// Slabs span 1..maxSlabPages pages; geometry picks the smallest that
	// wastes at most 1/maxTailWaste of the slab in its tail.
	maxSlabPages = 256
	maxTailWaste = 200

	// A slab that empties holding at most this many pages is kept for
	// its class's next allocation (see class.cached).
	maxCachedPages = 2
)

// geometry is a class's immutable layout: a slab is cells tags followed by
// cells allocations of size bytes, in pages pages.
type geometry struct {
	size     uint32 // bytes per cell
	cells    uint32
	pages    uint32
	tagBytes uint32 // cells * tagSize: where allocations start
}

// classOf is the class of short-lived allocations of size bytes.
func classOf(size int) int { return (size - 1) >> classShift }

// Lifetime is how long the owner expects an allocation to live. Each has
// size classes of its own, so their slabs never mix: allocations that
// live long (a dense tier's frames of idle pages) would otherwise take the
// cells that short-lived ones (pages as swapped out) freed, and pin every
// slab whose other cells the short-lived free later, until Compact moved
// them. Kept apart, a slab of short-lived allocations empties whole and
// goes back to the kernel as its pages leave.
type Lifetime uint8

const (
	// Short: pages as swapped out, freed as they are written again,
	// discarded or moved to the long-lived.
	Short Lifetime = iota
	// Long: pages kept until written again (the dense tier's frames).
	Long

	lifetimes = 2
	// allClasses is the classes of every lifetime: class lt*numClasses+k
	// is lifetime lt's class k, of the size of class k.
	allClasses = lifetimes * numClasses
)

// class is lt's class of allocations of size bytes.
func (lt Lifetime) class(size int) int { return int(lt)*numClasses + classOf(size) }

func newGeometry(class int) geometry {
	size := (class%numClasses + 1) * classStep
	var best geometry
	bestWaste := 1.0
	for pages := 1; pages <= maxSlabPages; pages++ {
		bytes := pages * pageSize
		cells := min(bytes/(size+tagSize), maxCells)
		if cells == 0 {
			continue
		}
		waste := float64(bytes-cells*(size+tagSize)) / float64(bytes)
		if waste < bestWaste {
			bestWaste = waste
			best = geometry{size: uint32(size), cells: uint32(cells), pages: uint32(pages), tagBytes: uint32(cells * tagSize)}
		}
		if waste*maxTailWaste <= 1 {
			break
		}
	}
	return best
}

// pagesFor is the number of pages that hold the first n bytes of a slab.
func pagesFor(n uint32) uint32 { return (n + pageSize - 1) / pageSize }
