// The store: configuration, statistics, the memory limit and reservations.

package pagestore

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// Handle names a stored allocation. 0 is never a valid handle. Handles are
// below 1<<HandleBits: a slab number shifted left by 12 bits, or'ed with a
// cell.
type Handle uint64

// HandleBits bounds handles: a page table entry keeps one in that many bits.
const HandleBits = 36

var _ [1<<HandleBits - maxSlabs<<cellBits]byte // every handle fits

var (
	// ErrFull reports that storing would exceed the memory limit.
	ErrFull = fmt.Errorf("pagestore: memory limit reached: %w", syscall.ENOSPC)
	// ErrClosed reports use of a closed store.
	ErrClosed = errors.New("pagestore: store is closed")
	// ErrNotPrefaulted reports that storing needed memory the prefaulter
	// had not faulted in yet, and did not within PrefaultWait (see
	// Config.Prefault). Like ErrFull, it changes nothing; a swap write
	// that fails so leaves the page with the kernel.
	ErrNotPrefaulted = fmt.Errorf("pagestore: no prefaulted memory ready: %w", syscall.ENOSPC)
)

// DefaultArenaSize is the size of each arena when Config.ArenaSize is 0.
const DefaultArenaSize = 64 << 20

// Config sets up a Store.
type Config struct {
	// MemLimit is the number of bytes of slab memory the store may hold;
	// 0 means unlimited.
	MemLimit int64
	// ArenaSize is the number of bytes mapped at a time, from which slabs
	// are carved; 0 means DefaultArenaSize. It is rounded up to whole pages
	// and to the largest slab (about 1 MiB). Recover needs the size the
	// store was made with.
	ArenaSize int
	// Files, when set, are the files the store keeps its memory in: empty
	// for New, a store's for Recover. The store leaves them open at Close.
	// When nil, New makes its own and closes them at Close.
	Files *Files
	// Prefault, when positive, keeps this many bytes of not yet carved
	// arena memory faulted in ahead of use, by a thread of its own, and
	// no allocation faults store memory in: one that needs memory the
	// prefaulter has not faulted in yet waits for it, up to PrefaultWait,
	// and then fails with ErrNotPrefaulted. A swap daemon needs this: a
	// page fault on the path that stores a swapped-out page may need
	// memory the kernel can only get by swapping to this very store. 0
	// leaves arenas to fault lazily, on the allocating thread.
	Prefault int64
	// PrefaultQuiet is how long the store must carve no memory before
	// the pages held ahead shrink to half of Prefault, given back until
	// writes come again (0: DefaultPrefaultQuiet).
	PrefaultQuiet time.Duration
}

// DefaultPrefaultQuiet is Config.PrefaultQuiet's default: longer than the
// pauses within a burst of swap-out.
const DefaultPrefaultQuiet = 5 * time.Second

// PrefaultWait is the longest an allocation waits for the prefaulter
// (Config.Prefault) before it fails with ErrNotPrefaulted. A step of the
// prefaulter takes microseconds, or milliseconds under memory pressure;
// one that takes longer is waiting on reclaim, which may be waiting on
// this very store's writes, and every allocation fails at once, without
// waiting, until it makes memory ready again.
const PrefaultWait = time.Second

// Stats are the store's counters, with kernel zram's meanings where zram
// has the same figure.
type Stats struct {
	ComprDataSize  int64 // sum of live allocations' sizes (compr_data_size)
	MemUsed        int64 // bytes of slab memory held, and Reserved (mem_used_total)
	Reserved       int64 // bytes counted by Reserve for allocations not yet stored
	MemUsedMax     int64 // high-water mark of MemUsed (mem_used_max)
	MemLimit       int64 // 0 = unlimited (mem_limit)
	Allocations    int64 // live allocations
	PagesCompacted int64 // 4 KiB pages given back by compaction, cumulative (pages_compacted)
	// MetadataBytes is what the store spends to keep track of allocations:
	// each live allocation's 5-byte tag (owner and exact size, held inside the
	// slabs and so also part of MemUsed) plus the slab records.
	MetadataBytes int64
	// BadHandles counts Free calls with a handle that names no live allocation.
	BadHandles int64
	// ReleaseErrors counts failures to give an empty slab's pages back to
	// the kernel (the pages stay mapped and are reused).
	ReleaseErrors int64
	// PrefaultMisses counts the times an allocation needed a new slab
	// when the prefaulter had faulted in no memory for one
	// (Config.Prefault > 0): writers outran the prefaulter, or it was
	// starved of memory. Each waited for it, and failed with
	// ErrNotPrefaulted where it did not come within PrefaultWait.
	PrefaultMisses int64
}

