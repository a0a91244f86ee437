// Allocating and freeing: one at a time or in batches, slabs taken
// and released, and the memory they hold against the limit.

package pagestore

import (
	"errors"
	"fmt"
	"sync/atomic"
	"syscall"
	"unsafe"

	"github.com/gzramd/gzramd/internal/prefetch"
)

// Alloc reserves an allocation of size bytes (1..MaxAllocSize) tagged with
// owner, and returns its handle and its bytes for the caller to fill. owner
// is what Compact passes back to relocate, at most MaxOwner. Alloc fails
// with ErrFull, changing nothing, when the allocation needs a page of memory
// that the limit does not allow.
func (s *Store) Alloc(size int, owner uint32) (Handle, []byte, error) {
	if err := s.checkAlloc(size, owner); err != nil {
		return 0, nil, err
	}
	ci := classOf(size)
	c, g := &s.classes[ci], &s.geo[ci]
	c.mu.Lock()
	h, mem, cell, err := s.allocLocked(c, ci, size, owner, nil)
	c.mu.Unlock()
	if err != nil {
		return 0, nil, err
	}
	off := cellAt(g, cell)
	return h, mem[off : off+uint32(size) : off+uint32(size)], nil
}

// AllocBatch makes allocations as Alloc does but of lifetime lt (Alloc's
// are Short), allocation i of sizes[i] bytes tagged with owners[i], in
// order, and stores their handles in handles (as long as sizes); the
// caller fills them through Bytes. Runs of allocations of one size class
// take the class's lock once: a batch of pages that compress alike (as a
// program's pages often do) costs one lock, not one each, which is what
// lets many writers store at once.
//
// reserved is the part of an earlier Reserve the allocations draw on before
// the memory limit is asked for more (staged pages reserved 4 KiB each and
// are stored here). AllocBatch stops at the first allocation it cannot
// allocate, and returns how many it did (the first n handles), the part of
// reserved it did not use (still reserved, for the caller to use or
// Unreserve), and the error.
func (s *Store) AllocBatch(lt Lifetime, sizes []int, owners []uint32, handles []Handle, reserved int64) (n int, unused int64, err error) {
	if lt >= lifetimes {
		return 0, reserved, fmt.Errorf("pagestore: lifetime %d: %w", lt, syscall.EINVAL)
	}
	if len(owners) != len(sizes) || len(handles) != len(sizes) {
		return 0, reserved, fmt.Errorf("pagestore: batch of %d sizes, %d owners and %d handles: %w", len(sizes), len(owners), len(handles), syscall.EINVAL)
	}
	credit := reserved
	locked := -1
	defer func() {
		if locked >= 0 {
			s.classes[locked].mu.Unlock()
		}
	}()
	for i, size := range sizes {
		if err := s.checkAlloc(size, owners[i]); err != nil {
			return i, credit, err
		}
		ci := lt.class(size)
		if ci != locked {
			if locked >= 0 {
				s.classes[locked].mu.Unlock()
			}
			s.classes[ci].mu.Lock()
			locked = ci
		}
		h, _, _, err := s.allocLocked(&s.classes[ci], ci, size, owners[i], &credit)
		if err != nil {
			return i, credit, err
		}
		handles[i] = h
	}
	return len(sizes), credit, nil
}

func (s *Store) checkAlloc(size int, owner uint32) error {
	switch {
	case size < 1 || size > MaxAllocSize:
		return fmt.Errorf("pagestore: allocation size %d out of range [1, %d]: %w", size, MaxAllocSize, syscall.EINVAL)
	case owner > MaxOwner:
		return fmt.Errorf("pagestore: owner %#x above %#x: %w", owner, MaxOwner, syscall.EINVAL)
	case s.closed.Load():
		return ErrClosed
	}
	return nil
}

// allocLocked takes a cell of class ci for an allocation of size bytes and
// returns it with its slab's memory; new slab memory draws on credit (see
// hold). c.mu is held.
func (s *Store) allocLocked(c *class, ci, size int, owner uint32, credit *int64) (Handle, []byte, uint32, error) {
	id, mem, cell, err := s.take(c, ci, true, credit)
	if err != nil {
		return 0, nil, 0, err
	}
	setOwner(mem, cell, owner)
	setDelta(mem, cell, byte(s.geo[ci].size-uint32(size)))
	c.allocations.Add(1)
	c.bytes.Add(int64(size))
	return handle(id, cell), mem, cell, nil
}

