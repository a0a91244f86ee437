// The Go heap kept resident and locked while serving swap.

package swapsafe

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"os"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/gzramd/gzramd/internal/osthread"
)

// HeapReserve is Go heap kept resident for the daemon's own allocations.
// It must stay reachable (KeepAlive) for as long as the process serves.
type HeapReserve struct {
	ballast []byte
	n       int64 // bytes faulted in and kept free
	// free is the heap's free memory once TopUp has faulted it in and
	// locked it: the reserve, and what the heap may grow by before its
	// next collection.
	free atomic.Int64

	// LockHeap's, allocated on its first call and reused: it runs every
	// 250 ms on a thread that may fault, and a fault in Go code (clearing
	// a fresh span for a new allocation) holds up every stop-the-world,
	// and with it every goroutine, for as long as reclaim takes.
	lockMu   sync.Mutex
	large    []byte    // the probe for large objects' mappings
	maps     []byte    // /proc/self/maps
	mappings []mapping // parsed from maps
	resident []byte    // mincore's vector
	calls    int       // LockHeap calls so far
}

// fullLockEvery is how often LockHeap mlocks the whole heap, not only its
// pages that are not resident: every 16th call, 4 s at the daemon's
// 250 ms. mlock walks every page of the range it is given, a few ms a
// call on a heap of 100 MiB, and an idle daemon spent 2.5 % of a CPU so.
const fullLockEvery = 16

// Bytes is the heap faulted in and kept free: the reserve (less than
// asked for on a small machine), and once TopUp has run, all the free
// heap it made resident.
func (r *HeapReserve) Bytes() int64 { return max(r.n, r.free.Load()) }

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
	r := &HeapReserve{ballast: make([]byte, 10*n), n: n}
	warm := touchedChunks(n, 1<<20)
	runtime.KeepAlive(warm)
	warm = nil
	// The small objects reuse the chunks' pages, now free.
	runtime.GC()
	warmSpans(n)
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

// GiveBack returns the free heap, the reserve with it, to the kernel,
// and keeps what costs no memory: the ballast's pacing and the span
// records ReserveHeap made. A standby holds its reserve so until it
// takes over, when TopUp faults the free heap in again: held from the
// standby's start, it cost every idle daemon 10 MiB, and bought a
// takeover little, for TopUp releases the free heap and faults it in
// again anyway, and the process that died has by then given back more
// than that, its address space gone before the standby is let go.
func (r *HeapReserve) GiveBack() {
	// Under mlockall the runtime maps fresh memory over the free pages
	// (it cannot madvise locked ones), and the kernel frees the old.
	debug.FreeOSMemory()
}

// touchedChunks allocates total bytes in chunks of size and writes every
// page of them, so that the pages are resident when the chunks are freed.
func touchedChunks(total, size int64) [][]byte {
	chunks := make([][]byte, 0, total/size)
	for range total / size {
		b := make([]byte, size)
		for i := 0; i < len(b); i += 4096 {
			b[i] = 1
		}
		chunks = append(chunks, b)
	}
	return chunks
}

// warmSpans allocates about n bytes in objects of every small size, with
// and without pointers, and lets them go. The runtime describes each span
// of small objects with records it allocates from fresh memory and never
// gives back, only reuses: records made here, while memory is plentiful,
// are the ones later spans reuse.
func warmSpans(n int64) {
	sizes := make([]int, 0, 80)
	for size := 8; size <= 32<<10; size += max(8, size/8) {
		sizes = append(sizes, size)
	}
	per := n / int64(2*len(sizes))
	keep := make([]any, 0, 1<<16)
	for _, size := range sizes {
		for range max(1, per/int64(size)) {
			keep = append(keep, make([]byte, size))
			keep = append(keep, make([]*byte, max(1, size/8)))
		}
	}
	runtime.KeepAlive(keep)
}

