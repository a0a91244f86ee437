package pagestore

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/gzramd/gzramd/internal/osthread"
	"github.com/gzramd/gzramd/internal/prefetch"
)

// Handle names a stored object. 0 is never a valid handle. Handles are
// below 1<<48: a slab number shifted left by 12 bits, or'ed with a slot.
type Handle uint64

var (
	// ErrFull reports that storing would exceed the memory limit.
	ErrFull = fmt.Errorf("pagestore: memory limit reached: %w", syscall.ENOSPC)
	// ErrClosed reports use of a closed store.
	ErrClosed = errors.New("pagestore: store is closed")
)

// Config sets up a Store.
type Config struct {
	// MemLimit is the number of bytes of slab memory the store may hold;
	// 0 means unlimited.
	MemLimit int64
	// ArenaSize is the number of bytes mmap'd at a time, from which slabs
	// are carved; 0 means DefaultArenaSize. It is rounded up to whole pages
	// and to the largest slab (about 1 MiB).
	ArenaSize int
	// Prefault, when positive, keeps this many bytes of not yet carved
	// arena memory faulted in ahead of use, by a background goroutine.
	// A swap daemon needs it: a page fault on the path that stores a
	// swapped-out page may need memory the kernel can only get by
	// swapping to this very store. 0 leaves arenas to fault lazily.
	Prefault int64
}

// Stats are the store's counters, with kernel zram's meanings where zram
// has the same figure.
type Stats struct {
	ComprDataSize  int64 // sum of live objects' sizes (compr_data_size)
	MemUsed        int64 // bytes of slab memory held (mem_used_total)
	MemUsedMax     int64 // high-water mark of MemUsed (mem_used_max)
	MemLimit       int64 // 0 = unlimited (mem_limit)
	Objects        int64 // live objects
	PagesCompacted int64 // 4 KiB pages given back by compaction, cumulative (pages_compacted)
	// MetadataBytes is what the store spends to keep track of objects:
	// each live object's 5-byte tag (owner and exact size, held inside the
	// slabs and so also part of MemUsed) plus the slab records on the Go
	// heap.
	MetadataBytes int64
	// BadHandles counts Free calls with a handle that names no live object.
	BadHandles int64
	// ReleaseErrors counts failures to give an empty slab's pages back to
	// the kernel (the pages stay mapped and are reused).
	ReleaseErrors int64
	// PrefaultMisses counts pages handed to new slabs before the
	// prefaulter had touched them (Config.Prefault > 0): each may fault
	// on a writer's path. Writers outran the prefaulter, or it was starved
	// of memory.
	PrefaultMisses int64
}

// Store keeps objects of 1..4096 bytes in slabs outside the Go heap.
//
// Alloc, Bytes, Free and Compact are safe for concurrent use; each size
// class has its own lock, and the only lock shared by all classes is taken
// when a class needs a slab it has never had before.
type Store struct {
	geo     [numClasses]geometry
	classes [numClasses]class

	chunks [maxChunks]atomic.Pointer[slabChunk]
	nslabs atomic.Uint32 // slabs [1, nslabs) exist; 0 is never used
	// arenas is replaced, never modified, when an arena is added, so that
	// Bytes reads it without a lock.
	arenas atomic.Pointer[[][]byte]
	closed atomic.Bool

	memUsed        atomic.Int64
	memUsedMax     atomic.Int64
	memLimit       atomic.Int64
	pagesCompacted atomic.Int64
	nchunks        atomic.Int64
	badHandles     atomic.Int64
	releaseErrors  atomic.Int64
	prefaultMisses atomic.Int64
	// keptEmpty counts the pages of emptied slabs kept resident for
	// reuse (Prefault > 0), at most Prefault bytes' worth.
	keptEmpty atomic.Int64

	mu        sync.Mutex // guards arena carving, slab creation and Close
	arenaSize int
	arenaNext int // first uncarved page of the last arena

	compactMu sync.Mutex // one Compact at a time; guards scratch
	scratch   []uint32

	// Prefaulting (Config.Prefault): spare is an arena mapped and faulted
	// ahead, taken by carve when the last arena is full; faultedTo is the
	// first page of the last arena not yet touched. Both under mu.
	prefault     int64
	spare        []byte
	spareFaulted int // pages of spare touched
	faultedTo    int
	refill       chan struct{}
	stopRefill   chan struct{}
	refillDone   chan struct{}
	stopOnce     sync.Once

	// releases are emptied slabs whose pages the prefaulter gives back
	// (Config.Prefault > 0), so that no writer does: see release.
	relMu    sync.Mutex
	releases []pendingRelease
	// releasing is the prefaulter's copy of releases, swapped with it.
	releasing []pendingRelease
}

