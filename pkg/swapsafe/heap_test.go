package swapsafe

import (
	"os"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/gzramd/gzramd/internal/testneeds"
)

// reserveHeap runs ReserveHeap for a test, from GOGC 100 and no memory
// limit (the test binary's environment must not override the pacing), and
// puts both back and keeps the reserve alive until the test ends.
func reserveHeap(t *testing.T, n int64) (*HeapReserve, Step) {
	t.Helper()
	t.Setenv("GOGC", "")
	gc, limit := debug.SetGCPercent(100), debug.SetMemoryLimit(-1)
	t.Cleanup(func() {
		debug.SetGCPercent(gc)
		debug.SetMemoryLimit(limit)
	})
	r, step := ReserveHeap(n)
	t.Cleanup(r.KeepAlive)
	if step.Err != nil {
		t.Fatal(step.Err)
	}
	return r, step
}

// TestReserveHeapKeepsFreeMemory: after ReserveHeap, garbage churn and
// collections do not make the runtime give the reserve back (under
// mlockall that would replace it with pages that fault on next use), and
// GOGC is set so that the collector runs before the heap outgrows it.
func TestReserveHeapKeepsFreeMemory(t *testing.T) {
	const reserve = 16 << 20
	_, step := reserveHeap(t, reserve)
	t.Log(step.Done)
	if got := debug.SetGCPercent(gcPercentWithReserve); got != gcPercentWithReserve {
		t.Fatalf("GOGC %d after ReserveHeap, want %d", got, gcPercentWithReserve)
	}
	sample := []metrics.Sample{
		{Name: "/memory/classes/heap/released:bytes"},
		{Name: "/memory/classes/heap/free:bytes"},
	}
	metrics.Read(sample)
	released0 := sample[0].Value.Uint64()

	// Garbage of half the reserve per cycle, collected each time: the
	// daemon's own rate is far lower. Then time for the background
	// scavenger, which would give free memory above its goal back.
	var sink [][]byte
	for range 8 {
		for range reserve / 2 / (64 << 10) {
			sink = append(sink, make([]byte, 64<<10))
		}
		sink = nil
		runtime.GC()
		time.Sleep(10 * time.Millisecond)
	}
	runtime.KeepAlive(sink)
	runtime.GC()
	metrics.Read(sample)
	released, free := sample[0].Value.Uint64(), sample[1].Value.Uint64()
	t.Logf("heap released %d -> %d bytes, free %d", released0, released, free)
	// The runtime may give back what is free beyond the reserve (the
	// warm-up of small spans leaves more), not the reserve itself.
	if free < reserve*3/4 {
		t.Errorf("%d bytes of free heap kept after giving back %d, want about the reserve (%d)", free, released-released0, reserve)
	}
}

// TestTopUpFaultsInFreeHeap: TopUp touches at least the heap's free pages
// (or the reserve, if more) and leaves them counted as released, so that
// the scavenger, which keeps free memory of only 10 % of the heap in use,
// has nothing to give back: giving back under mlockall maps fresh memory
// over the reserve, from the top, and the next stack there faults. A
// process without a reserve tops up nothing.
func TestTopUpFaultsInFreeHeap(t *testing.T) {
	if s := (*HeapReserve)(nil).TopUp(); s.Err != nil || s.Done != "none" {
		t.Errorf("TopUp without a reserve: %+v, want none", s)
	}
	r, _ := reserveHeap(t, 8<<20)
	// Start-up allocations the reserve pays for, then TopUp.
	keep := make([][]byte, 0, 64)
	for range 64 {
		keep = append(keep, make([]byte, 64<<10))
	}
	s := r.TopUp()
	runtime.KeepAlive(keep)
	testneeds.MlockRefused(t, s.Err, "TopUp, which locks the heap")
	t.Log(s.Done)
	sample := []metrics.Sample{
		{Name: "/memory/classes/heap/free:bytes"},
		{Name: "/memory/classes/heap/released:bytes"},
		{Name: "/memory/classes/heap/objects:bytes"},
	}
	metrics.Read(sample)
	free, released, objects := sample[0].Value.Uint64(), sample[1].Value.Uint64(), sample[2].Value.Uint64()
	t.Logf("after TopUp: heap free %d, released %d, objects %d bytes", free, released, objects)
	if free+released < 8<<20/2 {
		t.Errorf("%d bytes of free and released heap after TopUp, want about the 8 MiB reserve at least", free+released)
	}
	if free > objects/10 {
		t.Errorf("%d bytes of heap free and not released after TopUp, over 10 %% of the %d in objects: the scavenger would give the excess back", free, objects)
	}
}