func handle(slab, cell uint32) Handle { return Handle(slab)<<cellBits | Handle(cell) }

// lookup checks that h names a cell of an existing slab and returns the
// slab and its memory. It does not say whether the cell is in use.
func (s *Store) lookup(h Handle) (id uint32, r *slabRec, mem []byte, cell uint32, ok bool) {
	if h>>cellBits >= Handle(s.nslabs.Load()) {
		return 0, nil, nil, 0, false
	}
	id, cell = uint32(h>>cellBits), uint32(h&cellMask)
	if id == 0 {
		return 0, nil, nil, 0, false
	}
	r = s.rec(id)
	g := &s.geo[r.class]
	arenas := *s.arenas.Load()
	if cell >= g.cells || int(r.arena) >= len(arenas) {
		return 0, nil, nil, 0, false
	}
	off := int(r.page) * pageSize
	return id, r, arenas[r.arena][off : off+int(g.pages)*pageSize], cell, true
}

// Bytes returns the bytes of the allocation h, size long as given to Alloc (a
// size beyond the allocation's class is clamped to it). They are valid until
// the allocation is freed or relocated. Bytes checks only that h names a cell
// of an existing slab, returning nil otherwise; it takes no lock.
func (s *Store) Bytes(h Handle, size int) []byte {
	_, r, mem, cell, ok := s.lookup(h)
	if !ok {
		return nil
	}
	g := &s.geo[r.class]
	n := uint32(min(max(size, 0), int(g.size)))
	off := cellAt(g, cell)
	return mem[off : off+n : off+n]
}

// LifetimeOf is the lifetime of the allocation h (Short where h names
// none).
func (s *Store) LifetimeOf(h Handle) Lifetime {
	if _, r, _, _, ok := s.lookup(h); ok && r.class >= numClasses {
		return Long
	}
	return Short
}

// Prefetch asks the CPU for the cache line of h's tag, which Free(h)
// reads and writes: a writer replacing h calls it before it compresses
// the new page, so that the cache miss (the old allocation is cold, on a
// random page) overlaps the compression. Any handle is accepted.
func (s *Store) Prefetch(h Handle) {
	if _, _, mem, cell, ok := s.lookup(h); ok {
		prefetch.Line(unsafe.Pointer(&mem[tagSize*cell]))
	}
}

// Free releases the allocation h. A handle that names no live allocation
// (never allocated, already freed, or from another store) is detected,
// counted in Stats.BadHandles and otherwise ignored; a stale handle whose
// cell holds a new allocation frees that allocation. A slab left empty gives
// its pages back to the kernel at once, except that each class keeps one that
// emptied holding at most two pages (Compact releases it).
func (s *Store) Free(h Handle) {
	id, r, mem, cell, ok := s.lookup(h)
	if !ok {
		s.badHandles.Add(1)
		return
	}
	c := &s.classes[r.class]
	c.mu.Lock()
	s.freeLocked(c, id, r, mem, cell)
	c.mu.Unlock()
}

// FreeBatch frees each handle as Free does, skipping zeroes. Runs of
// handles of one size class take the class's lock once.
func (s *Store) FreeBatch(handles []Handle) {
	var locked *class
	for _, h := range handles {
		if h == 0 {
			continue
		}
		id, r, mem, cell, ok := s.lookup(h)
		if !ok {
			s.badHandles.Add(1)
			continue
		}
		if c := &s.classes[r.class]; c != locked {
			if locked != nil {
				locked.mu.Unlock()
			}
			c.mu.Lock()
			locked = c
		}
		s.freeLocked(locked, id, r, mem, cell)
	}
	if locked != nil {
		locked.mu.Unlock()
	}
}

