// The blocks in which the Go runtime saves preempted goroutines' vector
// registers, made before serving.

package swapsafe

import (
	"fmt"
	"os"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// xRegStateBytes is the size of the block in which the Go runtime saves an
// asynchronously preempted goroutine's vector registers (runtime.xRegState
// in Go 1.26: the 32 ZMM and 8 mask registers on amd64, the 32 V
// registers on arm64, the 32 XR registers on loong64), and 0 where it
// saves them on the goroutine's stack. It sizes the reports only.
var xRegStateBytes = map[string]int64{"amd64": 2112, "arm64": 512, "loong64": 1024}[runtime.GOARCH]

// preemptWarmLimit bounds ReservePreemptState, which takes about 20 ms
// for every GOMAXPROCS of its goroutines (0.3 s for the daemon's plan on
// 2 CPUs, 0.5 s on 1), longer on CPUs busy with other work. Only a
// runtime that does not preempt asynchronously would take it all.
const preemptWarmLimit = 5 * time.Second

// ReservePreemptState makes the Go runtime make and write now the blocks
// in which it saves the vector registers of goroutines it preempts
// asynchronously, enough for n goroutines preempted at once, and returns
// the step for the report.
//
// Since Go 1.26, a goroutine preempted asynchronously (by sysmon after
// 10 ms of running, or to stop the world or scan its stack for the GC)
// has its vector registers saved off the heap (runtime.xRegSave, 2112
// bytes on amd64), in a block from a free list of blocks used before; when
// the list is empty, the runtime carves a new one from fresh memory, and
// the preempted thread's first write to it faults. That happens the first
// time more goroutines are preempted at once than ever before, under load:
// a thread serving swap must not fault then, for the fault's reclaim may
// wait on the very device it serves (a ublk test's queue thread stalled so
// in runtime.xRegSave). Blocks go back to the free list, never to the
// system: once written here (and locked, after mlockall), they stay.
//
// A goroutine holds its block from its preemption until it runs again, and
// each P keeps the last block restored on it, for its next preemption: so
// n goroutines preempted at once hold up to n + GOMAXPROCS blocks.
// ReservePreemptState runs n + 2×GOMAXPROCS + 2 goroutines, each spinning
// in a loop without calls, which only asynchronous preemption interrupts,
// until all have started: every one not running then holds a block, and
// n + GOMAXPROCS + 2 at least are not running. The 2 spare allow for a
// spinner stopped at the one call in its loop, which saves no registers.
// It takes 10 to 20 ms for every GOMAXPROCS of them, every CPU busy:
// sysmon ends a time slice 10 ms after it sees it begin, and looks every
// 10 ms while it has nothing else to do.
//
// It belongs after mlockall and before the threads turn real-time
// (Options.Realtime): sysmon, which preempts, would then wait for a
// spinning thread's 100 ms time slice to end before it preempts it.
func ReservePreemptState(n int) Step {
	s := Step{Name: "preempt_state"}
	switch {
	case n <= 0:
		s.Done = "none"
		return s
	case xRegStateBytes == 0:
		s.Done = "none: the runtime saves preempted goroutines' registers on their stacks on " + runtime.GOARCH
		return s
	case asyncPreemptOff():
		s.Done = "none: asynchronous preemption is off (GODEBUG asyncpreemptoff=1)"
		return s
	}
	procs := runtime.GOMAXPROCS(0)
	total := n + 2*procs + 2
	deadline := time.Now().Add(preemptWarmLimit)
	var started atomic.Int64
	var stop atomic.Bool
	all := make(chan struct{})
	var done sync.WaitGroup
	done.Add(total)
	for range total {
		go func() {
			defer done.Done()
			if started.Add(1) == int64(total) {
				close(all)
			}
			spin(&stop, deadline)
		}()
	}
	// This goroutine runs again once sysmon has preempted a spinner, or
	// one has given up at the deadline. (Stopping the world would not
	// hurry the spinners: the runtime runs each one it preempts for a
	// stop first again after it.)
	timeout := time.NewTimer(time.Until(deadline))
	select {
	case <-all:
	case <-timeout.C:
	}
	timeout.Stop()
	stop.Store(true)
	done.Wait()
	if got := int(started.Load()); got < total {
		s.Err = fmt.Errorf("only %d of %d spinning goroutines ran within %v (asynchronous preemption off, or the CPUs busy): blocks for %d goroutines preempted at once made, not %d", got, total, preemptWarmLimit, max(0, got-procs), n)
		return s
	}
	s.Done = fmt.Sprintf("%d goroutines preempted at once (%d, one a P, 2 spare): their vector registers saved in %d KiB off the heap, kept for reuse", total-procs, n, int64(total-procs)*xRegStateBytes>>10)
	return s
}

// PreemptStateBytes is the memory ReservePreemptState(n) makes: the
// blocks for n goroutines preempted at once and a block cached on each P,
// and the 2 spare. 0 where it makes none.
func PreemptStateBytes(n int) int64 {
	if n <= 0 || xRegStateBytes == 0 || asyncPreemptOff() {
		return 0
	}
	return int64(n+runtime.GOMAXPROCS(0)+2) * xRegStateBytes
}

// spin returns once stop is set or the deadline has passed. Its inner loop
// makes no calls, so that the runtime can stop it only by preempting it
// asynchronously: stopped at a call, it would save no vector registers.
// The clock, a call, is read every 10 ms or so, between two preemptions.
//
//go:noinline
func spin(stop *atomic.Bool, deadline time.Time) {
	for !stop.Load() && time.Now().Before(deadline) {
		for i := 0; i < 1<<24 && !stop.Load(); i++ {
		}
	}
}

// asyncPreemptOff reports whether GODEBUG, from the environment or the
// program's default (//go:debug, go.mod's godebug), turns asynchronous
// preemption off (asyncpreemptoff, or gccheckmark, which implies it):
// then no goroutine's registers are saved off its stack, and a spinning
// goroutine keeps its CPU until its loop checks the time.
func asyncPreemptOff() bool {
	var def string
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, s := range bi.Settings {
			if s.Key == "DefaultGODEBUG" {
				def = s.Value
			}
		}
	}
	env := os.Getenv("GODEBUG")
	for _, key := range []string{"asyncpreemptoff", "gccheckmark"} {
		if godebugInt(env, key, godebugInt(def, key, 0)) != 0 {
			return true
		}
	}
	return false
}

// godebugInt returns the number a GODEBUG value sets key to, or def if it
// does not; the last setting wins, as in the runtime.
func godebugInt(godebug, key string, def int) int {
	for kv := range strings.SplitSeq(godebug, ",") {
		k, v, ok := strings.Cut(strings.TrimSpace(kv), "=")
		if !ok || k != key {
			continue
		}
		if n, err := strconv.Atoi(v); err == nil {
			def = n
		}
	}
	return def
}