// ReserveThreads makes the runtime start n threads now and keep them idle,
// so that when requests block in system calls or C the threads to run the
// others already exist: starting one maps and faults in a new stack.
func ReserveThreads(n int) Step {
	s := Step{Name: "thread_reserve"}
	release := make(chan struct{})
	var started, done sync.WaitGroup
	started.Add(n)
	done.Add(n)
	for range n {
		go func() {
			defer done.Done()
			// A locked goroutine that blocks keeps its thread to
			// itself, so each of these holds a thread of its own.
			runtime.LockOSThread()
			// A signal to itself writes the thread's first signal
			// frame now: the alternate signal stack is fresh memory,
			// and the runtime signals threads to preempt them. Go
			// ignores a preemption signal it did not ask for.
			_ = unix.Tgkill(unix.Getpid(), unix.Gettid(), unix.SIGURG)
			started.Done()
			<-release
			// Unlocked before it ends: a goroutine that exits locked
			// takes its thread with it.
			runtime.UnlockOSThread()
		}()
	}
	started.Wait()
	close(release)
	done.Wait()
	s.Done = fmt.Sprintf("%d threads started and kept idle", n)
	return s
}

// TopUp faults in every free page of the heap, and more if the heap will
// grow by more than that before its next collection, and then the reserve
// again as one free range above the rest, as ReserveHeap did at start.
// It belongs after start-up, just before the daemon becomes swap:
// start-up allocations (buffers, tables) have taken pages
// of the reserve by then, and the heap has free pages ReserveHeap never
// touched; the first allocation to land on one while serving would fault.
func (r *HeapReserve) TopUp() Step {
	s := Step{Name: "heap_top_up"}
	if r == nil || r.n == 0 {
		s.Done = "none"
		return s
	}
	samples := []metrics.Sample{
		{Name: "/memory/classes/heap/free:bytes"},
		{Name: "/memory/classes/heap/released:bytes"},
		{Name: "/gc/heap/goal:bytes"},
		{Name: "/memory/classes/heap/objects:bytes"},
	}
	var v [4]int64
	readBytes(samples, v[:])
	free, growth := v[0]+v[1], v[2]-v[3]
	// The heap grows by up to growth before the next collection: that
	// many bytes must be resident and free, and every free page is, so
	// that none of them is touched for the first time while serving. In
	// page-sized pieces, so that they fill the small gaps between spans
	// in use too.
	const chunk = 8 << 10
	total := (max(free, growth) + chunk - 1) / chunk * chunk
	warm := touchedChunks(total, chunk)
	// And the reserve in one piece at the top of the heap: the heap's
	// next growth, for a span larger than any gap, lands in it instead of
	// in memory mapped fresh while serving.
	top := touchedChunks(r.n, r.n)
	runtime.KeepAlive(warm)
	runtime.KeepAlive(top)
	warm, top = nil, nil
	// The runtime counts the pages just freed as free and resident, more
	// than the 10 % over the heap in use that its scavenger lets it keep,
	// so the scavenger would release the excess, from the highest address
	// down: the reserve at the top, mapped fresh again, where the next
	// stack or span lands and faults before gzramd-heaplock faults it back
	// in. Released now, all of it, and faulted in again by LockHeap below,
	// the pages count as released, which the scavenger never touches.
	// (TestServingDoesNotFault failed 58 runs of 850 without it:
	// a stack span of 32 KiB, 8 faults; none in 450 with it.)
	debug.FreeOSMemory()
	locked, err := r.LockHeap()
	if err != nil {
		s.Err = err
		return s
	}
	// What is free now is resident and locked: held for swap safety.
	readBytes(samples[:2], v[:2])
	held := v[0] + v[1]
	r.free.Store(held)
	s.Done = fmt.Sprintf("%d MiB of heap mappings locked, %d MiB of it free: %d MiB faulted in (the heap had %d MiB free and grows by %d MiB before its next collection) and the %d MiB reserve above it",
		locked>>20, held>>20, total>>20, free>>20, growth>>20, r.n>>20)
	return s
}

// readBytes reads samples into v, a value each (0 for one that is not a
// count).
func readBytes(samples []metrics.Sample, v []int64) {
	metrics.Read(samples)
	for i, m := range samples {
		v[i] = 0
		if m.Value.Kind() == metrics.KindUint64 {
			v[i] = int64(m.Value.Uint64())
		}
	}
}

