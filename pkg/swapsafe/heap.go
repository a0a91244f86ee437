package swapsafe

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"runtime/debug"

	"golang.org/x/sys/unix"
)

// HeapReserve is Go heap kept resident for the daemon's own allocations.
// It must stay reachable (KeepAlive) for as long as the process serves.
type HeapReserve struct {
	ballast []byte
}

// KeepAlive keeps the reserve's pacing in effect up to this call.
func (r *HeapReserve) KeepAlive() { runtime.KeepAlive(r.ballast) }

// gcPercentWithReserve is GOGC while a reserve is held: the heap grows by
// this share of ballast + live heap, about the reserve, between
// collections.
const gcPercentWithReserve = 10

// ReserveHeap faults in up to n bytes of Go heap (less on a machine with
// under 40n of RAM) and arranges that the runtime keeps them. It must run
// after mlockall.
//
// Under mlockall the runtime cannot give free heap pages back with
// madvise (the kernel refuses locked pages), so its scavenger maps fresh
// memory over them instead: the next allocation there faults, and a swap
// daemon faulting while the kernel waits for it to store swapped pages
// freezes the machine. The scavenger keeps free memory of up to 10 % of
// the heap in use after a collection, so a ballast of ten times n, a
// pointer-free allocation that is never touched and so costs address
// space but no memory, lets it keep the n bytes; GOGC 10 starts a
// collection before the heap grows past them into fresh memory.
//
// The memory limit, if one is set, is raised by the ballast. GOGC from
// the environment wins over the pacing, like GOMEMLIMIT.
func ReserveHeap(n int64) (*HeapReserve, Step) {
	s := Step{Name: "heap_reserve"}
	if n <= 0 {
		s.Done = "none"
		return &HeapReserve{}, s
	}
	// The kernel refuses one mapping larger than RAM and swap (and, with
	// strict overcommit, charges it): a quarter of RAM at most.
	var si unix.Sysinfo_t
	if err := unix.Sysinfo(&si); err == nil {
		if limit := int64(si.Totalram) * int64(si.Unit) / 4 / 10; n > limit {
			n = limit &^ (1<<20 - 1)
		}
	}
	if n < 1<<20 {
		s.Err = errors.New("less than 40 MiB of RAM: no room for a ballast")
		return &HeapReserve{}, s
	}
	// The ballast first: placed after the warm chunks, it could cover
	// their pages once they are free.
	r := &HeapReserve{ballast: make([]byte, 10*n)}
	const chunk = 1 << 20
	warm := make([][]byte, 0, n/chunk)
	for range n / chunk {
		b := make([]byte, chunk)
		for i := 0; i < len(b); i += 4096 {
			b[i] = 1
		}
		warm = append(warm, b)
	}
	runtime.KeepAlive(warm)
	warm = nil
	if limit := debug.SetMemoryLimit(-1); limit < 1<<62 {
		debug.SetMemoryLimit(limit + 10*n)
	}
	gogc := gcPercentWithReserve
	if v := os.Getenv("GOGC"); v != "" {
		gogc = debug.SetGCPercent(-1)
		debug.SetGCPercent(gogc)
		s.Hint = "GOGC from the environment overrides the pacing"
	} else {
		debug.SetGCPercent(gogc)
	}
	// Frees the warm chunks and sets the scavenger's goal from a heap in
	// use that counts the ballast.
	runtime.GC()
	s.Done = fmt.Sprintf("%d MiB faulted in and kept (a %d MiB untouched ballast paces GC at GOGC %d)", n>>20, 10*n>>20, gogc)
	return r, s
}