// freeLocked frees cell of slab id, whose class's lock c.mu is held.
func (s *Store) freeLocked(c *class, id uint32, r *slabRec, mem []byte, cell uint32) {
	g := &s.geo[r.class]
	if r.state == slabEmpty || cell >= uint32(r.bump) || isFree(owner(mem, cell)) {
		s.badHandles.Add(1)
		return
	}
	size := g.size - uint32(delta(mem, cell))
	setOwner(mem, cell, freeTag|uint32(r.freeHead))
	r.freeHead = uint16(cell + 1)
	wasFull := uint32(r.live) == g.cells
	r.live--
	c.allocations.Add(-1)
	c.bytes.Add(-int64(size))
	switch r.state {
	case slabActive:
		switch {
		case r.live == 0:
			if !wasFull {
				s.unlink(&c.partial, id)
			}
			switch {
			case r.cold:
				// Compact gave part of it back: reused, it would fault
				// in there on a writer's path.
				s.release(c, id, r, mem, false)
			case c.cached == 0 && r.touched <= maxCachedPages:
				r.bump, r.freeHead, r.state = 0, 0, slabEmpty
				c.cached = id
			case s.pf.prefault > 0 && s.keptEmpty.Add(int64(r.touched)) <= s.pf.prefault/pageSize:
				// A swap daemon keeps emptied slabs resident for reuse,
				// up to Prefault bytes: pages given back now would fault
				// in again on the path that stores a swapped-out page,
				// maybe when the kernel has no page to give. Beyond that
				// they go back: the memory swap gave up must not stay
				// stranded in one size class.
				r.bump, r.freeHead, r.state = 0, 0, slabEmpty
				c.empty = append(c.empty, id)
			default:
				if s.pf.prefault > 0 {
					s.keptEmpty.Add(-int64(r.touched)) // not kept after all
				}
				s.release(c, id, r, mem, false)
			}
		case wasFull:
			s.push(&c.partial, id)
		}
	case slabDraining:
		if r.live == 0 {
			s.unlink(&c.draining, id)
			s.release(c, id, r, mem, true)
		}
	case slabCold:
		if r.live == 0 {
			s.release(c, id, r, mem, false)
		} else {
			r.state = slabActive
			s.push(&c.partial, id)
		}
	}
}

// take hands out a free cell of class ci, from the most recently used slab
// with room, making a slab when grow is set and none has room. c.mu is held.
// With a prefaulter, c.mu is let go while it waits for one to make a
// slab's memory ready (newSlab).
func (s *Store) take(c *class, ci int, grow bool, credit *int64) (id uint32, mem []byte, cell uint32, err error) {
	g := &s.geo[ci]
	missed := false
	for id = c.partial; id == 0; id = c.partial {
		if !grow {
			return 0, nil, 0, ErrFull
		}
		// Spare making a slab that could not take even one allocation.
		if !s.fits(c, int64(pagesFor(cellAt(g, 1)))*pageSize-creditOf(credit)) {
			return 0, nil, 0, ErrFull
		}
		ready := s.pf.expect()
		if id, err = s.newSlab(c, ci); err == nil {
			s.push(&c.partial, id)
			break
		}
		if !errors.Is(err, ErrNotPrefaulted) {
			return 0, nil, 0, err
		}
		if !missed {
			s.prefaultMisses.Add(1)
			missed = true
		}
		if !s.pf.await(c, ready) {
			return 0, nil, 0, err
		}
	}
	r := s.rec(id)
	cell, err = s.takeFrom(c, r, g, s.slabMem(r, g), credit)
	if errors.Is(err, errCold) {
		// Its room is in pages it gave back: it waits, off the list,
		// for a free cell, and a slab with resident room is taken.
		s.unlink(&c.partial, id)
		r.state = slabCold
		return s.take(c, ci, grow, credit)
	}
	if err != nil {
		if r.live == 0 {
			// A slab made just now: it holds no memory yet.
			s.unlink(&c.partial, id)
			r.state = slabEmpty
			c.empty = append(c.empty, id)
			if s.pf.prefault > 0 && !r.cold && r.touched == 0 {
				s.warmEmpty.Add(int64(g.pages))
			}
		}
		// The head slab needs a new page; another may have a free cell
		// in pages it already holds.
		for id = c.partial; id != 0; id = r.next {
			r = s.rec(id)
			if r.freeHead != 0 || pagesFor(cellAt(g, uint32(r.bump)+1)) <= uint32(r.touched) {
				cell, err = s.takeFrom(c, r, g, s.slabMem(r, g), credit)
				break
			}
		}
		if err != nil {
			return 0, nil, 0, err
		}
	}
	if uint32(r.live) == g.cells {
		s.unlink(&c.partial, id)
	}
	return id, s.slabMem(r, g), cell, nil
}

// errCold is takeFrom's refusal to reach into a page the slab gave back.
var errCold = errors.New("pagestore: the slab's next page was given back")

