// Keeping the state's pages locked in memory while no serving process does.

package supervise

import (
	"errors"
	"fmt"

	"golang.org/x/sys/unix"

	"github.com/gzramd/gzramd/internal/memfd"
)

// Keeper locks the pages of a set of memfds in memory while no serving
// process does.
//
// A serving process locks the pages it maps (mlockall), but when it dies
// they are unlocked, and under memory pressure the kernel may swap them
// out — to the very device they back, whose server is gone: the next one
// would then fault on its own memory, waiting on itself. When a serving
// process dies, the supervisor has the Keeper lock the runs of the files
// that hold pages in its own mapping. Locking maps pages already in
// memory and allocates none (holes are skipped); with no serving process
// running, no hole can open under it. The window between the death and
// the lock is closed only by the unit's MemorySwapMax=0, which keeps
// every page charged to gzramd's cgroup, these included, off swap.
//
// The supervisor's locks go on holding the pages once the next process
// runs; they do not keep that process from giving pages back (punching
// holes frees locked pages too).
type Keeper struct {
	files []*memfd.File
	maps  [][]byte // each file's mapping, as long as the file was at the last Lock
}

// NewKeeper returns a Keeper of files; it maps them at the first Lock.
func NewKeeper(files []*memfd.File) *Keeper {
	return &Keeper{files: files, maps: make([][]byte, len(files))}
}

// Lock locks every run of the files that holds pages, and returns how
// many bytes that is. A file that grew since the last Lock is mapped
// again, whole.
func (k *Keeper) Lock() (int64, error) {
	var held int64
	var errs []error
	for i, f := range k.files {
		size, err := f.Size()
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if int64(len(k.maps[i])) < size {
			if k.maps[i] != nil {
				unix.Munmap(k.maps[i])
				k.maps[i] = nil
			}
			mem, err := unix.Mmap(f.Fd(), 0, int(size), unix.PROT_READ, unix.MAP_SHARED|unix.MAP_NORESERVE)
			if err != nil {
				errs = append(errs, fmt.Errorf("supervise: mapping %s to keep it locked: %w", f.Name(), err))
				continue
			}
			k.maps[i] = mem
		}
		mem := k.maps[i]
		err = f.Extents(func(off, n int64) bool {
			n = min(n, int64(len(mem))-off)
			if n <= 0 {
				return false
			}
			if err := unix.Mlock(mem[off : off+n]); err != nil {
				errs = append(errs, fmt.Errorf("supervise: locking %d bytes of %s at %d: %w", n, f.Name(), off, err))
				return false
			}
			held += n
			return true
		})
		errs = append(errs, err)
	}
	return held, errors.Join(errs...)
}

// Close unmaps the files (they stay open: they are the caller's).
func (k *Keeper) Close() error {
	var errs []error
	for _, mem := range k.maps {
		if mem != nil {
			errs = append(errs, unix.Munmap(mem))
		}
	}
	k.maps = nil
	return errors.Join(errs...)
}
