package swapsafe

import (
	"os"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gzramd/gzramd/internal/testneeds"
)

// TestReservePreemptState: after ReservePreemptState(n), n goroutines
// preempted again and again for 100 ms, by sysmon and by collections
// (which stop the world and scan their stacks), take no page fault on
// their threads, where the runtime saves their vector registers: the
// blocks it saves them in were made ahead. Without ReservePreemptState
// the same load's threads took 3 to 6 faults (n 8, 2 CPUs; 10 runs of
// 10 failed), writing blocks the runtime carved from fresh memory.
func TestReservePreemptState(t *testing.T) {
	if xRegStateBytes == 0 {
		t.Skipf("the runtime saves preempted goroutines' registers on their stacks on %s", runtime.GOARCH)
	}
	if asyncPreemptOff() {
		t.Skip("asynchronous preemption is off (GODEBUG asyncpreemptoff)")
	}
	const n = 8
	// The load's goroutines lock threads of their own: threads started
	// ahead, as the daemon's are, and each signalled once, so that what
	// faults on them is the register blocks, not a thread's first signal
	// frame (the daemon's signal stacks are in its heap, which it locks).
	if s := ReserveThreads(n + 2*runtime.GOMAXPROCS(0)); s.Err != nil {
		t.Fatal(s.Err)
	}
	signalEveryThread(t)
	start := time.Now()
	s := ReservePreemptState(n)
	if s.Err != nil {
		t.Fatal(s.Err)
	}
	t.Logf("%s, in %v", s.Done, time.Since(start))
	if raceEnabled {
		t.Skip("the race detector's own state faults on the load's threads; the run without -race counts them")
	}
	faults, switches := preemptLoad(t, n, 100*time.Millisecond)
	t.Logf("the load's threads: %d page faults, %d voluntary context switches (their preemptions)", faults, switches)
	if faults != 0 {
		t.Errorf("%d page faults on the threads of %d goroutines preempted at once, after ReservePreemptState(%d)", faults, n, n)
	}
}

// preemptLoad has k goroutines spin for d, each locked to a thread,
// preempted by sysmon every 10 ms and by a collection every 5 ms or so,
// and returns the page faults their threads took, and the times those
// threads slept (a locked goroutine's thread sleeps while it is
// preempted). At most k + GOMAXPROCS register blocks are in use at once:
// one a goroutine preempted, and one cached on each P.
func preemptLoad(t *testing.T, k int, d time.Duration) (faults, switches int64) {
	t.Helper()
	var stop atomic.Bool
	var wg sync.WaitGroup
	var nf, ns atomic.Int64
	deadline := time.Now().Add(10 * d) // should the test goroutine not run again
	for range k {
		wg.Add(1)
		go func() {
			defer wg.Done()
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			var before, after unix.Rusage
			if err := unix.Getrusage(unix.RUSAGE_THREAD, &before); err != nil {
				t.Error(err)
				return
			}
			spin(&stop, deadline)
			if err := unix.Getrusage(unix.RUSAGE_THREAD, &after); err != nil {
				t.Error(err)
				return
			}
			nf.Add(after.Minflt - before.Minflt)
			if after.Minflt != before.Minflt {
				t.Logf("thread %d: %d page faults, %d sleeps", unix.Gettid(), after.Minflt-before.Minflt, after.Nvcsw-before.Nvcsw)
			}
			ns.Add(after.Nvcsw - before.Nvcsw)
		}()
	}
	for end := time.Now().Add(d); time.Now().Before(end); {
		time.Sleep(5 * time.Millisecond)
		runtime.GC()
	}
	stop.Store(true)
	wg.Wait()
	return nf.Load(), ns.Load()
}

// signalEveryThread sends each of the process's threads a SIGURG, which
// the runtime ignores when it did not ask for it: the thread writes its
// first signal frame now.
func signalEveryThread(t *testing.T) {
	t.Helper()
	tasks, err := os.ReadDir("/proc/self/task")
	if err != nil {
		testneeds.Machine(t, "/proc/self/task (Linux's /proc mounted): %v", err)
	}
	for _, task := range tasks {
		if tid, err := strconv.Atoi(task.Name()); err == nil {
			_ = unix.Tgkill(unix.Getpid(), tid, unix.SIGURG) // the thread may have ended
		}
	}
	// Signals are handled as their threads next run; idle threads wake
	// for them.
	time.Sleep(10 * time.Millisecond)
}

func TestGodebugInt(t *testing.T) {
	for _, c := range []struct {
		godebug string
		def     int
		want    int
	}{
		{"", 0, 0},
		{"", 1, 1},
		{"asyncpreemptoff=1", 0, 1},
		{"gcshrinkstackoff=1,asyncpreemptoff=1", 0, 1},
		{"asyncpreemptoff=1,asyncpreemptoff=0", 0, 0},
		{"asyncpreemptoff=0", 1, 0},
		{" asyncpreemptoff=2", 0, 2},
		{"asyncpreemptoff=x", 1, 1},
		{"xasyncpreemptoff=1,asyncpreemptoff", 0, 0},
	} {
		if got := godebugInt(c.godebug, "asyncpreemptoff", c.def); got != c.want {
			t.Errorf("godebugInt(%q, asyncpreemptoff, %d) = %d, want %d", c.godebug, c.def, got, c.want)
		}
	}
}
