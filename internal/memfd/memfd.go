// Package memfd holds memory in anonymous files (memfd_create) that a
// process maps shared and can hand to another: what gzramd keeps there
// outlives the process that wrote it, as long as someone holds the file.
//
// A File is sparse: it grows with Grow, a page costs memory from the first
// write into it until Punch gives it back, and pages never written cost
// nothing.
package memfd

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"
)

// File is a memfd. Its methods are safe for concurrent use; Close must
// come after every other call.
type File struct {
	f *os.File
	// grow makes Grow's look at the size and its ftruncate one step:
	// two Grows racing would otherwise let the smaller cut back what the
	// larger added, zeroing what was written there (a store's prefaulter
	// maps arenas while its writers do).
	grow sync.Mutex
}

// Create makes an empty memfd; name shows in /proc/PID/fd and maps as
// "/memfd:name". The descriptor is close-on-exec: a child gets it only
// when passed explicitly.
func Create(name string) (*File, error) {
	fd, err := unix.MemfdCreate(name, unix.MFD_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("memfd: create %q: %w", name, err)
	}
	return &File{f: os.NewFile(uintptr(fd), "memfd:"+name)}, nil
}

// Open takes over descriptor fd, which must be a memfd (one inherited or
// received from another process); the File owns it from then on, and
// makes it close-on-exec.
func Open(fd int) (*File, error) {
	target, err := os.Readlink(fmt.Sprintf("/proc/self/fd/%d", fd))
	if err != nil {
		return nil, fmt.Errorf("memfd: descriptor %d: %w", fd, err)
	}
	if !strings.HasPrefix(target, "/memfd:") {
		return nil, fmt.Errorf("memfd: descriptor %d is %s, not a memfd", fd, target)
	}
	name := strings.TrimSuffix(strings.TrimPrefix(target, "/"), " (deleted)")
	unix.CloseOnExec(fd)
	return &File{f: os.NewFile(uintptr(fd), name)}, nil
}

// Name is the name given to Create, with its "memfd:" prefix.
func (m *File) Name() string { return m.f.Name() }

// Fd is the descriptor, for passing on; it stays the File's.
func (m *File) Fd() int { return int(m.f.Fd()) }

// OSFile is the descriptor as an *os.File, for exec.Cmd.ExtraFiles and
// the like; it stays the File's, and closes with it.
func (m *File) OSFile() *os.File { return m.f }

// Size is the file's length.
func (m *File) Size() (int64, error) {
	var st unix.Stat_t
	if err := unix.Fstat(m.Fd(), &st); err != nil {
		return 0, fmt.Errorf("memfd: stat %s: %w", m.Name(), err)
	}
	return st.Size, nil
}

// Grow makes the file at least n bytes long. The new bytes read as zero
// and cost nothing until written.
func (m *File) Grow(n int64) error {
	m.grow.Lock()
	defer m.grow.Unlock()
	size, err := m.Size()
	if err != nil || size >= n {
		return err
	}
	if err := unix.Ftruncate(m.Fd(), n); err != nil {
		return fmt.Errorf("memfd: grow %s to %d bytes: %w", m.Name(), n, err)
	}
	return nil
}

// Truncate empties the file, giving back all its memory.
func (m *File) Truncate() error {
	if err := unix.Ftruncate(m.Fd(), 0); err != nil {
		return fmt.Errorf("memfd: truncate %s: %w", m.Name(), err)
	}
	return nil
}

// Map maps n bytes from offset off, shared: writes go to the file, and
// other processes mapping it see them. The file must already cover them
// (Grow); touching a page beyond its end raises SIGBUS. Transparent huge
// pages are refused so that one byte written costs one page.
func (m *File) Map(off int64, n int) ([]byte, error) {
	mem, err := unix.Mmap(m.Fd(), off, n, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_NORESERVE)
	if err != nil {
		return nil, fmt.Errorf("memfd: map %d bytes of %s at %d: %w", n, m.Name(), off, err)
	}
	_ = unix.Madvise(mem, unix.MADV_NOHUGEPAGE) // best effort: THP may be off
	return mem, nil
}

