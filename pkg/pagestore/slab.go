// Slab records, cell tags and the class lists.

package pagestore

import (
	"encoding/binary"
	"unsafe"
)

type slabState uint8

const (
	// slabEmpty holds no memory and waits on its class's empty stack, or
	// in the prefaulter's queue for its pages to go back.
	slabEmpty slabState = iota
	// slabActive takes new allocations while it has free cells.
	slabActive
	// slabEvacuating is having its allocations moved out by Compact.
	slabEvacuating
	// slabDraining was evacuated except for allocations whose owners are
	// freeing them; it is released when the last one goes.
	slabDraining
	// slabCold is active, but its free space is all in pages it gave
	// back (cold): off the partial list until one of its allocations is
	// freed.
	slabCold
)

// slabRec describes one slab. arena, page and class never change once the
// slab exists (an empty slab is reused only by its own class), so Bytes
// reads them without a lock; the rest is guarded by the class's mutex.
//
// The records live in the store's slab file (Files.Slabs), off the Go
// heap, so that another process can adopt the store: Recover trusts
// only arena, page and class, written once with sealed last, and
// rebuilds the rest from the allocations its caller still references.
type slabRec struct {
	arena    uint32
	page     uint32 // first page of the slab within its arena
	prev     uint32 // links in the class's partial or draining list; 0 ends it
	next     uint32
	class    uint16
	bump     uint16 // cells [0, bump) have been handed out at least once
	live     uint16
	freeHead uint16 // first free cell below bump, plus one; 0 if none
	touched  uint16 // pages counted in MemUsed: [0, touched) of the slab
	state    slabState
	// cold marks a slab whose pages from touched up were given back: an
	// empty one released (until the prefaulter faults it in again), or
	// one Compact trimmed. With a prefaulter, writers do not reach into
	// them: the fault would be on the path that stores a swapped-out
	// page.
	cold bool
	// sealed is recordSeal once arena, page and class are written.
	sealed uint32
}

const (
	// maxSlabs bounds the slab file: 16M slabs, at least 64 GiB of slabs.
	maxSlabs    = 1 << 24
	slabRecSize = int64(unsafe.Sizeof(slabRec{}))
	recordSeal  = 0x51ab5ea1
)

func (m *mapping) rec(id uint32) *slabRec { return &m.recs[id] }

// Cell tags at the head of a slab, tagSize bytes each: owner, then delta.

func owner(mem []byte, cell uint32) uint32 { return binary.LittleEndian.Uint32(mem[tagSize*cell:]) }

func setOwner(mem []byte, cell, o uint32) { binary.LittleEndian.PutUint32(mem[tagSize*cell:], o) }

func isFree(owner uint32) bool { return owner >= freeTag }

// delta is how many bytes the cell's allocation is short of the class size.
func delta(mem []byte, cell uint32) byte { return mem[tagSize*cell+4] }

func setDelta(mem []byte, cell uint32, d byte) { mem[tagSize*cell+4] = d }

func cellAt(g *geometry, cell uint32) uint32 { return g.tagBytes + cell*g.size }

// push puts slab id at the head of the list at head.
func (m *mapping) push(head *uint32, id uint32) {
	r := m.rec(id)
	r.prev, r.next = 0, *head
	if *head != 0 {
		m.rec(*head).prev = id
	}
	*head = id
}

// unlink takes slab id out of the list at head.
func (m *mapping) unlink(head *uint32, id uint32) {
	r := m.rec(id)
	if r.prev != 0 {
		m.rec(r.prev).next = r.next
	} else {
		*head = r.next
	}
	if r.next != 0 {
		m.rec(r.next).prev = r.prev
	}
	r.prev, r.next = 0, 0
}