func TestReserveThreadsStartsThreads(t *testing.T) {
	const n = 12
	s := ReserveThreads(n)
	if s.Err != nil {
		t.Fatal(s.Err)
	}
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		testneeds.Machine(t, "/proc/self/status (Linux's /proc mounted): %v", err)
	}
	for line := range strings.Lines(string(b)) {
		if v, ok := strings.CutPrefix(line, "Threads:"); ok {
			threads, _ := strconv.Atoi(strings.TrimSpace(v))
			if threads < n {
				t.Errorf("%d threads after ReserveThreads(%d)", threads, n)
			}
			return
		}
	}
	t.Error("no Threads: line in /proc/self/status")
}

// LockHeap runs every 250 ms on a thread that may fault: after its first
// call it allocates only its small-span probe, not the maps text, its
// parse or a large probe, whose fresh spans it would clear itself.
func TestLockHeapAllocatesOnlyItsProbe(t *testing.T) {
	r, _ := reserveHeap(t, 4<<20)
	if _, err := r.LockHeap(); err != nil {
		testneeds.MlockRefused(t, err, "locking the heap")
	}
	if n := testing.AllocsPerRun(10, func() { r.LockHeap() }); n > 1 {
		t.Errorf("%v allocations per LockHeap, want at most 1 (the small probe)", n)
	}
}

func TestFieldsMatchesStringsFields(t *testing.T) {
	for _, line := range []string{
		"7f00-7f10 rw-p 00000000 00:00 0 \n",
		"55d0-55e0 r-xp 00001000 fd:01 1234     /usr/bin/gzramd\n",
		"7ffc-7ffd rw-p 00000000 00:00 0                          [stack]\n",
		"a-b rw-p 0 0 0 /tmp/x (deleted)\n",
		"  \t\n",
		"",
	} {
		var f [6]string
		n := fields(line, f[:])
		want := strings.Fields(line)
		if len(want) > 6 {
			want = want[:6]
		}
		if n != len(want) || !slices.Equal(f[:n], want) {
			t.Errorf("fields(%q) = %q, want %q", line, f[:n], want)
		}
	}
}

// lockMissing faults in exactly what is not resident yet, so that most
// LockHeap calls need not walk the whole heap.
func TestLockMissingFaultsInWhatIsNotResident(t *testing.T) {
	const page, pages = 4096, 32
	mem, err := unix.Mmap(-1, 0, pages*page, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(mem)
	for _, p := range []int{0, 1, 2, 10, pages - 1} {
		mem[p*page] = 1
	}
	lo := uintptr(unsafe.Pointer(&mem[0]))
	var vec []byte
	if err := lockMissing(lo, lo+pages*page, &vec); err != nil {
		testneeds.MlockRefused(t, err, "locking the heap")
	}
	defer unix.Munlock(mem)
	if _, _, e := unix.Syscall(unix.SYS_MINCORE, lo, pages*page, uintptr(unsafe.Pointer(&vec[0]))); e != 0 {
		t.Fatal(e)
	}
	for i, v := range vec[:pages] {
		if v&1 == 0 {
			t.Errorf("page %d not resident after lockMissing", i)
		}
	}
	for _, p := range []int{0, 1, 2, 10, pages - 1} {
		if mem[p*page] != 1 {
			t.Errorf("page %d lost what was written to it", p)
		}
	}
}

// The heap is one range of address space that the kernel lists as many
// mappings once mlock and the scavenger's fresh mappings have split it:
// heapRun takes every adjacent anonymous mapping of a run holding a probe,
// and nothing past a gap, a file or a run without one.
func TestHeapRunTakesTheHeapsAdjacentMappings(t *testing.T) {
	ms := parseMaps(`00400000-00a00000 r-xp 00000000 00:10 12 /bin/gzramd
00a00000-00b00000 rw-p 00600000 00:10 12 /bin/gzramd
00b00000-00c00000 rw-p 00000000 00:00 0
c000000000-c000400000 rw-p 00000000 00:00 0
c000400000-c005400000 rw-p 00000000 00:00 0
c005400000-c005600000 rw-p 00000000 00:00 0
c005600000-c005e00000 rw-p 00000000 00:00 0
c005e00000-c008000000 ---p 00000000 00:00 0
c008000000-c008100000 rw-p 00000000 00:00 0
7f0000000000-7f0000800000 rw-p 00000000 00:00 0
`)
	probes := []uintptr{0xc000400000, 0xc000001000, 0xc005500000}
	var heap [][2]uintptr
	for i := 0; i < len(ms); {
		j, ok := heapRun(ms, i, probes)
		if j <= i {
			t.Fatalf("heapRun(%d) = %d: no progress", i, j)
		}
		if ok {
			for _, m := range ms[i:j] {
				heap = append(heap, [2]uintptr{m.lo, m.hi})
			}
		}
		i = j
	}
	want := [][2]uintptr{{0xc000000000, 0xc000400000}, {0xc000400000, 0xc005400000}, {0xc005400000, 0xc005600000},
		{0xc005600000, 0xc005e00000}, {0xc005e00000, 0xc008000000}, {0xc008000000, 0xc008100000}}
	if !slices.Equal(heap, want) {
		t.Errorf("the heap's mappings: %x, want %x", heap, want)
	}
}