// pendingRelease is an emptied slab waiting for its pages to go back. It
// is on no list of its class until they have.
type pendingRelease struct {
	id    uint32
	class uint16
	pages uint16
}

// maxPendingReleases bounds the queue of slabs the prefaulter releases;
// beyond it, the thread that emptied a slab releases it itself.
const maxPendingReleases = 4096

// class is a size class's mutable state. It is padded so that two classes'
// locks never share a cache line.
type class struct {
	mu       sync.Mutex
	partial  uint32 // active slabs with a free slot
	draining uint32
	empty    []uint32 // slabs of this class holding no memory, for reuse
	// cached is a slab that emptied while small and kept its pages, so
	// that a class whose last object comes and goes does not pay for
	// madvise, a TLB shootdown and page faults each time. Compact, Close
	// and a limit that would fail an Alloc release it.
	cached  uint32
	objects atomic.Int64
	bytes   atomic.Int64
	_       [64]byte
}

// New creates an empty store. It maps no memory until the first Alloc.
func New(cfg Config) (*Store, error) {
	if cfg.MemLimit < 0 {
		return nil, fmt.Errorf("pagestore: negative memory limit %d", cfg.MemLimit)
	}
	if cfg.ArenaSize < 0 {
		return nil, fmt.Errorf("pagestore: negative arena size %d", cfg.ArenaSize)
	}
	s := &Store{arenaSize: cfg.ArenaSize}
	if s.arenaSize == 0 {
		s.arenaSize = DefaultArenaSize
	}
	largest := 0
	for i := range s.geo {
		s.geo[i] = newGeometry(i)
		largest = max(largest, int(s.geo[i].pages)*pageSize)
	}
	s.arenaSize = max((s.arenaSize+pageSize-1)/pageSize*pageSize, largest)
	s.memLimit.Store(cfg.MemLimit)
	s.nslabs.Store(1)
	s.arenas.Store(new([][]byte))
	if cfg.Prefault > 0 {
		s.prefault = cfg.Prefault
		s.refill = make(chan struct{}, 1)
		s.stopRefill = make(chan struct{})
		s.refillDone = make(chan struct{})
		s.releases = make([]pendingRelease, 0, maxPendingReleases)
		s.releasing = make([]pendingRelease, 0, maxPendingReleases)
		go osthread.Run("gzramd-prefault", s.prefaulter)
		s.refill <- struct{}{}
	}
	return s, nil
}

// prefaulter keeps Config.Prefault bytes of arena faulted in ahead of
// carve, woken by carve and every 100ms. It runs on a thread of its own,
// named gzramd-prefault, so that a stack dump (sysrq-t, top -H) shows
// whether the one thread allowed to wait on reclaim is doing so.
func (s *Store) prefaulter() {
	defer close(s.refillDone)
	t := time.NewTicker(100 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-s.stopRefill:
			return
		case <-s.refill:
		case <-t.C:
		}
		s.releaseQueued()
		s.warmReleased()
		s.prefaultAhead()
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
		if err := releasePages(s.slabMem(r, g)[:int(p.pages)*pageSize]); err != nil {
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
		if n == 0 || s.rec(c.empty[n-1]).touched > 0 || s.rec(c.empty[n-1]).warm {
			c.mu.Unlock()
			continue
		}
		// Off the stack while its pages fault in, so nobody takes it.
		id := c.empty[n-1]
		c.empty = c.empty[:n-1]
		c.mu.Unlock()
		r := s.rec(id)
		touchPages(s.slabMem(r, g))
		c.mu.Lock()
		r.warm = true
		c.empty = append(c.empty, id)
		c.mu.Unlock()
	}
}