// Punch gives the pages of [off, off+n) back to the kernel; they read as
// zero afterwards and the file keeps its length. Unlike madvise on a
// mapping, this frees the memory for every process mapping the file, and
// works on pages mlock'd in any of them.
func (m *File) Punch(off, n int64) error {
	if n == 0 {
		return nil
	}
	if err := unix.Fallocate(m.Fd(), unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, off, n); err != nil {
		return fmt.Errorf("memfd: punch %d bytes of %s at %d: %w", n, m.Name(), off, err)
	}
	return nil
}

// Extents calls fn for each run of [off, off+n) of the file that holds
// pages (written, and not punched out since), in order, until fn returns
// false. The file may change meanwhile: a run may be stale by the time fn
// sees it.
func (m *File) Extents(fn func(off, n int64) bool) error {
	size, err := m.Size()
	if err != nil {
		return err
	}
	for off := int64(0); off < size; {
		data, err := unix.Seek(m.Fd(), off, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) {
			return nil // no data from off on
		}
		if err != nil {
			return fmt.Errorf("memfd: seeking data in %s from %d: %w", m.Name(), off, err)
		}
		hole, err := unix.Seek(m.Fd(), data, unix.SEEK_HOLE)
		if errors.Is(err, unix.ENXIO) {
			hole = size // truncated meanwhile
		} else if err != nil {
			return fmt.Errorf("memfd: seeking a hole in %s from %d: %w", m.Name(), data, err)
		}
		if hole <= data {
			return nil
		}
		if !fn(data, hole-data) {
			return nil
		}
		off = hole
	}
	return nil
}

// Close closes the descriptor. Mappings stay valid until unmapped, and the
// memory stays until no process holds the file or a mapping of it.
func (m *File) Close() error {
	if err := m.f.Close(); err != nil && !errors.Is(err, os.ErrClosed) {
		return fmt.Errorf("memfd: close %s: %w", m.Name(), err)
	}
	return nil
}

// Populate faults in every page of mem, a mapping of a File or any
// other, without changing a byte: MAP_POPULATE would not do, as it does
// nothing under mlockall(MCL_ONFAULT).
//
// In a system call where the kernel allows it (MADV_POPULATE_WRITE, Linux
// 5.14): a thread faulting in Go code cannot be stopped by the runtime,
// so a fault that waits on reclaim would hold up every stop-the-world
// (each garbage collection has two) and with it every goroutine, the
// ones storing swapped pages included; a thread in a system call does
// not. Elsewhere, with an atomic add of zero per page, which changes no
// byte another thread wrote.
//
// Where the kernel refuses for another reason than not knowing the
// advice (EFAULT or ENOMEM: a page past the file's end, or one it cannot
// allocate), it leaves mem as it is: touching such a page would be a
// SIGBUS, which kills the daemon (seen once in make test, the prefaulter
// populating a store's arena as the test recovered it).
func Populate(mem []byte) {
	if len(mem) == 0 {
		return
	}
	if err := unix.Madvise(mem, unix.MADV_POPULATE_WRITE); err != unix.EINVAL {
		return
	}
	for off := 0; off+4 <= len(mem); off += os.Getpagesize() {
		atomic.AddUint32((*uint32)(unsafe.Pointer(&mem[off])), 0)
	}
}

// CreateAll creates one file for each suffix, named prefix-suffix, or
// none (an error closes those made).
func CreateAll(prefix string, suffixes ...string) ([]*File, error) {
	files := make([]*File, 0, len(suffixes))
	for _, s := range suffixes {
		f, err := Create(prefix + "-" + s)
		if err != nil {
			CloseAll(files...)
			return nil, err
		}
		files = append(files, f)
	}
	return files, nil
}

// CloseAll closes every file that is not nil.
func CloseAll(files ...*File) error {
	var errs []error
	for _, f := range files {
		if f != nil {
			errs = append(errs, f.Close())
		}
	}
	return errors.Join(errs...)
}
