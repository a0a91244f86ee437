package swapsafe

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/gzramd/gzramd/internal/testneeds"
	"github.com/gzramd/gzramd/kernels"
)

func TestStatFlags(t *testing.T) {
	for _, tc := range []struct {
		line string
		want uint64
		ok   bool
	}{
		{"1234 (gzramd) S 1 1234 1234 0 -1 4194560 100 0 0", 4194560, true},
		{"1234 (a b) c)) R 1 2 3 4 5 1572928 0", 1572928, true},
		{"1234 gzramd S 1", 0, false},
		{"1234 (x) S 1 2", 0, false},
	} {
		got, err := statFlags(tc.line)
		if (err == nil) != tc.ok || got != tc.want {
			t.Errorf("statFlags(%q) = %d, %v; want %d, ok=%v", tc.line, got, err, tc.want, tc.ok)
		}
	}
}

// TestReExecMarksEveryThread runs this test binary as a child that calls
// ReExecAsIOFlusher, starts more threads, and reports how many are IO
// flushers.
func TestReExecMarksEveryThread(t *testing.T) {
	if os.Getenv("SWAPSAFE_CHILD") == "1" {
		child()
		return
	}
	r := runChild(t, "^TestReExecMarksEveryThread$")
	if r.pid0 != r.pid1 {
		t.Errorf("the re-exec changed the pid from %d to %d (systemd would lose the main process)", r.pid0, r.pid1)
	}
	if r.starts != 2 {
		t.Errorf("the child started %d times, want 2 (once, then re-executed)", r.starts)
	}
	if r.threads < 4 || r.flushers != r.threads {
		t.Errorf("%d of %d threads are IO flushers, want all (and at least 4 threads)", r.flushers, r.threads)
	}
}

// A process started by an IO flusher (the serving process, by the
// supervisor) inherits the flag on every thread and is not re-executed:
// an exec is time a takeover waits.
func TestInheritedIOFlusherIsNotReExecuted(t *testing.T) {
	switch os.Getenv("SWAPSAFE_CHILD") {
	case "1":
		child()
		return
	case "parent":
		// An IO flusher now; its own child is the one that reports.
		if err := ReExecAsIOFlusher(); err != nil {
			fmt.Printf("%s%s: setting PR_SET_IO_FLUSHER, refused here: %v\n", childSkip, refusedKind(err), err)
			return
		}
		cmd := exec.Command(os.Args[0], "-test.run=^TestInheritedIOFlusherIsNotReExecuted$", "-test.count=1")
		cmd.Env = append(os.Environ(), "SWAPSAFE_CHILD=1", "SWAPSAFE_STARTS=0", "SWAPSAFE_PID=")
		out, err := cmd.CombinedOutput()
		os.Stdout.Write(out)
		if err != nil {
			fmt.Println("grandchild:", err)
			os.Exit(1)
		}
		return
	}
	r := runChildAs(t, "^TestInheritedIOFlusherIsNotReExecuted$", "parent")
	if r.starts != 1 {
		t.Errorf("the child of an IO flusher started %d times, want 1 (no re-exec)", r.starts)
	}
	if r.threads < 4 || r.flushers != r.threads {
		t.Errorf("%d of %d threads are IO flushers, want all (and at least 4 threads)", r.flushers, r.threads)
	}
}

// childResult is what child prints.
type childResult struct {
	flushers, threads, pid0, pid1, starts int
}

func runChild(t *testing.T, run string) childResult {
	return runChildAs(t, run, "1")
}

// runChildAs runs this test binary's test run with SWAPSAFE_CHILD=role and
// parses child's RESULT line, skipping the test where child could not run.
func runChildAs(t *testing.T, run, role string) childResult {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run="+run, "-test.count=1")
	cmd.Env = append(os.Environ(), "SWAPSAFE_CHILD="+role)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("child: %v\n%s", err, out)
	}
	s := string(out)
	if i := strings.Index(s, childSkip); i >= 0 {
		kind, detail, _ := strings.Cut(strings.SplitN(s[i+len(childSkip):], "\n", 2)[0], ": ")
		testneeds.Skip(t, kind, "", "%s", detail)
	}
	var r childResult
	i := strings.Index(s, "RESULT")
	if i < 0 {
		t.Fatalf("child printed no result:\n%s", s)
	}
	if _, err := fmt.Sscanf(s[i:], "RESULT %d %d %d %d %d", &r.flushers, &r.threads, &r.pid0, &r.pid1, &r.starts); err != nil {
		t.Fatalf("parsing %q: %v", s[i:], err)
	}
	return r
}

// childSkip begins the line on which child says why the test cannot run
// here: the kind of need (testneeds), ": ", what is missing.
const childSkip = "CHILD-SKIP "

