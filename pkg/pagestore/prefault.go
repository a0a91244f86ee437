// The prefaulter thread: store memory faulted in ahead of use, emptied slabs given back off the writers' path.

package pagestore

import (
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/gzramd/gzramd/internal/memfd"
)

// prefaulter keeps Config.Prefault bytes of arena faulted in ahead of
// carve, woken by carve and every 100ms, and half of it once the store
// has carved nothing for Config.PrefaultQuiet: what is held ahead covers
// a burst of writes while the prefaulter catches up, and between bursts
// half of it is memory the machine lacks for nothing (8 MiB by default,
// as much as the daemon holds before its first store). It runs on a
// thread of its own, named gzramd-prefault, so that a stack dump
// (sysrq-t, top -H) shows whether the one thread allowed to wait on
// reclaim is doing so.
func (s *Store) prefaulter() {
	defer close(s.refillDone)
	t := time.NewTicker(100 * time.Millisecond)
	defer t.Stop()
	carved, active := s.carved(), time.Now()
	for {
		select {
		case <-s.stopRefill:
			return
		case <-s.refill:
		case <-t.C:
		}
		s.releaseQueued()
		s.warmReleased()
		ahead := s.prefault
		if now, c := time.Now(), s.carved(); c != carved {
			carved, active = c, now
		} else if now.Sub(active) >= s.quiet {
			ahead = s.prefault / 2
			s.shrinkAhead(int(ahead / pageSize))
		}
		s.prefaultAhead(int(ahead / pageSize))
	}
}

// carved is how far carve has gone: its arenas and the carve point.
func (s *Store) carved() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(*s.arenas.Load())*(s.arenaSize/pageSize) + s.arenaNext
}

// shrinkAhead gives back the pages faulted ahead of carve beyond want,
// the furthest first, a step at a time. It punches them out with mu held:
// carve must never take a page while it is being given back.
func (s *Store) shrinkAhead(want int) {
	const step = 64
	for {
		s.mu.Lock()
		if s.closed.Load() {
			s.mu.Unlock()
			return
		}
		arenas := *s.arenas.Load()
		ahead, spare := 0, 0
		if len(arenas) > 0 {
			ahead = max(s.faultedTo-s.arenaNext, 0)
		}
		if s.spare != nil {
			spare = s.spareFaulted
		}
		over := ahead + spare - want
		if over <= 0 {
			s.mu.Unlock()
			return
		}
		var err error
		if spare > 0 {
			n := min(over, spare, step)
			s.spareFaulted -= n
			err = s.files.Arenas.Punch(int64(s.spareArena)*int64(s.arenaSize)+int64(s.spareFaulted)*pageSize, int64(n)*pageSize)
		} else {
			n := min(over, ahead, step)
			s.faultedTo -= n
			err = s.files.Arenas.Punch(int64(len(arenas)-1)*int64(s.arenaSize)+int64(s.faultedTo)*pageSize, int64(n)*pageSize)
		}
		s.mu.Unlock()
		if err != nil {
			s.releaseErrors.Add(1)
			return
		}
	}
}

// releaseQueued gives the queued slabs' pages back to the kernel and then
// returns the slabs to their classes for reuse.
func (s *Store) releaseQueued() {
	s.relMu.Lock()
	s.releases, s.releasing = s.releasing[:0], s.releases
	s.relMu.Unlock()
	for i, p := range s.releasing {
		if s.closed.Load() {
			return
		}
		c, g := &s.classes[p.class], &s.geo[p.class]
		r := s.rec(p.id)
		if err := s.releasePages(r, s.slabMem(r, g)[:int(p.pages)*pageSize]); err != nil {
			s.releaseErrors.Add(1)
		}
		c.mu.Lock()
		s.pushEmpty(c, p.id)
		c.mu.Unlock()
		s.releasing[i] = pendingRelease{}
	}
}

// warmReleased faults in again the pages of one released slab of each
// class that has no resident empty slab left. newSlab reuses only
// resident ones (a fault there would be on the path that stores a
// swapped-out page): without this, a class whose slabs were released
// would carve new ones from the arenas for ever, and the store's address
// space and slab records would grow without bound under churn.
func (s *Store) warmReleased() {
	for ci := range s.classes {
		if s.closed.Load() {
			return
		}
		c, g := &s.classes[ci], &s.geo[ci]
		c.mu.Lock()
		n := len(c.empty)
		if n == 0 || s.rec(c.empty[n-1]).touched > 0 || !s.rec(c.empty[n-1]).cold {
			c.mu.Unlock()
			continue
		}
		// Off the stack while its pages fault in, so nobody takes it.
		id := c.empty[n-1]
		c.empty = c.empty[:n-1]
		c.mu.Unlock()
		r := s.rec(id)
		memfd.Populate(s.slabMem(r, g))
		c.mu.Lock()
		r.cold = false
		c.empty = append(c.empty, id)
		c.mu.Unlock()
	}
}

// prefaultAhead touches the pages between the carve point and Prefault
// bytes beyond it, mapping the spare arena when the last one runs short.
// It touches without holding mu (a fault may wait on reclaim; carve must
// not wait with it), with an atomic add of zero: carve may hand out a page
// while it is being touched, and the add changes no byte a slab wrote.
func (s *Store) prefaultAhead(want int) {
	const step = 64 // pages touched between looks at the carve point
	// The slab records for the next slabs too: newSlab writes them on a
	// writer's path.
	if next := int(s.nslabs.Load()); next < maxSlabs {
		recs := unsafe.Slice((*byte)(unsafe.Pointer(&s.recs[next])), min(256, maxSlabs-next)*int(slabRecSize))
		memfd.Populate(recs)
	}
	for {
		s.mu.Lock()
		if s.closed.Load() {
			s.mu.Unlock()
			return
		}
		arenas := *s.arenas.Load()
		spareWant := want
		var mem []byte
		from := 0
		if len(arenas) > 0 {
			last := arenas[len(arenas)-1]
			ahead := s.faultedTo - s.arenaNext
			if s.faultedTo < s.arenaNext {
				s.faultedTo, ahead = s.arenaNext, 0
			}
			if ahead < want && s.faultedTo < len(last)/pageSize {
				mem, from = last, s.faultedTo
				s.faultedTo = min(s.faultedTo+step, len(last)/pageSize)
			} else if ahead < want {
				spareWant = want - ahead // the rest goes to the spare arena
			} else {
				s.mu.Unlock()
				return
			}
		}
		if mem == nil {
			// The last arena is faulted to its end: get the spare ready,
			// mapping it without the lock (carve must not wait on mmap).
			if s.spare == nil {
				k := len(arenas)
				s.mu.Unlock()
				spare, err := s.mapArena(k)
				if err != nil {
					return
				}
				s.mu.Lock()
				if s.spare != nil || s.closed.Load() || len(*s.arenas.Load()) != k {
					s.mu.Unlock()
					_ = unix.Munmap(spare)
					continue
				}
				s.spare, s.spareArena = spare, k
				s.spareFaulted = 0
			}
			if s.spareFaulted >= min(spareWant, len(s.spare)/pageSize) {
				s.mu.Unlock()
				return
			}
			mem, from = s.spare, s.spareFaulted
			s.spareFaulted = min(s.spareFaulted+step, len(s.spare)/pageSize)
		}
		s.mu.Unlock()
		memfd.Populate(mem[from*pageSize : min(from+step, len(mem)/pageSize)*pageSize])
	}
}

// wakePrefaulter asks the prefaulter for a round now rather than at its
// next tick.
func (s *Store) wakePrefaulter() {
	select {
	case s.refill <- struct{}{}:
	default:
	}
}
