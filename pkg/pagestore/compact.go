// Compaction: moving allocations out of sparse slabs.

package pagestore

import (
	"slices"
	"sync"
)

// Compact moves live allocations out of sparse slabs so that whole slabs go
// back to the kernel, and returns how many allocations it moved. It also
// releases the slabs each class keeps cached after they emptied.
//
// For each allocation it moves, it copies the bytes to a new cell of the same
// class and then calls relocate(owner, old, new) holding no store lock:
// relocate may call Alloc, Bytes and Free (but not Compact). If relocate
// returns true, the owner now refers to new and Compact frees old; if it
// returns false, the owner changed meanwhile and has freed or will free old
// itself, and Compact frees new.
//
// The store cannot know when an allocation's bytes are final: an owner that
// fills an allocation after Alloc returns may still be writing it when
// Compact copies it. Such an owner must, in relocate, while it holds the lock
// that orders its writes and reads and has checked that it still refers to
// old, copy the bytes again: copy(s.Bytes(new, n), s.Bytes(old, n)). A slab
// being evacuated receives no new allocations and is released only when
// empty; one still holding allocations whose owners have not freed them yet
// is released by the last Free (and counted in PagesCompacted then), or
// evacuated again by the next Compact.
func (s *Store) Compact(relocate func(owner uint32, old, new Handle) bool) (moved int) {
	return s.compactor.run(relocate)
}

// compactor does Store.Compact's work, one run at a time. It owns the
// list of slabs a run picks; the slabs themselves are guarded by their
// classes' locks, taken and dropped around each allocation it moves.
type compactor struct {
	s       *Store
	mu      sync.Mutex // one run at a time; guards scratch
	scratch []uint32
}

func (cp *compactor) run(relocate func(owner uint32, old, new Handle) bool) (moved int) {
	cp.mu.Lock()
	defer cp.mu.Unlock()
	for ci := range cp.s.classes {
		if cp.s.closed.Load() {
			break
		}
		moved += cp.compactClass(ci, relocate)
	}
	return moved
}

func (cp *compactor) compactClass(ci int, relocate func(owner uint32, old, new Handle) bool) (moved int) {
	s := cp.s
	c, g := &s.classes[ci], &s.geo[ci]
	c.mu.Lock()
	s.dropCache(c, g)
	srcs := cp.pickSources(c, g)
	c.mu.Unlock()

	aborted := false
	for _, id := range srcs {
		r := s.rec(id)
		for cell := uint32(0); !aborted; cell++ {
			c.mu.Lock()
			if cell >= uint32(r.bump) {
				c.mu.Unlock()
				break
			}
			mem := s.slabMem(r, g)
			if isFree(owner(mem, cell)) {
				c.mu.Unlock()
				continue
			}
			// Destinations come only from slabs that already exist:
			// growing the store to compact it would defeat the purpose.
			nid, nmem, ncell, err := s.take(c, ci, false, nil)
			if err != nil {
				aborted = true
				c.mu.Unlock()
				break
			}
			o := copyAllocation(c, g, mem, cell, nmem, ncell)
			c.mu.Unlock()
			if cp.relocateOne(relocate, o, handle(id, cell), handle(nid, ncell)) {
				moved++
			}
		}
		c.mu.Lock()
		switch {
		case r.live == 0:
			s.release(c, id, r, s.slabMem(r, g), true)
		case aborted:
			r.state = slabActive
			s.push(&c.partial, id)
		default:
			r.state = slabDraining
			s.push(&c.draining, id)
		}
		c.mu.Unlock()
	}
	if aborted {
		return moved
	}
	c.mu.Lock()
	tail := cp.pickTail(c, g)
	c.mu.Unlock()
	if tail != 0 {
		moved += cp.compactTail(c, ci, tail, relocate)
	}
	return moved
}