// takeFrom hands out a cell of r: a freed one first, else the next never
// used one, reserving the page it reaches into.
func (s *Store) takeFrom(c *class, r *slabRec, g *geometry, mem []byte, credit *int64) (uint32, error) {
	var cell uint32
	if r.freeHead != 0 {
		cell = uint32(r.freeHead - 1)
		r.freeHead = uint16(owner(mem, cell) &^ freeTag)
	} else {
		cell = uint32(r.bump)
		need := pagesFor(cellAt(g, cell+1))
		if need > uint32(r.touched) && r.cold && s.pf.prefault > 0 {
			return 0, errCold
		}
		if need > uint32(r.touched) && s.pf.prefault > 0 {
			// Faulted in whole ahead of use (carved from the pages
			// faulted ahead, or warmed whole), the slab is held whole
			// from its first allocation, as zsmalloc's pages are
			// counted in zram's mem_used_total.
			need = g.pages
		}
		if need > uint32(r.touched) {
			if err := s.hold(c, int64(need-uint32(r.touched))*pageSize, credit); err != nil {
				return 0, err
			}
			r.touched = uint16(need)
		}
		r.bump++
	}
	r.live++
	return cell, nil
}

func (m *mapping) slabMem(r *slabRec, g *geometry) []byte {
	off := int(r.page) * pageSize
	return (*m.arenas.Load())[r.arena][off : off+int(g.pages)*pageSize]
}

// newSlab returns an empty active slab for class ci: one the class used
// before, or a new one carved from an arena. c.mu is held.
//
// With a prefaulter, it takes only memory already faulted in, and fails
// with ErrNotPrefaulted where there is none: the writer that needs a slab
// is storing a swapped-out page, and a fault there may wait on reclaim,
// which may wait on this very write (a guest swapping onto gzramd right
// after a restart froze so). Mapping an arena on that path would be
// worse: mmap takes the process's mmap lock for writing.
func (s *Store) newSlab(c *class, ci int) (uint32, error) {
	if id := c.cached; id != 0 {
		c.cached = 0
		s.rec(id).state = slabActive
		return id, nil
	}
	prefaulting := s.pf.prefault > 0
	if n := len(c.empty); n > 0 {
		// With prefaulting, slabs whose pages are resident (kept, or
		// faulted in again by warmReleased) are on top of the stack and
		// taken first. A released one below them is not: its pages would
		// fault in, as after a compaction gave many back. A new slab comes
		// from the arena faulted ahead instead, and the prefaulter faults
		// a released one in again for each such slab (wantWarm), so that
		// a class that churns reuses its released slabs rather than grow
		// the arenas and slab records without bound.
		id := c.empty[n-1]
		r := s.rec(id)
		switch {
		case !prefaulting:
		case r.touched > 0: // kept resident
			s.keptEmpty.Add(-int64(r.touched))
		case !r.cold:
			s.warmEmpty.Add(-int64(s.geo[ci].pages))
			s.pf.wake() // to warm the class's next one
		default:
			made, err := s.carveSlab(ci, true)
			switch {
			case err == nil:
				c.wantWarm++
				s.pf.wake()
				return made, nil
			case errors.Is(err, ErrClosed):
				return 0, err
			}
			// No slab can be made (no pages faulted ahead, or no
			// record left): the prefaulter warms the released one on
			// top, which this class has none resident above.
			s.pf.wake()
			return 0, ErrNotPrefaulted
		}
		c.empty = c.empty[:n-1]
		r.cold = false
		r.state = slabActive
		return id, nil
	}
	id, err := s.carveSlab(ci, prefaulting)
	if errors.Is(err, errUnfaulted) {
		return 0, ErrNotPrefaulted
	}
	return id, err
}