// Store keeps allocations of 1..4096 bytes in slabs outside the Go heap.
//
// Alloc, Bytes, Free and Compact are safe for concurrent use; each size
// class has its own lock, and the only lock shared by all classes is taken
// when a class needs a slab it has never had before.
type Store struct {
	geo     [allClasses]geometry
	classes [allClasses]class

	mapping                // the files, and the records and arenas mapped from them
	ownFiles bool          // New made the files: Close closes them
	nslabs   atomic.Uint32 // slabs [1, nslabs) exist; 0 is never used
	closed   atomic.Bool

	memUsed        atomic.Int64 // slab memory held, and reserved
	memUsedMax     atomic.Int64
	reserved       atomic.Int64 // of memUsed: Reserve's, not slab memory
	memLimit       atomic.Int64
	pagesCompacted atomic.Int64
	badHandles     atomic.Int64
	releaseErrors  atomic.Int64
	prefaultMisses atomic.Int64
	// keptEmpty counts the pages of emptied slabs kept resident for
	// reuse (Prefault > 0), at most Prefault bytes' worth.
	keptEmpty atomic.Int64
	// warmEmpty counts the pages of empty slabs that hold no allocation
	// yet are resident: released ones the prefaulter faulted in again,
	// and new ones a failed Alloc put back. Beside keptEmpty, within
	// Prefault: they are not in memUsed.
	warmEmpty atomic.Int64

	mu        sync.Mutex // guards arena carving, slab creation and Close
	arenaNext int        // first uncarved page of the last arena

	compactor compactor

	// pf faults arena memory in ahead of carve and gives emptied slabs'
	// pages back (Config.Prefault); its spare arena and fault mark are
	// carve's too, under mu.
	pf prefaulter
}

// class is a size class's mutable state. It is padded so that two classes'
// locks never share a cache line.
type class struct {
	mu       sync.Mutex
	partial  uint32 // active slabs with a free cell
	draining uint32
	empty    []uint32 // slabs of this class holding no memory, for reuse
	// cached is a slab that emptied while small and kept its pages, so
	// that a class whose last allocation comes and goes does not pay for
	// madvise, a TLB shootdown and page faults each time. Compact, Close
	// and a limit that would fail an Alloc release it.
	cached uint32
	// wantWarm counts the slabs writers carved, with a prefaulter,
	// because the class's empty slabs had their pages given back: the
	// prefaulter faults as many of those in again for the next
	// (warmReleased).
	wantWarm    int
	allocations atomic.Int64
	bytes       atomic.Int64
	_           [64]byte
}

// New creates an empty store. It maps its slab records, and no other
// memory until the first Alloc.
func New(cfg Config) (*Store, error) {
	s, err := configure(cfg)
	if err != nil {
		return nil, err
	}
	if err := s.mapSlabs(true); err != nil {
		s.Close()
		return nil, err
	}
	s.pf.start()
	return s, nil
}

// configure checks cfg and sets up a store with no memory mapped yet.
func configure(cfg Config) (*Store, error) {
	if cfg.MemLimit < 0 {
		return nil, fmt.Errorf("pagestore: negative memory limit %d", cfg.MemLimit)
	}
	if cfg.ArenaSize < 0 {
		return nil, fmt.Errorf("pagestore: negative arena size %d", cfg.ArenaSize)
	}
	s := &Store{}
	s.arenaSize = cfg.ArenaSize
	s.compactor.s = s
	if cfg.Files != nil {
		if cfg.Files.Arenas == nil || cfg.Files.Slabs == nil {
			return nil, errors.New("pagestore: Config.Files needs both files")
		}
		s.files = *cfg.Files
	} else {
		files, err := NewFiles("gzramd-store")
		if err != nil {
			return nil, err
		}
		s.files, s.ownFiles = files, true
	}
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
	s.pf = prefaulter{s: s, prefault: max(cfg.Prefault, 0), quiet: cfg.PrefaultQuiet, touching: pageRange{arena: -1}, largest: largest / pageSize}
	if s.pf.quiet <= 0 {
		s.pf.quiet = DefaultPrefaultQuiet
	}
	return s, nil
}

// Close unmaps all memory, and closes the files if the store made them
// (given ones stay open, their contents intact for Recover). No other
// method may run during or after Close; afterwards Alloc fails with
// ErrClosed, Bytes returns nil and Free does nothing.
func (s *Store) Close() error {
	s.pf.stop()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed.Swap(true) {
		return nil
	}
	s.nslabs.Store(0) // Bytes and Free find no slab now
	errs := []error{s.pf.unmapSpare(), s.unmapAll()}
	if s.ownFiles {
		errs = append(errs, s.files.Close())
	}
	s.memUsed.Store(0)
	return errors.Join(errs...)
}

// SetMemLimit changes the memory limit; 0 means unlimited. Allocations already
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
		Reserved:       s.reserved.Load(),
		PagesCompacted: s.pagesCompacted.Load(),
		BadHandles:     s.badHandles.Load(),
		ReleaseErrors:  s.releaseErrors.Load(),
		PrefaultMisses: s.prefaultMisses.Load(),
	}
	for i := range s.classes {
		st.Allocations += s.classes[i].allocations.Load()
		st.ComprDataSize += s.classes[i].bytes.Load()
	}
	st.MetadataBytes = st.Allocations*tagSize + int64(s.nslabs.Load())*slabRecSize
	return st
}