// compactTail packs the allocations of slab id, which the others cannot take
// whole, into the bottom of the slab and gives back the pages above them.
// Working down from its top allocation, it moves each allocation into a free
// cell of another slab while there is one, then into the lowest free cell of
// this one. Meanwhile the slab is marked evacuating, so nothing but this
// takes its free cells; its free list is rebuilt at the end.
func (cp *compactor) compactTail(c *class, ci int, id uint32, relocate func(owner uint32, old, new Handle) bool) (moved int) {
	s := cp.s
	g, r := &s.geo[ci], s.rec(id)
	c.mu.Lock()
	hi := int(r.bump) - 1
	c.mu.Unlock()
	lo, outside := uint32(0), true
	for ; hi >= 0; hi-- {
		cell := uint32(hi)
		c.mu.Lock()
		mem := s.slabMem(r, g)
		if isFree(owner(mem, cell)) {
			c.mu.Unlock()
			continue
		}
		nid, nmem, ncell := id, mem, uint32(0)
		if outside {
			var err error
			if nid, nmem, ncell, err = s.take(c, ci, false, nil); err != nil {
				nid, nmem, outside = id, mem, false
			}
		}
		if !outside {
			for lo < cell && !isFree(owner(mem, lo)) {
				lo++
			}
			if lo >= cell {
				c.mu.Unlock()
				break
			}
			ncell = lo
			r.live++
		}
		o := copyAllocation(c, g, mem, cell, nmem, ncell)
		c.mu.Unlock()
		if cp.relocateOne(relocate, o, handle(id, cell), handle(nid, ncell)) {
			moved++
		}
	}
	c.mu.Lock()
	above := cp.trim(r, g)
	c.mu.Unlock()
	// Without the class lock, so that writers of this class do not wait
	// on the system call. The slab is still evacuating, on no list, so
	// nothing grows into these pages meanwhile; Free of its allocations still
	// works.
	if len(above) > 0 {
		if err := s.releasePages(r, above); err != nil {
			s.releaseErrors.Add(1)
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if r.live == 0 {
		s.release(c, id, r, s.slabMem(r, g), true)
		return moved
	}
	r.state = slabActive
	if uint32(r.live) < g.cells {
		s.push(&c.partial, id)
	}
	return moved
}

// trim lowers slab r's mark to just above its top allocation, stops counting
// the pages above that as held, and rebuilds its free list lowest cell
// first. It returns those pages, for the caller to give back once it has
// released c.mu, which is held.
func (cp *compactor) trim(r *slabRec, g *geometry) (above []byte) {
	s := cp.s
	mem := s.slabMem(r, g)
	top := uint32(r.bump)
	for top > 0 && isFree(owner(mem, top-1)) {
		top--
	}
	r.freeHead = 0
	for cell := int(top) - 1; cell >= 0; cell-- {
		if isFree(owner(mem, uint32(cell))) {
			setOwner(mem, uint32(cell), freeTag|uint32(r.freeHead))
			r.freeHead = uint16(cell + 1)
		}
	}
	r.bump = uint16(top)
	if top == 0 {
		return nil // the caller releases the slab
	}
	keep := pagesFor(cellAt(g, top))
	if held := uint32(r.touched); keep < held {
		above = mem[keep*pageSize : held*pageSize]
		s.memUsed.Add(-int64(held-keep) * pageSize)
		s.pagesCompacted.Add(int64(held - keep))
		r.touched, r.cold = uint16(keep), true
	}
	return above
}

// copyAllocation copies the allocation in cell of mem, with its tag, into the
// cell ncell of nmem, which the caller has taken, and returns its owner.
// c.mu is held.
func copyAllocation(c *class, g *geometry, mem []byte, cell uint32, nmem []byte, ncell uint32) uint32 {
	o, d := owner(mem, cell), delta(mem, cell)
	setOwner(nmem, ncell, o)
	setDelta(nmem, ncell, d)
	n := g.size - uint32(d)
	copy(nmem[cellAt(g, ncell):][:n], mem[cellAt(g, cell):][:n])
	c.allocations.Add(1)
	c.bytes.Add(int64(n))
	return o
}

// relocateOne asks the owner to switch from old to new and frees the copy
// it does not keep. No lock is held.
func (cp *compactor) relocateOne(relocate func(owner uint32, old, new Handle) bool, o uint32, old, new Handle) bool {
	if relocate(o, old, new) {
		cp.s.Free(old)
		return true
	}
	cp.s.Free(new)
	return false
}

// pickSources chooses the slabs of a class to evacuate and marks them so:
// draining ones left from an earlier Compact, then the sparsest active ones
// for as long as the others have free cells for all their allocations. c.mu is
// held; the result lives in cp.scratch.
func (cp *compactor) pickSources(c *class, g *geometry) []uint32 {
	s := cp.s
	ids := cp.scratch[:0]
	need := 0
	for id := c.draining; id != 0; id = s.rec(id).next {
		ids = append(ids, id)
		need += int(s.rec(id).live)
	}
	drained := len(ids)
	free := 0
	for id := c.partial; id != 0; id = s.rec(id).next {
		ids = append(ids, id)
		free += int(g.cells) - int(s.rec(id).live)
	}
	active := ids[drained:]
	slices.SortFunc(active, func(a, b uint32) int { return int(s.rec(a).live) - int(s.rec(b).live) })
	chosen := drained
	for _, id := range active {
		live := int(s.rec(id).live)
		room := free - (int(g.cells) - live) // free cells left if this one goes too
		if need+live > room {
			break
		}
		need += live
		free = room
		chosen++
	}
	for i, id := range ids[:chosen] {
		if i < drained {
			s.unlink(&c.draining, id)
		} else {
			s.unlink(&c.partial, id)
		}
		s.rec(id).state = slabEvacuating
	}
	cp.scratch = ids
	return ids[:chosen]
}

// pickTail chooses for compactTail the sparsest active slab that would
// hold fewer pages with its allocations packed at its bottom, and marks it
// evacuating. c.mu is held.
func (cp *compactor) pickTail(c *class, g *geometry) uint32 {
	s := cp.s
	tail := uint32(0)
	for id := c.partial; id != 0; id = s.rec(id).next {
		r := s.rec(id)
		if pagesFor(cellAt(g, uint32(r.live))) < uint32(r.touched) && (tail == 0 || r.live < s.rec(tail).live) {
			tail = id
		}
	}
	if tail != 0 {
		s.unlink(&c.partial, tail)
		s.rec(tail).state = slabEvacuating
	}
	return tail
}
