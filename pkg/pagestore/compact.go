package pagestore

import "slices"

// Compact moves live objects out of sparse slabs so that whole slabs go
// back to the kernel, and returns how many objects it moved. It also
// releases the slabs each class keeps cached after they emptied.
//
// For each object it moves, it copies the bytes to a new slot of the same
// class and then calls relocate(owner, old, new) holding no store lock:
// relocate may call Alloc, Bytes and Free (but not Compact). If relocate
// returns true, the owner now refers to new and Compact frees old; if it
// returns false, the owner changed meanwhile and has freed or will free old
// itself, and Compact frees new. A slab being evacuated receives no new
// objects and is released only when empty; one still holding objects whose
// owners have not freed them yet is released by the last Free (and counted
// in PagesCompacted then), or evacuated again by the next Compact.
func (s *Store) Compact(relocate func(owner uint32, old, new Handle) bool) (moved int) {
	s.compactMu.Lock()
	defer s.compactMu.Unlock()
	for ci := range s.classes {
		if s.closed.Load() {
			break
		}
		moved += s.compactClass(ci, relocate)
	}
	return moved
}

func (s *Store) compactClass(ci int, relocate func(owner uint32, old, new Handle) bool) (moved int) {
	c, g := &s.classes[ci], &s.geo[ci]
	c.mu.Lock()
	s.dropCache(c, g)
	srcs := s.pickSources(c, g)
	c.mu.Unlock()

	aborted := false
	for _, id := range srcs {
		r := s.rec(id)
		for slot := uint32(0); !aborted; slot++ {
			c.mu.Lock()
			if slot >= uint32(r.bump) {
				c.mu.Unlock()
				break
			}
			mem := s.slabMem(r, g)
			o := owner(mem, slot)
			if isFree(o) {
				c.mu.Unlock()
				continue
			}
			// Destinations come only from slabs that already exist:
			// growing the store to compact it would defeat the purpose.
			nid, nmem, nslot, err := s.take(c, ci, false)
			if err != nil {
				aborted = true
				c.mu.Unlock()
				break
			}
			d := delta(mem, slot)
			setOwner(nmem, nslot, o)
			setDelta(nmem, nslot, d)
			n := g.size - uint32(d)
			copy(nmem[objectAt(g, nslot):][:n], mem[objectAt(g, slot):][:n])
			c.objects.Add(1)
			c.bytes.Add(int64(n))
			c.mu.Unlock()

			old, nh := handle(id, slot), handle(nid, nslot)
			if relocate(o, old, nh) {
				s.Free(old)
				moved++
			} else {
				s.Free(nh)
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
	return moved
}

// pickSources chooses the slabs of a class to evacuate and marks them so:
// draining ones left from an earlier Compact, then the sparsest active ones
// for as long as the others have free slots for all their objects. c.mu is
// held; the result lives in s.scratch.
func (s *Store) pickSources(c *class, g *geometry) []uint32 {
	ids := s.scratch[:0]
	need := 0
	for id := c.draining; id != 0; id = s.rec(id).next {
		ids = append(ids, id)
		need += int(s.rec(id).live)
	}
	drained := len(ids)
	free := 0
	for id := c.partial; id != 0; id = s.rec(id).next {
		ids = append(ids, id)
		free += int(g.slots) - int(s.rec(id).live)
	}
	active := ids[drained:]
	slices.SortFunc(active, func(a, b uint32) int { return int(s.rec(a).live) - int(s.rec(b).live) })
	chosen := drained
	for _, id := range active {
		live := int(s.rec(id).live)
		room := free - (int(g.slots) - live) // free slots left if this one goes too
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
	s.scratch = ids
	return ids[:chosen]
}
