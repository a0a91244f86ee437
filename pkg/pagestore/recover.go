// Taking over a store whose files another process wrote.

package pagestore

import (
	"errors"
	"fmt"
	"math/bits"
	"sync/atomic"
	"syscall"
)

// Recovery takes over a store from its files after the process that
// wrote them died. The allocations the store holds are whatever its owner
// still references: the caller names each with Keep, and Done rebuilds
// the store around them, giving back the memory of every allocation not named
// (allocated but never referenced, or being freed, when the writer died).
//
// Of what the files hold, Recover trusts only what was written once and
// sealed: each slab's arena, page and class. Everything else (lists,
// counts, free lists) is rebuilt, so a writer killed halfway through any
// change leaves nothing to misread. Keep checks each allocation's tag against
// the owner and size the caller names. Until Done, nothing in the files
// changes: a Recovery given up with Close leaves them as they were, to be
// examined or tried again.
type Recovery struct {
	s *Store
	// kept marks the cells named by Keep: slab id's cells are bits
	// [first[id], first[id]+cells) of kept.
	kept  []uint64
	first []uint32
	// live and bump count and bound slab id's kept cells; Done writes
	// them to the slab's record.
	live, bump []uint16
}

// Recover maps the store in cfg.Files, written by an earlier store with
// the same ArenaSize, for the caller to name its allocations. Files of
// another layout fail with ErrLayout.
func Recover(cfg Config) (*Recovery, error) {
	if cfg.Files == nil {
		return nil, errors.New("pagestore: Recover needs Config.Files")
	}
	s, err := configure(cfg)
	if err != nil {
		return nil, err
	}
	rc := &Recovery{s: s}
	if err := rc.load(); err != nil {
		s.Close()
		return nil, fmt.Errorf("pagestore: recovering: %w", err)
	}
	return rc, nil
}

// load maps the records and arenas, finds the sealed slabs, and checks
// them against the arena file.
func (rc *Recovery) load() error {
	s := rc.s
	if err := s.mapSlabs(false); err != nil {
		return err
	}
	arenaBytes, err := s.files.Arenas.Size()
	if err != nil {
		return err
	}
	arenaPages := uint32(s.arenaSize / pageSize)
	id := uint32(1)
	lastArena, lastEnd := -1, uint32(0)
	var cells uint64
	rc.first = make([]uint32, 1, 1024)
	for ; id < maxSlabs && atomic.LoadUint32(&s.recs[id].sealed) == recordSeal; id++ {
		r := s.rec(id)
		if r.class >= uint16(min(s.header().classes, allClasses)) {
			return fmt.Errorf("slab %d of class %d: %w", id, r.class, ErrLayout)
		}
		g := &s.geo[r.class]
		end := r.page + g.pages
		if end > arenaPages || (int64(r.arena)+1)*int64(s.arenaSize) > arenaBytes {
			return fmt.Errorf("slab %d at page %d of arena %d, beyond the arena file (%d bytes, arenas of %d): %w",
				id, r.page, r.arena, arenaBytes, s.arenaSize, syscall.EUCLEAN)
		}
		if a := int(r.arena); a > lastArena {
			lastArena, lastEnd = a, end
		} else if a == lastArena {
			lastEnd = max(lastEnd, end)
		}
		rc.first = append(rc.first, uint32(cells))
		cells += uint64(g.cells)
		if cells > 1<<32-1 {
			return fmt.Errorf("slab %d: more than 2^32 cells: %w", id, syscall.EUCLEAN)
		}
	}
	s.nslabs.Store(id)
	rc.kept = make([]uint64, (cells+63)/64)
	rc.live, rc.bump = make([]uint16, id), make([]uint16, id)
	for k := 0; k <= lastArena; k++ {
		mem, err := s.mapArena(k)
		if err != nil {
			return err
		}
		next := append(*s.arenas.Load(), mem)
		s.arenas.Store(&next)
	}
	s.arenaNext, s.pf.faultedTo = int(lastEnd), int(lastEnd)
	return nil
}

// Keep names a live allocation: handle h, tagged with owner o, of size bytes,
// as the caller recorded it when the allocation was stored. It fails, changing
// nothing, when the store disagrees: no such cell, another owner or size
// in its tag, or named before.
func (rc *Recovery) Keep(h Handle, o uint32, size int) error {
	s := rc.s
	id, r, mem, cell, ok := s.lookup(h)
	if !ok {
		return fmt.Errorf("pagestore: recovering %#x (owner %d): no such cell: %w", h, o, syscall.EUCLEAN)
	}
	g := &s.geo[r.class]
	tagOwner, d := owner(mem, cell), delta(mem, cell)
	switch {
	case tagOwner != o:
		return fmt.Errorf("pagestore: recovering %#x: tagged for owner %#x, not %d: %w", h, tagOwner, o, syscall.EUCLEAN)
	case uint32(d) >= classStep || int(g.size)-int(d) != size:
		return fmt.Errorf("pagestore: recovering %#x (owner %d): %d bytes in its tag, not %d: %w", h, o, int(g.size)-int(d), size, syscall.EUCLEAN)
	}
	bit := uint64(rc.first[id]) + uint64(cell)
	if rc.kept[bit/64]&(1<<(bit%64)) != 0 {
		return fmt.Errorf("pagestore: recovering %#x (owner %d): named twice: %w", h, o, syscall.EUCLEAN)
	}
	rc.kept[bit/64] |= 1 << (bit % 64)
	rc.live[id]++
	rc.bump[id] = max(rc.bump[id], uint16(cell+1))
	return nil
}