func refusedKind(err error) string {
	if errors.Is(err, syscall.EPERM) && os.Geteuid() != 0 {
		return testneeds.KindRoot
	}
	return testneeds.KindMachine
}

// child counts its starts (SWAPSAFE_STARTS) across the re-exec, calls
// ReExecAsIOFlusher, starts more threads, and prints a RESULT line.
func child() {
	starts, _ := strconv.Atoi(os.Getenv("SWAPSAFE_STARTS"))
	starts++
	os.Setenv("SWAPSAFE_STARTS", strconv.Itoa(starts))
	pid0 := os.Getenv("SWAPSAFE_PID")
	if pid0 == "" {
		os.Setenv("SWAPSAFE_PID", fmt.Sprint(os.Getpid()))
		pid0 = fmt.Sprint(os.Getpid())
	}
	if err := ReExecAsIOFlusher(); err != nil {
		fmt.Printf("%s%s: setting PR_SET_IO_FLUSHER, refused here: %v\n", childSkip, refusedKind(err), err)
		return
	}
	// Make the runtime start more threads: goroutines locked to threads
	// force new Ms.
	var wg sync.WaitGroup
	ready := make(chan struct{})
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			runtime.LockOSThread()
			<-ready
		}()
	}
	runtime.Gosched()
	f, n, err := CountIOFlushers()
	close(ready)
	wg.Wait()
	if err != nil {
		fmt.Println(err)
		os.Exit(1)
	}
	fmt.Printf("RESULT %d %d %s %d %d\n", f, n, pid0, os.Getpid(), starts)
}

func TestApplyReportsEachStep(t *testing.T) {
	adj := 0 // raising or keeping the score needs no privilege
	steps := Apply(Options{OOMScoreAdj: &adj, GCPercent: 100, MemoryLimit: 1 << 40, IOFlusher: true})
	names := map[string]Step{}
	for _, s := range steps {
		names[s.Name] = s
		if s.Err == nil && s.Done == "" {
			t.Errorf("step %s neither did anything nor failed", s.Name)
		}
	}
	for _, n := range []string{"oom_score_adj", "gc_percent", "go_memory_limit", "io_flusher"} {
		if _, ok := names[n]; !ok {
			t.Errorf("no report for step %s", n)
		}
	}
	if s := names["oom_score_adj"]; s.Err != nil {
		t.Errorf("oom_score_adj 0: %v", s.Err)
	}
	// This test process was not re-executed, so its threads are not flushers.
	if s := names["io_flusher"]; s.Err == nil {
		t.Errorf("io_flusher reported success without the re-exec: %s", s.Done)
	}
	if bad := Failed(steps); len(bad) != 1 || bad[0].Name != "io_flusher" {
		t.Errorf("Failed = %+v, want only io_flusher", bad)
	}
	bad := -5000
	if s := Apply(Options{OOMScoreAdj: &bad}); s[0].Err == nil {
		t.Error("oom_score_adj -5000 accepted")
	}
}

func TestMayLockFuture(t *testing.T) {
	for _, tc := range []struct {
		cap  bool
		lim  uint64
		want bool
	}{
		{true, 8 << 20, true},
		{false, unix.RLIM_INFINITY, true},
		{false, 8 << 20, false}, // an unprivileged user's default: mmap would fail later
		{true, unix.RLIM_INFINITY, true},
	} {
		if got := mayLockFuture(tc.cap, tc.lim); got != tc.want {
			t.Errorf("mayLockFuture(%v, %d) = %v, want %v", tc.cap, tc.lim, got, tc.want)
		}
	}
}

// lockMappedFiles locks the test binary's own code and the C libraries.
func TestLockMappedFiles(t *testing.T) {
	n, err := lockMappedFiles("/proc/self/maps", nil)
	if errors.Is(err, syscall.EPERM) || errors.Is(err, syscall.ENOMEM) {
		testneeds.MlockRefused(t, err, "mlock")
	}
	if err != nil {
		t.Fatal(err)
	}
	if n < 1<<20 {
		t.Errorf("%d bytes locked, want at least the test binary's code", n)
	}
	if _, err := lockMappedFiles("/nonexistent/maps", nil); err == nil {
		t.Error("no error for a missing maps file")
	}
}

// TestLockMappedFilesLeavesHoles: the whole pages of Options.Unlocked are
// left out of the program's locked pages; the rest of the mapping is
// still locked.
func TestLockMappedFilesLeavesHoles(t *testing.T) {
	all, err := lockMappedFiles("/proc/self/maps", nil)
	if errors.Is(err, syscall.EPERM) || errors.Is(err, syscall.ENOMEM) {
		testneeds.MlockRefused(t, err, "mlock")
	}
	if err != nil {
		t.Fatal(err)
	}
	holes := pageHoles([][]byte{kernels.ZstdDeep, nil})
	if len(holes) != 1 {
		t.Fatalf("holes %x, want one for the PTX", holes)
	}
	less, err := lockMappedFiles("/proc/self/maps", [][]byte{kernels.ZstdDeep})
	if err != nil {
		t.Fatal(err)
	}
	if want := int64(holes[0][1] - holes[0][0]); all-less != want || want < int64(len(kernels.ZstdDeep))-2*int64(os.Getpagesize()) {
		t.Errorf("%d bytes locked with the PTX left out, %d without: want %d fewer", less, all, want)
	}
}