// carveSlab makes a new active slab for class ci from an arena; with
// faultedOnly, only from pages (and a slab record) the prefaulter has
// faulted in, failing with errUnfaulted otherwise. c.mu is held.
func (s *Store) carveSlab(ci int, faultedOnly bool) (uint32, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed.Load() {
		return 0, ErrClosed
	}
	id := s.nslabs.Load()
	if id >= maxSlabs {
		return 0, fmt.Errorf("pagestore: all %d slab records in use: %w", maxSlabs, syscall.ENOSPC)
	}
	if faultedOnly && int(id) >= s.pf.recsTo {
		return 0, errUnfaulted
	}
	arena, page, err := s.carve(int(s.geo[ci].pages), faultedOnly)
	if err != nil {
		return 0, err
	}
	if ci >= numClasses {
		s.markLong()
	}
	r := s.rec(id)
	*r = slabRec{arena: arena, page: page, class: uint16(ci), state: slabActive}
	// Sealed last: Recover takes a slab whose seal it finds as written
	// whole.
	atomic.StoreUint32(&r.sealed, recordSeal)
	s.nslabs.Store(id + 1)
	return id, nil
}

// errUnfaulted is carve's refusal, asked for faulted pages only, to reach
// past what the prefaulter has faulted in.
var errUnfaulted = errors.New("pagestore: no faulted arena pages left to carve")

// carve takes pages contiguous pages from the last arena, mapping a new
// one when it has too few left. With faultedOnly it takes only pages the
// prefaulter faulted in, from the last arena or its spare, and maps
// nothing. s.mu is held.
func (s *Store) carve(pages int, faultedOnly bool) (arena, page uint32, err error) {
	arenas := *s.arenas.Load()
	if s.pf.refill != nil {
		s.pf.wake()
	}
	full := len(arenas) == 0 || s.arenaNext+pages > s.arenaSize/pageSize
	if faultedOnly {
		switch {
		case !full && s.arenaNext+pages <= s.pf.faultedTo && !s.pf.touching.overlaps(len(arenas)-1, s.arenaNext, pages):
		case full && s.pf.spare != nil && s.pf.spareArena == len(arenas) && s.pf.spareFaulted >= pages &&
			!s.pf.touching.overlaps(len(arenas), 0, pages):
		default:
			return 0, 0, errUnfaulted
		}
	}
	if full {
		if len(arenas) > 0 {
			s.pf.leaveTail(len(arenas)-1, s.arenaNext)
		}
		mem := s.pf.spare
		if mem != nil && s.pf.spareArena == len(arenas) {
			s.pf.spare = nil
			s.pf.faultedTo, s.pf.spareFaulted = s.pf.spareFaulted, 0
		} else {
			var err error
			if mem, err = s.mapArena(len(arenas)); err != nil {
				return 0, 0, err
			}
			s.pf.faultedTo = 0
		}
		next := make([][]byte, len(arenas)+1)
		copy(next, arenas)
		next[len(arenas)] = mem
		s.arenas.Store(&next)
		arenas, s.arenaNext = next, 0
	}
	page = uint32(s.arenaNext)
	s.arenaNext += pages
	return uint32(len(arenas) - 1), page, nil
}

// release gives an empty slab's pages back to the kernel and keeps the
// slab for its class to reuse. c.mu is held.
//
// With a prefaulter, that thread gives the pages back and the slab waits,
// on no list, until it has. Under mlockall, giving pages back takes the
// process's mmap lock for writing (munlock, mlock2), and while another of
// gzramd's threads holds it for reading in a fault or populate that waits
// on reclaim, the writer waits, and so does every later fault and madvise
// behind it: a writer storing a swapped-out page must never be that
// writer. A guest swapping onto gzramd froze exactly so.
func (s *Store) release(c *class, id uint32, r *slabRec, mem []byte, compacted bool) {
	held := int64(r.touched)
	queued := s.pf.queue(pendingRelease{id: id, class: r.class, pages: r.touched})
	if !queued {
		if err := s.releasePages(r, mem[:held*pageSize]); err != nil {
			s.releaseErrors.Add(1)
		}
	}
	s.memUsed.Add(-held * pageSize)
	if compacted {
		s.pagesCompacted.Add(held)
	}
	// arena, page and class stay: Bytes and Free read them without a lock.
	r.prev, r.next, r.bump, r.live, r.freeHead, r.touched = 0, 0, 0, 0, 0, 0
	r.state, r.cold = slabEmpty, true
	if queued {
		s.pf.wake()
		return
	}
	c.pushEmpty(id, s.pf.prefault > 0)
}

// pushEmpty puts a slab whose pages were given back on the class's stack
// of empty slabs: below those that kept their pages where the store
// prefaults (newSlab takes only those). c.mu is held.
func (c *class) pushEmpty(id uint32, prefaulting bool) {
	if c.empty == nil {
		c.empty = make([]uint32, 0, 16)
	}
	c.empty = append(c.empty, id)
	if prefaulting {
		copy(c.empty[1:], c.empty)
		c.empty[0] = id
	}
}