// LockHeap faults in and locks the Go heap's mappings, all but the
// ballast, and returns the bytes locked: every anonymous mapping of the
// address range that holds its objects (heapRun). Faulting in the free
// heap is not enough: memory the runtime hands out again after a
// goroutine stack or a large buffer that was never wholly written is
// cleared on reuse, and the clearing faults. The daemon calls it again
// now and then from a thread of its own, which may wait on reclaim, as
// the heap grows.
func (r *HeapReserve) LockHeap() (int64, error) {
	if r == nil || len(r.ballast) == 0 {
		return 0, nil
	}
	r.lockMu.Lock()
	defer r.lockMu.Unlock()
	maps, err := r.readMaps()
	if err != nil {
		return 0, err
	}
	// The heap's range is the one holding its objects: probe with one of
	// each kind of span, the large one kept from call to call (a new one
	// each time would be a fresh span, cleared, on this thread).
	if r.large == nil {
		r.large = make([]byte, 64<<10)
	}
	small := new([64]byte)
	probes := [...]uintptr{uintptr(unsafe.Pointer(&r.ballast[0])), uintptr(unsafe.Pointer(small)), uintptr(unsafe.Pointer(&r.large[0]))}
	bLo := uintptr(unsafe.Pointer(&r.ballast[0]))
	bHi := bLo + uintptr(len(r.ballast))
	bLo, bHi = (bLo+pageSize-1)&^(pageSize-1), bHi&^(pageSize-1)
	// Most calls fault in only what is not resident: what the heap grew
	// by, and heap the scavenger mapped fresh over pages it released.
	// The full lock also writes pages that are mapped but were only ever
	// read: the kernel's zero page, which mincore counts as resident and
	// whose first write faults.
	full := r.calls%fullLockEvery == 0
	r.calls++
	var total int64
	r.mappings = appendMaps(r.mappings[:0], maps)
	lock := mlockRange
	if !full {
		lock = func(lo, hi uintptr) error { return lockMissing(lo, hi, &r.resident) }
	}
	for i := 0; i < len(r.mappings); {
		j, heap := heapRun(r.mappings, i, probes[:])
		run := r.mappings[i:j]
		i = j
		if !heap {
			continue
		}
		for _, m := range run {
			if m.perms != "rw-p" { // writable
				continue
			}
			for _, rg := range [][2]uintptr{{m.lo, min(m.hi, max(m.lo, bLo))}, {max(m.lo, min(m.hi, bHi)), m.hi}} {
				if rg[1] <= rg[0] {
					continue
				}
				if err := lock(rg[0], rg[1]); err != nil {
					return total, fmt.Errorf("mlock of the heap at %#x-%#x: %w", rg[0], rg[1], err)
				}
				total += int64(rg[1] - rg[0])
			}
		}
	}
	runtime.KeepAlive(small)
	if err := lockTouched(r.mappings, &r.resident); err != nil {
		return total, err
	}
	return total, nil
}

// heapRun returns the end j of the run of mappings that starts at
// ms[i], and whether it is the heap's: a run is one mapping, or, for an
// anonymous one, every anonymous mapping after it that begins where the
// one before ends, and the heap's is a run that holds one of the probes.
// The heap's arenas are one range of address space, mapped piece by piece
// as the heap grows, but the kernel lists it as many mappings: one for
// each range whose flags differ, and under mlockall(MCL_ONFAULT) mlock
// sets flags the rest lacks, and the scavenger's fresh mappings over the
// pages it releases (see ReserveHeap) are made without them. Only the
// mappings holding a probe would miss those fresh ones, which hold the
// free heap: TopUp's reserve, released and never faulted in again.
func heapRun(ms []mapping, i int, probes []uintptr) (j int, heap bool) {
	j = i + 1
	if ms[i].path != "" {
		return j, false
	}
	for j < len(ms) && ms[j].path == "" && ms[j].lo == ms[j-1].hi {
		j++
	}
	lo, hi := ms[i].lo, ms[j-1].hi
	for _, p := range probes {
		if p >= lo && p < hi {
			return j, true
		}
	}
	return j, false
}

// readMaps reads /proc/self/maps into r.maps, grown as need be and kept,
// and returns the text, which aliases r.maps until the next call.
func (r *HeapReserve) readMaps() (string, error) {
	fd, err := unix.Open("/proc/self/maps", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return "", fmt.Errorf("open /proc/self/maps: %w", err)
	}
	defer unix.Close(fd)
	if r.maps == nil {
		r.maps = make([]byte, 64<<10)
	}
	n := 0
	for {
		if n == len(r.maps) {
			r.maps = append(r.maps, make([]byte, len(r.maps))...)
		}
		m, err := unix.Read(fd, r.maps[n:])
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return "", fmt.Errorf("read /proc/self/maps: %w", err)
		}
		if m == 0 {
			break
		}
		n += m
	}
	return unsafe.String(unsafe.SliceData(r.maps), n), nil
}