// prefaultAhead touches the pages between the carve point and Prefault
// bytes beyond it, mapping the spare arena when the last one runs short.
// It touches without holding mu (a fault may wait on reclaim; carve must
// not wait with it), with an atomic add of zero: carve may hand out a page
// while it is being touched, and the add changes no byte a slab wrote.
func (s *Store) prefaultAhead() {
	const step = 64 // pages touched between looks at the carve point
	// The slab records for the next slabs too: a new chunk is fresh heap
	// memory, and newSlab runs on a writer's path.
	if next := (s.nslabs.Load() + chunkSize/2) >> chunkBits; next < maxChunks {
		s.ensureChunk(next)
	}
	for {
		s.mu.Lock()
		if s.closed.Load() {
			s.mu.Unlock()
			return
		}
		arenas := *s.arenas.Load()
		want := int(s.prefault / pageSize)
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
				want -= ahead // the rest goes to the spare arena
			} else {
				s.mu.Unlock()
				return
			}
		}
		if mem == nil {
			// The last arena is faulted to its end: get the spare ready,
			// mapping it without the lock (carve must not wait on mmap).
			if s.spare == nil {
				s.mu.Unlock()
				spare, err := mapArena(s.arenaSize)
				if err != nil {
					return
				}
				s.mu.Lock()
				if s.spare != nil || s.closed.Load() {
					s.mu.Unlock()
					_ = unix.Munmap(spare)
					continue
				}
				s.spare = spare
				s.spareFaulted = 0
			}
			if s.spareFaulted >= min(want, len(s.spare)/pageSize) {
				s.mu.Unlock()
				return
			}
			mem, from = s.spare, s.spareFaulted
			s.spareFaulted = min(s.spareFaulted+step, len(s.spare)/pageSize)
		}
		s.mu.Unlock()
		touchPages(mem[from*pageSize : min(from+step, len(mem)/pageSize)*pageSize])
	}
}

// touchPages faults in every page of mem without changing its contents.
//
// In a system call where the kernel allows it (MADV_POPULATE_WRITE, Linux
// 5.14): a thread faulting in Go code cannot be stopped by the runtime,
// so a fault that waits on reclaim would hold up every stop-the-world
// (each garbage collection has two) and with it every goroutine, the
// ones storing swapped pages included; a thread in a system call does
// not. Elsewhere, with an atomic add of zero per page, which changes no
// byte a slab wrote.
func touchPages(mem []byte) {
	if len(mem) == 0 || unix.Madvise(mem, unix.MADV_POPULATE_WRITE) == nil {
		return
	}
	for off := 0; off+4 <= len(mem); off += pageSize {
		atomic.AddUint32((*uint32)(unsafe.Pointer(&mem[off])), 0)
	}
}