// hold counts n more bytes of slab memory as held: first from credit (a
// caller's Reserve, which already counts in memUsed and becomes slab
// memory), then, for the rest, if the limit allows (see holdWithin).
// credit may be nil. c.mu is held.
func (s *Store) hold(c *class, n int64, credit *int64) error {
	if use := min(creditOf(credit), n); use > 0 {
		if err := s.holdWithin(c, n-use); err != nil {
			return err
		}
		*credit -= use
		s.reserved.Add(-use)
		return nil
	}
	return s.holdWithin(c, n)
}

func creditOf(credit *int64) int64 {
	if credit == nil {
		return 0
	}
	return *credit
}

// holdWithin counts n more bytes as held if the limit allows, releasing
// the cached empty slabs of c and of the classes not busy now if that
// makes the difference. c, if not nil, is locked.
func (s *Store) holdWithin(c *class, n int64) error {
	if n <= 0 {
		return nil
	}
	reclaimed := false
	for {
		used, limit := s.memUsed.Load(), s.memLimit.Load()
		if limit > 0 && used+n > limit {
			if reclaimed {
				return ErrFull
			}
			s.dropCaches(c)
			reclaimed = true
			continue
		}
		if s.memUsed.CompareAndSwap(used, used+n) {
			raiseMax(&s.memUsedMax, used+n)
			return nil
		}
	}
}

// raiseMax raises m to v where v is more.
func raiseMax(m *atomic.Int64, v int64) {
	for {
		old := m.Load()
		if v <= old || m.CompareAndSwap(old, v) {
			return
		}
	}
}

// Reserve counts n bytes as held for allocations the caller will store later
// (pages it keeps elsewhere meanwhile, such as staged ones): they count in
// MemUsed and against the limit from now on, and Reserve fails with
// ErrFull, changing nothing, when the limit does not allow them. The
// allocations are then made with AllocBatch, drawing on the reservation,
// and what is left of it given back with Unreserve.
func (s *Store) Reserve(n int64) error {
	if n <= 0 {
		return nil
	}
	if err := s.holdWithin(nil, n); err != nil {
		return err
	}
	s.reserved.Add(n)
	return nil
}

// Unreserve gives back n bytes of earlier Reserves.
func (s *Store) Unreserve(n int64) {
	if n <= 0 {
		return
	}
	s.reserved.Add(-n)
	s.memUsed.Add(-n)
}

// fits reports whether n more bytes would fit within the limit, releasing
// cached empty slabs if that makes the difference. c.mu is held.
func (s *Store) fits(c *class, n int64) bool {
	if n <= 0 {
		return true
	}
	over := func() bool {
		limit := s.memLimit.Load()
		return limit > 0 && s.memUsed.Load()+n > limit
	}
	if over() {
		s.dropCaches(c)
		return !over()
	}
	return true
}

// DropCaches releases the cached empty slab of each class of lifetime lt
// (see Free), which otherwise stays until the next Compact: after the
// dense tier moved a pass's pages out of the short-lived slabs, one is
// left in nearly every class, idle, and together they are what the store
// holds beyond its data.
func (s *Store) DropCaches(lt Lifetime) {
	if s.closed.Load() {
		return
	}
	for i := int(lt) * numClasses; i < int(lt+1)*numClasses; i++ {
		c := &s.classes[i]
		c.mu.Lock()
		s.dropCache(c, &s.geo[i])
		c.mu.Unlock()
	}
}

// dropCaches releases the classes' cached empty slabs. c.mu is held; other
// classes busy now are skipped, as taking their locks could deadlock.
func (s *Store) dropCaches(c *class) {
	for i := range s.classes {
		o := &s.classes[i]
		if o == c {
			s.dropCache(o, &s.geo[i])
		} else if o.mu.TryLock() {
			s.dropCache(o, &s.geo[i])
			o.mu.Unlock()
		}
	}
}

// dropCache releases class c's cached empty slab, if any. c.mu is held.
func (s *Store) dropCache(c *class, g *geometry) {
	if id := c.cached; id != 0 {
		c.cached = 0
		r := s.rec(id)
		s.release(c, id, r, s.slabMem(r, g), false)
	}
}