// lockTouched locks every resident page of the program's and the
// libraries' data and bss as a page of its own. A page that was only ever
// read is the kernel's shared zero page, and the first write to it copies
// it: a fault, in the runtime's global structures (its locks live in the
// bss) as anywhere. mlock writes such pages now; pages never touched are
// left alone, so sparse tables (the runtime's arena index) cost nothing.
// The heap is LockHeap's; stacks are written before they are read.
func lockTouched(ms []mapping, resident *[]byte) error {
	var afterFile uintptr // end of the last file mapping: where a bss starts
	for _, m := range ms {
		file := strings.HasPrefix(m.path, "/")
		bss := m.path == "" && m.lo == afterFile
		if file || bss {
			afterFile = m.hi // locking part of a bss splits it in two
		}
		if m.perms != "rw-p" || !file && !bss {
			continue
		}
		vec, err := residency(m.lo, m.hi, resident)
		if err != nil {
			continue // unmapped since maps was read
		}
		for i, j := range pageRuns(vec, true) {
			a, b := m.lo+uintptr(i)*pageSize, m.lo+uintptr(j)*pageSize
			if err := mlockRange(a, b); err != nil && err != unix.ENOMEM {
				return fmt.Errorf("mlock of touched pages at %#x-%#x: %w", a, b, err)
			}
		}
	}
	return nil
}

// lockMissing faults in and locks the pages of [lo, hi) that are not
// resident, in runs. resident is mincore's vector, as for residency.
func lockMissing(lo, hi uintptr, resident *[]byte) error {
	vec, err := residency(lo, hi, resident)
	if err != nil {
		return mlockRange(lo, hi) // let mlock say what is wrong with the range
	}
	for i, j := range pageRuns(vec, false) {
		if err := mlockRange(lo+uintptr(i)*pageSize, lo+uintptr(j)*pageSize); err != nil {
			return err
		}
	}
	return nil
}

// pageSize is the unit of mincore's vector and of mlock.
const pageSize = 4096

// residency returns mincore's vector for the pages of [lo, hi): bit 0 of
// each byte is set for a resident page. The vector lives in *vec, grown as
// need be and kept, so that LockHeap allocates nothing once warm.
func residency(lo, hi uintptr, vec *[]byte) ([]byte, error) {
	n := int((hi - lo) / pageSize)
	if cap(*vec) < n {
		*vec = make([]byte, n)
	}
	v := (*vec)[:n]
	if n == 0 {
		return v, nil
	}
	if _, _, e := unix.Syscall(unix.SYS_MINCORE, lo, hi-lo, uintptr(unsafe.Pointer(&v[0]))); e != 0 {
		return nil, e
	}
	return v, nil
}

// pageRuns yields each maximal run [i, j) of pages in a mincore vector
// that are resident, or with resident false, that are not.
func pageRuns(vec []byte, resident bool) iter.Seq2[int, int] {
	return func(yield func(int, int) bool) {
		for i := 0; i < len(vec); {
			if (vec[i]&1 != 0) != resident {
				i++
				continue
			}
			j := i
			for j < len(vec) && (vec[j]&1 != 0) == resident {
				j++
			}
			if !yield(i, j) {
				return
			}
			i = j
		}
	}
}

// KeepHeapLocked calls LockHeap every interval until ctx is done, on a
// thread of its own named gzramd-heaplock: locking faults in what the heap
// grew by, and may wait on reclaim, which no request may. onErr hears of
// failures, once each until one succeeds.
func (r *HeapReserve) KeepHeapLocked(ctx context.Context, interval time.Duration, onErr func(error)) {
	osthread.Run("gzramd-heaplock", func() { r.keepHeapLocked(ctx, interval, onErr) })
}

func (r *HeapReserve) keepHeapLocked(ctx context.Context, interval time.Duration, onErr func(error)) {
	t := time.NewTicker(interval)
	defer t.Stop()
	failing := false
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		_, err := r.LockHeap()
		if err != nil && !failing {
			onErr(err)
		}
		failing = err != nil
	}
}