// Close unmaps all memory. No other method may run during or after Close;
// afterwards Alloc fails with ErrClosed, Bytes returns nil and Free does
// nothing.
func (s *Store) Close() error {
	if s.stopRefill != nil {
		// The prefaulter touches arenas without the lock: it must be gone
		// before they are unmapped.
		s.stopOnce.Do(func() { close(s.stopRefill) })
		<-s.refillDone
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed.Swap(true) {
		return nil
	}
	var errs []error
	if s.spare != nil {
		if err := unix.Munmap(s.spare); err != nil {
			errs = append(errs, fmt.Errorf("pagestore: munmap spare arena: %w", err))
		}
		s.spare = nil
	}
	for _, mem := range *s.arenas.Load() {
		if err := unix.Munmap(mem); err != nil {
			errs = append(errs, fmt.Errorf("pagestore: munmap arena: %w", err))
		}
	}
	s.arenas.Store(new([][]byte))
	s.memUsed.Store(0)
	return errors.Join(errs...)
}

// SetMemLimit changes the memory limit; 0 means unlimited. Objects already
// stored are kept even when they exceed a lowered limit, as in zram.
func (s *Store) SetMemLimit(n int64) { s.memLimit.Store(max(n, 0)) }

// ResetMemUsedMax sets MemUsedMax to the current MemUsed, like writing to
// zram's mem_used_max.
func (s *Store) ResetMemUsedMax() { s.memUsedMax.Store(s.memUsed.Load()) }

// Stats returns the counters. It reads only atomics.
func (s *Store) Stats() Stats {
	st := Stats{
		MemUsed:        s.memUsed.Load(),
		MemUsedMax:     s.memUsedMax.Load(),
		MemLimit:       s.memLimit.Load(),
		PagesCompacted: s.pagesCompacted.Load(),
		BadHandles:     s.badHandles.Load(),
		ReleaseErrors:  s.releaseErrors.Load(),
		PrefaultMisses: s.prefaultMisses.Load(),
	}
	for i := range s.classes {
		st.Objects += s.classes[i].objects.Load()
		st.ComprDataSize += s.classes[i].bytes.Load()
	}
	st.MetadataBytes = st.Objects*tagSize + s.nchunks.Load()*chunkSize*slabRecSize
	return st
}

// Alloc reserves an object of size bytes (1..MaxObjectSize) tagged with
// owner, and returns its handle and its bytes for the caller to fill. owner
// is what Compact passes back to relocate, at most MaxOwner. Alloc fails with ErrFull, changing nothing, when the object
// needs a page of memory that the limit does not allow.
func (s *Store) Alloc(size int, owner uint32) (Handle, []byte, error) {
	if size < 1 || size > MaxObjectSize {
		return 0, nil, fmt.Errorf("pagestore: object size %d out of range [1, %d]: %w", size, MaxObjectSize, syscall.EINVAL)
	}
	if owner > MaxOwner {
		return 0, nil, fmt.Errorf("pagestore: owner %#x above %#x: %w", owner, MaxOwner, syscall.EINVAL)
	}
	if s.closed.Load() {
		return 0, nil, ErrClosed
	}
	ci := classOf(size)
	c, g := &s.classes[ci], &s.geo[ci]
	c.mu.Lock()
	id, mem, slot, err := s.take(c, ci, true)
	if err != nil {
		c.mu.Unlock()
		return 0, nil, err
	}
	setOwner(mem, slot, owner)
	setDelta(mem, slot, byte(g.size-uint32(size)))
	c.objects.Add(1)
	c.bytes.Add(int64(size))
	c.mu.Unlock()
	off := objectAt(g, slot)
	return handle(id, slot), mem[off : off+uint32(size) : off+uint32(size)], nil
}

func handle(slab, slot uint32) Handle { return Handle(slab)<<slotBits | Handle(slot) }

// lookup checks that h names a slot of an existing slab and returns the
// slab and its memory. It does not say whether the slot is in use.
func (s *Store) lookup(h Handle) (id uint32, r *slabRec, mem []byte, slot uint32, ok bool) {
	if h>>slotBits >= Handle(s.nslabs.Load()) {
		return 0, nil, nil, 0, false
	}
	id, slot = uint32(h>>slotBits), uint32(h&slotMask)
	if id == 0 {
		return 0, nil, nil, 0, false
	}
	r = s.rec(id)
	g := &s.geo[r.class]
	arenas := *s.arenas.Load()
	if slot >= g.slots || int(r.arena) >= len(arenas) {
		return 0, nil, nil, 0, false
	}
	off := int(r.page) * pageSize
	return id, r, arenas[r.arena][off : off+int(g.pages)*pageSize], slot, true
}

// Bytes returns the bytes of the object h, size long as given to Alloc (a
// size beyond the object's class is clamped to it). They are valid until
// the object is freed or relocated. Bytes checks only that h names a slot
// of an existing slab, returning nil otherwise; it takes no lock.
func (s *Store) Bytes(h Handle, size int) []byte {
	_, r, mem, slot, ok := s.lookup(h)
	if !ok {
		return nil
	}
	g := &s.geo[r.class]
	n := uint32(min(max(size, 0), int(g.size)))
	off := objectAt(g, slot)
	return mem[off : off+n : off+n]
}

// Prefetch asks the CPU for the cache line of h's tag, which Free(h)
// reads and writes: a writer replacing h calls it before it compresses
// the new page, so that the cache miss (the old object is cold, on a
// random page) overlaps the compression. Any handle is accepted.
func (s *Store) Prefetch(h Handle) {
	if _, _, mem, slot, ok := s.lookup(h); ok {
		prefetch.Line(unsafe.Pointer(&mem[tagSize*slot]))
	}
}

// Free releases the object h. A handle that names no live object (never
// allocated, already freed, or from another store) is detected, counted in
// Stats.BadHandles and otherwise ignored; a stale handle whose slot holds
// a new object frees that object. A slab left empty gives its pages back
// to the kernel at once, except that each class keeps one that emptied
// holding at most two pages (Compact releases it).
func (s *Store) Free(h Handle) {
	id, r, mem, slot, ok := s.lookup(h)
	if !ok {
		s.badHandles.Add(1)
		return
	}
	c, g := &s.classes[r.class], &s.geo[r.class]
	c.mu.Lock()
	defer c.mu.Unlock()
	if r.state == slabEmpty || slot >= uint32(r.bump) || isFree(owner(mem, slot)) {
		s.badHandles.Add(1)
		return
	}
	size := g.size - uint32(delta(mem, slot))
	setOwner(mem, slot, freeTag|uint32(r.freeHead))
	r.freeHead = uint16(slot + 1)
	wasFull := uint32(r.live) == g.slots
	r.live--
	c.objects.Add(-1)
	c.bytes.Add(-int64(size))
	switch r.state {
	case slabActive:
		switch {
		case r.live == 0:
			if !wasFull {
				s.unlink(&c.partial, id)
			}
			switch {
			case c.cached == 0 && r.touched <= maxCachedPages:
				r.bump, r.freeHead, r.state = 0, 0, slabEmpty
				c.cached = id
			case s.prefault > 0 && s.keptEmpty.Add(int64(r.touched)) <= s.prefault/pageSize:
				// A swap daemon keeps emptied slabs resident for reuse,
				// up to Prefault bytes: pages given back now would fault
				// in again on the path that stores a swapped-out page,
				// maybe when the kernel has no page to give. Beyond that
				// they go back: the memory swap gave up must not stay
				// stranded in one size class.
				r.bump, r.freeHead, r.state = 0, 0, slabEmpty
				c.empty = append(c.empty, id)
			default:
				if s.prefault > 0 {
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
	}
}

// take hands out a free slot of class ci, from the most recently used slab
// with room, making a slab when grow is set and none has room. c.mu is held.
func (s *Store) take(c *class, ci int, grow bool) (id uint32, mem []byte, slot uint32, err error) {
	g := &s.geo[ci]
	id = c.partial
	if id == 0 {
		if !grow {
			return 0, nil, 0, ErrFull
		}
		// Spare making a slab that could not take even one object.
		if !s.fits(c, int64(pagesFor(objectAt(g, 1)))*pageSize) {
			return 0, nil, 0, ErrFull
		}
		if id, err = s.newSlab(c, ci); err != nil {
			return 0, nil, 0, err
		}
		s.push(&c.partial, id)
	}
	r := s.rec(id)
	slot, err = s.takeFrom(c, r, g, s.slabMem(r, g))
	if err != nil {
		if r.live == 0 {
			// A slab made just now: it holds no memory yet.
			s.unlink(&c.partial, id)
			r.state = slabEmpty
			c.empty = append(c.empty, id)
		}
		// The head slab needs a new page; another may have a free slot
		// in pages it already holds.
		for id = c.partial; id != 0; id = r.next {
			r = s.rec(id)
			if r.freeHead != 0 || pagesFor(objectAt(g, uint32(r.bump)+1)) <= uint32(r.touched) {
				slot, err = s.takeFrom(c, r, g, s.slabMem(r, g))
				break
			}
		}
		if err != nil {
			return 0, nil, 0, err
		}
	}
	if uint32(r.live) == g.slots {
		s.unlink(&c.partial, id)
	}
	return id, s.slabMem(r, g), slot, nil
}

// takeFrom hands out a slot of r: a freed one first, else the next never
// used one, reserving the page it reaches into.
func (s *Store) takeFrom(c *class, r *slabRec, g *geometry, mem []byte) (uint32, error) {
	var slot uint32
	if r.freeHead != 0 {
		slot = uint32(r.freeHead - 1)
		r.freeHead = uint16(owner(mem, slot) &^ freeTag)
	} else {
		slot = uint32(r.bump)
		need := pagesFor(objectAt(g, slot+1))
		if need > uint32(r.touched) {
			if err := s.reserve(c, int64(need-uint32(r.touched))*pageSize); err != nil {
				return 0, err
			}
			r.touched = uint16(need)
		}
		r.bump++
	}
	r.live++
	return slot, nil
}

func (s *Store) slabMem(r *slabRec, g *geometry) []byte {
	off := int(r.page) * pageSize
	return (*s.arenas.Load())[r.arena][off : off+int(g.pages)*pageSize]
}

// reserve counts n more bytes as held, failing if that exceeds the limit
// even after cached empty slabs are released. c.mu is held.
func (s *Store) reserve(c *class, n int64) error {
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
			for {
				m := s.memUsedMax.Load()
				if used+n <= m || s.memUsedMax.CompareAndSwap(m, used+n) {
					return nil
				}
			}
		}
	}
}

// newSlab returns an empty active slab for class ci: one the class used
// before, or a new one carved from an arena. c.mu is held.
func (s *Store) newSlab(c *class, ci int) (uint32, error) {
	if id := c.cached; id != 0 {
		c.cached = 0
		s.rec(id).state = slabActive
		return id, nil
	}
	if n := len(c.empty); n > 0 {
		// With prefaulting, slabs whose pages are resident (kept, or
		// faulted in again by warmReleased) are on top of the stack and
		// taken first. A released one below them is still taken before
		// new arena memory, although its pages fault in on this writer's
		// path (counted in PrefaultMisses): carving instead would let a
		// class that churns grow the arenas and slab records without
		// bound.
		id := c.empty[n-1]
		c.empty = c.empty[:n-1]
		r := s.rec(id)
		if s.prefault > 0 {
			s.keptEmpty.Add(-int64(r.touched))
			switch {
			case r.warm:
				r.warm = false
				s.wakePrefaulter() // to warm the class's next one
			case r.touched == 0:
				s.prefaultMisses.Add(int64(s.geo[ci].pages))
				s.wakePrefaulter()
			}
		}
		r.state = slabActive
		return id, nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed.Load() {
		return 0, ErrClosed
	}
	id := s.nslabs.Load()
	if id >= maxChunks*chunkSize {
		return 0, fmt.Errorf("pagestore: all %d slab records in use: %w", maxChunks*chunkSize, syscall.ENOSPC)
	}
	arena, page, err := s.carve(int(s.geo[ci].pages))
	if err != nil {
		return 0, err
	}
	chunk := s.ensureChunk(id >> chunkBits)
	chunk[id&chunkMask] = slabRec{arena: arena, page: page, class: uint16(ci), state: slabActive}
	s.nslabs.Store(id + 1)
	return id, nil
}

// ensureChunk returns slab record chunk i, creating it if need be. The
// prefaulter creates chunks ahead of newSlab, without s.mu.
func (s *Store) ensureChunk(i uint32) *slabChunk {
	if c := s.chunks[i].Load(); c != nil {
		return c
	}
	c := new(slabChunk)
	if s.chunks[i].CompareAndSwap(nil, c) {
		s.nchunks.Add(1)
		return c
	}
	return s.chunks[i].Load()
}

// carve takes pages contiguous pages from the last arena, mapping a new
// one when it has too few left. s.mu is held.
func (s *Store) carve(pages int) (arena, page uint32, err error) {
	arenas := *s.arenas.Load()
	if s.refill != nil {
		s.wakePrefaulter()
	}
	if len(arenas) == 0 || s.arenaNext+pages > s.arenaSize/pageSize {
		mem := s.spare
		if mem != nil {
			s.spare = nil
			s.faultedTo, s.spareFaulted = s.spareFaulted, 0
		} else {
			var err error
			if mem, err = mapArena(s.arenaSize); err != nil {
				return 0, 0, err
			}
			s.faultedTo = 0
		}
		next := make([][]byte, len(arenas)+1)
		copy(next, arenas)
		next[len(arenas)] = mem
		s.arenas.Store(&next)
		arenas, s.arenaNext = next, 0
	}
	page = uint32(s.arenaNext)
	s.arenaNext += pages
	if s.prefault > 0 && s.arenaNext > s.faultedTo {
		s.prefaultMisses.Add(int64(s.arenaNext - max(s.faultedTo, int(page))))
	}
	return uint32(len(arenas) - 1), page, nil
}

// fits reports whether n more bytes would fit within the limit, releasing
// cached empty slabs if that makes the difference. c.mu is held.
func (s *Store) fits(c *class, n int64) bool {
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
	queued := false
	if s.prefault > 0 {
		s.relMu.Lock()
		if len(s.releases) < cap(s.releases) {
			s.releases = append(s.releases, pendingRelease{id: id, class: r.class, pages: r.touched})
			queued = true
		}
		s.relMu.Unlock()
	}
	if !queued {
		if err := releasePages(mem[:held*pageSize]); err != nil {
			s.releaseErrors.Add(1)
		}
	}
	s.memUsed.Add(-held * pageSize)
	if compacted {
		s.pagesCompacted.Add(held)
	}
	// arena, page and class stay: Bytes and Free read them without a lock.
	r.prev, r.next, r.bump, r.live, r.freeHead, r.touched = 0, 0, 0, 0, 0, 0
	r.state = slabEmpty
	if queued {
		s.wakePrefaulter()
		return
	}
	s.pushEmpty(c, id)
}

// wakePrefaulter asks the prefaulter for a round now rather than at its
// next tick.
func (s *Store) wakePrefaulter() {
	select {
	case s.refill <- struct{}{}:
	default:
	}
}

// pushEmpty puts a slab whose pages were given back on its class's stack
// of empty slabs. c.mu is held.
func (s *Store) pushEmpty(c *class, id uint32) {
	if c.empty == nil {
		c.empty = make([]uint32, 0, 16)
	}
	c.empty = append(c.empty, id)
	if s.prefault > 0 {
		// Below the slabs that kept their pages: newSlab takes only those.
		copy(c.empty[1:], c.empty)
		c.empty[0] = id
	}
}
