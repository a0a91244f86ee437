// The files a store keeps its memory in: arenas, slab records, and their header.

package pagestore

import (
	"encoding/binary"
	"errors"
	"fmt"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/gzramd/gzramd/internal/memfd"
)

// Files are the memfds a store keeps its memory in, so that another
// process given them can take the store over (Recover). A store given
// Files leaves them open at Close, for the caller to keep or hand on; a
// store that made its own closes them.
type Files struct {
	// Arenas holds the slabs: arena k at offset k × the arena size.
	Arenas *memfd.File
	// Slabs holds a header and then one record per slab.
	Slabs *memfd.File
}

// NewFiles makes empty files for a store; name prefixes theirs.
func NewFiles(name string) (Files, error) {
	fs, err := memfd.CreateAll(name, "arenas", "slabs")
	if err != nil {
		return Files{}, err
	}
	return Files{Arenas: fs[0], Slabs: fs[1]}, nil
}

// Close closes both files.
func (f Files) Close() error { return memfd.CloseAll(f.Arenas, f.Slabs) }

// The slab file starts with a header where record 0 would be (slab 0 is
// never used): what a later process must agree on to read the rest.
const (
	slabsMagic   = 0x7362616c_73727a67 // "gzrslabs"
	slabsVersion = 1                   // bump on any change to slabRec, the tags or the classes
)

type slabsHeader struct {
	magic     uint64
	version   uint32
	recSize   uint32
	arenaSize uint64
	classes   uint32
	_         uint32
}

var _ [slabRecSize - int64(unsafe.Sizeof(slabsHeader{}))]byte // the header fits in record 0

// ErrLayout reports files written by a store whose layout this one does
// not read (another version of gzramd, or not a store's files at all).
var ErrLayout = errors.New("pagestore: files of another layout")

// mapping is the store's files as mapped: the slab records, and the
// arenas slabs are carved from, one mapping each. Only the arenas change
// once the store is set up, and carve, under the store's mu, is what adds
// one.
type mapping struct {
	files     Files
	arenaSize int
	recs      []slabRec // mapped from files.Slabs; recs[0] is the header
	// arenas is replaced, never modified, when an arena is added, so that
	// Bytes reads it without a lock.
	arenas atomic.Pointer[[][]byte]
}

// mapSlabs maps the slab file's records, writing its header when the file
// is new (fresh) and checking it otherwise.
func (m *mapping) mapSlabs(fresh bool) error {
	size := maxSlabs * slabRecSize
	if fresh {
		if n, err := m.files.Slabs.Size(); err != nil {
			return err
		} else if n != 0 {
			return fmt.Errorf("pagestore: new store on a slab file of %d bytes, not empty (Recover adopts one)", n)
		}
		if err := m.files.Slabs.Grow(size); err != nil {
			return err
		}
	} else if n, err := m.files.Slabs.Size(); err != nil {
		return err
	} else if n != size {
		return fmt.Errorf("pagestore: slab file of %d bytes, not %d: %w", n, size, ErrLayout)
	}
	mem, err := m.files.Slabs.Map(0, int(size))
	if err != nil {
		return err
	}
	m.recs = unsafe.Slice((*slabRec)(unsafe.Pointer(&mem[0])), maxSlabs)
	h := m.header()
	want := slabsHeader{magic: slabsMagic, version: slabsVersion, recSize: uint32(slabRecSize),
		arenaSize: uint64(m.arenaSize), classes: allClasses}
	if fresh {
		*h = want
		return nil
	}
	// Builds before lifetimes wrote the short-lived classes alone: their
	// state is this layout's with no long-lived slab yet. It stays
	// marked so until one is made (markLong), so that such a build may
	// still take it over until then.
	before := want
	before.classes = numClasses
	if *h != want && *h != before {
		var magic [8]byte
		binary.LittleEndian.PutUint64(magic[:], h.magic)
		return fmt.Errorf("pagestore: slab file %q version %d (records of %d bytes, arenas of %d, %d classes), this build reads %d (%d, %d, %d): %w",
			magic[:], h.version, h.recSize, h.arenaSize, h.classes, want.version, want.recSize, want.arenaSize, want.classes, ErrLayout)
	}
	return nil
}

// header is the slab file's header.
// recordBytes is the memory the slab records are mapped in.
func (m *mapping) recordBytes() []byte {
	return unsafe.Slice((*byte)(unsafe.Pointer(&m.recs[0])), maxSlabs*slabRecSize)
}

func (m *mapping) header() *slabsHeader { return (*slabsHeader)(unsafe.Pointer(&m.recs[0])) }

// markLong marks the slab file as holding long-lived slabs, before the
// first is sealed: a build before lifetimes refuses it from then on.
func (m *mapping) markLong() {
	if h := m.header(); h.classes != allClasses {
		h.classes = allClasses
	}
}

// mapArena maps arena k of the arena file, growing the file to hold it.
// The mapping is lazy: untouched pages cost nothing.
func (m *mapping) mapArena(k int) ([]byte, error) {
	off := int64(k) * int64(m.arenaSize)
	if err := m.files.Arenas.Grow(off + int64(m.arenaSize)); err != nil {
		return nil, err
	}
	return m.files.Arenas.Map(off, m.arenaSize)
}

// releasePages gives pages of slab r's memory (mem, a part of its
// arena's mapping) back to the kernel; they read as zero when touched
// again.
//
// A hole punched in the arena file frees them for every process that maps
// it, locked (the daemon runs under mlockall) or not, and takes neither
// the process's mmap lock nor a fault: unlike munlock and madvise, it
// never waits behind a thread faulting in reclaim.
func (m *mapping) releasePages(r *slabRec, mem []byte) error {
	if len(mem) == 0 {
		return nil
	}
	arena := (*m.arenas.Load())[r.arena]
	at := uintptr(unsafe.Pointer(&mem[0])) - uintptr(unsafe.Pointer(&arena[0]))
	return m.files.Arenas.Punch(int64(r.arena)*int64(m.arenaSize)+int64(at), int64(len(mem)))
}

// unmapAll unmaps the arenas and the records. The store's mu is held.
func (m *mapping) unmapAll() error {
	var errs []error
	for _, mem := range *m.arenas.Load() {
		if err := unix.Munmap(mem); err != nil {
			errs = append(errs, fmt.Errorf("pagestore: munmap arena: %w", err))
		}
	}
	m.arenas.Store(new([][]byte))
	if m.recs != nil {
		if err := unix.Munmap(m.recordBytes()); err != nil {
			errs = append(errs, fmt.Errorf("pagestore: munmap slab records: %w", err))
		}
		m.recs = nil
	}
	return errors.Join(errs...)
}