// Done rebuilds the store around the allocations kept, gives back the memory
// of everything else, and returns the store, running.
func (rc *Recovery) Done() (*Store, error) {
	s := rc.s
	for id := uint32(1); id < s.nslabs.Load(); id++ {
		r := s.rec(id)
		r.prev, r.next, r.freeHead, r.touched, r.cold = 0, 0, 0, 0, false
		r.live, r.bump, r.state = rc.live[id], rc.bump[id], slabActive
		c, g := &s.classes[r.class], &s.geo[r.class]
		mem := s.slabMem(r, g)
		if r.live == 0 {
			if err := s.releasePages(r, mem); err != nil {
				return nil, fmt.Errorf("pagestore: recovering: %w", err)
			}
			r.state, r.cold = slabEmpty, true
			c.pushEmpty(id, s.pf.prefault > 0)
			continue
		}
		for cell := int(r.bump) - 1; cell >= 0; cell-- {
			bit := uint64(rc.first[id]) + uint64(cell)
			if rc.kept[bit/64]&(1<<(bit%64)) != 0 {
				c.allocations.Add(1)
				c.bytes.Add(int64(g.size) - int64(delta(mem, uint32(cell))))
				continue
			}
			setOwner(mem, uint32(cell), freeTag|uint32(r.freeHead))
			r.freeHead = uint16(cell + 1)
		}
		r.touched = uint16(pagesFor(cellAt(g, uint32(r.bump))))
		if err := s.releasePages(r, mem[int(r.touched)*pageSize:]); err != nil {
			return nil, fmt.Errorf("pagestore: recovering: %w", err)
		}
		// Its pages above touched went back: with a prefaulter, no
		// writer reaches into them (takeFrom's errCold).
		r.cold = uint32(r.touched) < g.pages
		s.memUsed.Add(int64(r.touched) * pageSize)
		if uint32(r.live) < g.cells {
			s.push(&c.partial, id)
		}
	}
	// So do the tails of the arenas, faulted ahead and left when the next
	// slab did not fit (a process that died before its prefaulter gave
	// them back), and what lies beyond the last slab.
	if err := rc.giveBackTails(); err != nil {
		return nil, fmt.Errorf("pagestore: recovering: %w", err)
	}
	s.memUsedMax.Store(s.memUsed.Load())
	rc.kept, rc.first, rc.live, rc.bump = nil, nil, nil, nil
	s.pf.start()
	return s, nil
}

// Close gives up the recovery: the store's mappings go, its files stay
// as they were.
func (rc *Recovery) Close() error { return rc.s.Close() }

// Bytes is Store.Bytes on the store being recovered: an allocation's bytes,
// for a caller that reads what it must Keep next from an allocation it kept.
func (rc *Recovery) Bytes(h Handle, size int) []byte { return rc.s.Bytes(h, size) }

// Kept counts the allocations named so far.
func (rc *Recovery) Kept() int {
	n := 0
	for _, w := range rc.kept {
		n += bits.OnesCount64(w)
	}
	return n
}

// giveBackTails punches out each arena from the end of its last slab on,
// and the last from the carve point to the end of the file: a slab carved
// but never sealed, and the spare arena faulted ahead.
func (rc *Recovery) giveBackTails() error {
	s := rc.s
	arenas := *s.arenas.Load()
	if len(arenas) == 0 {
		return nil
	}
	size, err := s.files.Arenas.Size()
	if err != nil {
		return err
	}
	ends := make([]int, len(arenas))
	for id := uint32(1); id < s.nslabs.Load(); id++ {
		r := s.rec(id)
		if int(r.arena) < len(ends) {
			ends[r.arena] = max(ends[r.arena], int(r.page)+int(s.geo[r.class].pages))
		}
	}
	last := len(ends) - 1
	ends[last] = s.arenaNext
	for a, end := range ends {
		from, to := int64(a)*int64(s.arenaSize)+int64(end)*pageSize, int64(a+1)*int64(s.arenaSize)
		if a == last {
			to = size
		}
		if to > from {
			if err := s.files.Arenas.Punch(from, to-from); err != nil {
				return err
			}
		}
	}
	return nil
}