func TestRangesBetween(t *testing.T) {
	holes := [][2]uintptr{{0x2000, 0x3000}, {0x5000, 0x8000}}
	for _, tc := range []struct {
		lo, hi uintptr
		want   [][2]uintptr
	}{
		{0x0, 0x2000, [][2]uintptr{{0x0, 0x2000}}},
		{0x1000, 0x6000, [][2]uintptr{{0x1000, 0x2000}, {0x3000, 0x5000}}},
		{0x2000, 0x3000, nil},
		{0x5000, 0x9000, [][2]uintptr{{0x8000, 0x9000}}},
		{0x0, 0x9000, [][2]uintptr{{0x0, 0x2000}, {0x3000, 0x5000}, {0x8000, 0x9000}}},
	} {
		var got [][2]uintptr
		for lo, hi := range rangesBetween(tc.lo, tc.hi, holes) {
			got = append(got, [2]uintptr{lo, hi})
		}
		if !slices.Equal(got, tc.want) {
			t.Errorf("[%#x, %#x): %x, want %x", tc.lo, tc.hi, got, tc.want)
		}
	}
}

// Apply's realtime step makes every thread SCHED_RR and DropRealtime puts
// them back, where this process may change its scheduling.
func TestRealtimeAndDrop(t *testing.T) {
	defer DropRealtime()
	steps := Apply(Options{Realtime: true})
	if len(steps) != 1 || steps[0].Name != "realtime" {
		t.Fatalf("steps %+v, want one realtime step", steps)
	}
	if errors.Is(steps[0].Err, syscall.EPERM) {
		if os.Geteuid() != 0 {
			testneeds.Root(t, "making threads SCHED_RR (CAP_SYS_NICE)")
		}
		testneeds.Machine(t, "CAP_SYS_NICE, which root lacks here (a container?): %v", steps[0].Err)
	}
	if steps[0].Err != nil {
		t.Fatal(steps[0].Err)
	}
	if got := policies(t); got[unix.SCHED_RR] == 0 || len(got) != 1 {
		t.Errorf("thread policies after the realtime step: %v, want all SCHED_RR", got)
	}
	if err := DropRealtime(); err != nil {
		t.Fatal(err)
	}
	if got := policies(t); got[unix.SCHED_NORMAL] == 0 || len(got) != 1 {
		t.Errorf("thread policies after DropRealtime: %v, want all SCHED_NORMAL", got)
	}
}

// policies counts this process's threads by scheduling policy.
func policies(t *testing.T) map[uint32]int {
	t.Helper()
	tasks, err := os.ReadDir("/proc/self/task")
	if err != nil {
		t.Fatal(err)
	}
	m := map[uint32]int{}
	for _, task := range tasks {
		var tid int
		fmt.Sscan(task.Name(), &tid)
		if a, err := unix.SchedGetAttr(tid, 0); err == nil {
			m[a.Policy]++
		}
	}
	return m
}

func TestParseMaps(t *testing.T) {
	maps := `00400000-00419000 r--p 00000000 fe:00 10027197                           /usr/bin/gzramd
00f93000-01003000 rw-p 00b93000 fe:00 10027197                           /usr/bin/gzramd
01003000-0304d000 rw-p 00000000 00:00 0
3ba9b4000000-3ba9b6800000 ---p 00000000 00:00 0
7ffd1000-7ffd2000 rw-p 00000000 00:00 0                                  [stack]
garbage line
0200-0100 rw-p 00000000 00:00 0
`
	want := []mapping{
		{lo: 0x400000, hi: 0x419000, perms: "r--p", path: "/usr/bin/gzramd"},
		{lo: 0xf93000, hi: 0x1003000, perms: "rw-p", path: "/usr/bin/gzramd"},
		{lo: 0x1003000, hi: 0x304d000, perms: "rw-p"},
		{lo: 0x3ba9b4000000, hi: 0x3ba9b6800000, perms: "---p"},
		{lo: 0x7ffd1000, hi: 0x7ffd2000, perms: "rw-p", path: "[stack]"},
	}
	if got := parseMaps(maps); !slices.Equal(got, want) {
		t.Errorf("parseMaps:\n got %+v\nwant %+v", got, want)
	}
}
