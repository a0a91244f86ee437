// Mapping arenas and giving slab pages back to the kernel.

package pagestore

import (
	"errors"
	"fmt"
	"unsafe"

	"golang.org/x/sys/unix"
)

// DefaultArenaSize is the size of each mmap'd arena when Config.ArenaSize is 0.
const DefaultArenaSize = 64 << 20

// mapArena reserves an arena. The mapping is lazy (MAP_NORESERVE, untouched
// pages cost nothing), and transparent huge pages are refused so that
// touching one object does not fault in 2 MiB and slab accounting in pages
// matches what the kernel actually holds.
func mapArena(size int) ([]byte, error) {
	mem, err := unix.Mmap(-1, 0, size, unix.PROT_READ|unix.PROT_WRITE,
		unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_NORESERVE)
	if err != nil {
		return nil, fmt.Errorf("pagestore: mmap arena of %d bytes: %w", size, err)
	}
	_ = unix.Madvise(mem, unix.MADV_NOHUGEPAGE) // best effort: THP may be off or unsupported
	return mem, nil
}

// releasePages gives a slab's pages back to the kernel; the mapping stays,
// and the pages read as zero when touched again.
//
// The daemon runs under mlockall, and MADV_DONTNEED refuses locked pages
// (EINVAL). Then the range is unlocked, dropped, and locked again on fault
// (mlock2 MLOCK_ONFAULT) so that reused slabs stay unswappable without being
// populated now.
func releasePages(mem []byte) error {
	if len(mem) == 0 {
		return nil
	}
	err := unix.Madvise(mem, unix.MADV_DONTNEED)
	if !errors.Is(err, unix.EINVAL) {
		return err
	}
	if err := unix.Munlock(mem); err != nil {
		return fmt.Errorf("pagestore: munlock slab: %w", err)
	}
	if err := unix.Madvise(mem, unix.MADV_DONTNEED); err != nil {
		return fmt.Errorf("pagestore: madvise slab: %w", err)
	}
	_, _, errno := unix.Syscall(unix.SYS_MLOCK2, uintptr(unsafe.Pointer(&mem[0])), uintptr(len(mem)), unix.MLOCK_ONFAULT)
	if errno != 0 {
		return fmt.Errorf("pagestore: mlock2 slab: %w", errno)
	}
	return nil
}
