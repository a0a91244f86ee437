// Package swapsafe makes a process fit to serve swap: the daemon answers the
// very requests the kernel makes to free memory, so its own memory must not
// be swapped out (mlockall), its allocations must not recurse into I/O on
// its own device (PR_SET_IO_FLUSHER on every thread), the OOM killer must
// leave it alone (oom_score_adj), and its Go heap must stay bounded (a
// runtime memory limit).
//
// Every step is best effort by default: it reports what it did, or why it
// could not (a missing capability, an old kernel), and the caller decides
// whether that is fatal.
package swapsafe

import (
	"cmp"
	"errors"
	"fmt"
	"iter"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Step is the outcome of one hardening step.
type Step struct {
	Name string // "mlockall", "io_flusher", "oom_score_adj", "go_memory_limit", "gc_percent"
	Done string // what was done, when Err is nil
	Err  error  // why it could not be done
	Hint string // what the operator can do about Err
}

// Without says what serving swap risks when the step failed: gzramd
// serves without any of them, and a plain export (no swap) loses nothing
// that matters.
func (s Step) Without() string {
	switch s.Name {
	case "mlockall":
		return "gzramd's own memory may be reclaimed while it serves swap, and bringing it back may wait on gzramd itself: under heavy memory pressure the machine can stall"
	case "io_flusher":
		return "an allocation while storing a page may wait on swap I/O, which waits on gzramd: under heavy memory pressure the machine can stall"
	case "oom_score_adj":
		return "the OOM killer may choose gzramd, and every process with pages in it dies with it"
	case "realtime":
		return "a reply may wait for the CPU behind the processes whose memory the kernel is reclaiming: swap slows under pressure, and a small machine can freeze"
	case "heap_reserve", "heap_top_up", "thread_reserve":
		return "serving may fault in memory while the kernel waits on gzramd to free some"
	}
	return "nothing gzramd needs to serve"
}

// Options choose the steps. The zero value does nothing.
type Options struct {
	LockMemory  bool  // mlockall(MCL_CURRENT|MCL_FUTURE|MCL_ONFAULT)
	OOMScoreAdj *int  // written to /proc/self/oom_score_adj when non-nil (-1000: never kill)
	MemoryLimit int64 // the Go runtime's soft memory limit; 0 leaves it (or GOMEMLIMIT) alone
	GCPercent   int   // debug.SetGCPercent; 0 leaves it (or GOGC) alone
	// Realtime runs every thread (and so every thread started later)
	// SCHED_RR at priority 1. The kernel lets a real-time task allocate
	// below the min watermark (a quarter of it on Linux 6.1, half on
	// later kernels), where any other task must first reclaim: when the
	// kernel waits for gzramd to store swapped pages, gzramd's own
	// allocations (a socket buffer for a reply, a page fault) are exactly
	// those that must not wait for reclaim. It also keeps a busy process
	// from taking the CPU gzramd needs to free memory for it.
	Realtime bool
	// IOFlusher checks that the threads are IO flushers (see ReExecAsIOFlusher,
	// which must have run first) and reports how many are.
	IOFlusher bool
	// Unlocked is read-only data of the program that serving never reads
	// (the GPU kernels' PTX, which only `gzramd gpu-compile` compiles),
	// left out of the program's pages LockMemory faults in and locks.
	Unlocked [][]byte
}

// Apply runs the steps opts asks for, in an order where an earlier failure
// does not prevent a later step, and returns one Step per step asked for.
func Apply(opts Options) []Step {
	var steps []Step
	if opts.MemoryLimit > 0 {
		steps = append(steps, setMemoryLimit(opts.MemoryLimit))
	}
	if opts.GCPercent != 0 {
		old := debug.SetGCPercent(opts.GCPercent)
		steps = append(steps, Step{Name: "gc_percent", Done: fmt.Sprintf("GOGC %d (was %d)", opts.GCPercent, old)})
	}
	if opts.OOMScoreAdj != nil {
		steps = append(steps, setOOMScoreAdj(*opts.OOMScoreAdj))
	}
	if opts.IOFlusher {
		steps = append(steps, checkIOFlusher())
	}
	if opts.LockMemory {
		steps = append(steps, lockMemory(opts.Unlocked))
	}
	if opts.Realtime {
		steps = append(steps, setRealtime())
	}
	return steps
}

// Failed returns the steps that failed.
func Failed(steps []Step) []Step {
	var bad []Step
	for _, s := range steps {
		if s.Err != nil {
			bad = append(bad, s)
		}
	}
	return bad
}

func setMemoryLimit(n int64) Step {
	s := Step{Name: "go_memory_limit"}
	if v := os.Getenv("GOMEMLIMIT"); v != "" {
		// The environment is the operator's word; do not override it.
		s.Done = fmt.Sprintf("left at GOMEMLIMIT=%s from the environment", v)
		return s
	}
	old := debug.SetMemoryLimit(n)
	s.Done = fmt.Sprintf("%d bytes (was %d)", n, old)
	return s
}

func setOOMScoreAdj(v int) Step {
	s := Step{Name: "oom_score_adj"}
	if v < -1000 || v > 1000 {
		s.Err = fmt.Errorf("value %d outside [-1000, 1000]", v)
		return s
	}
	if err := os.WriteFile("/proc/self/oom_score_adj", []byte(strconv.Itoa(v)), 0); err != nil {
		s.Err = err
		if errors.Is(err, os.ErrPermission) {
			s.Hint = "lowering oom_score_adj needs CAP_SYS_RESOURCE (or OOMScoreAdj= in the systemd unit)"
		}
		return s
	}
	got, err := os.ReadFile("/proc/self/oom_score_adj")
	if err != nil {
		s.Err = err
		return s
	}
	s.Done = "set to " + strings.TrimSpace(string(got))
	return s
}

func lockMemory(unlocked [][]byte) Step {
	s := Step{Name: "mlockall"}
	var lim unix.Rlimit
	_ = unix.Getrlimit(unix.RLIMIT_MEMLOCK, &lim)
	if !mayLockFuture(hasCapability(capIPCLock), lim.Cur) {
		// With MCL_FUTURE every later mapping counts against the limit
		// at mmap time: the heap or the page store would fail to grow.
		s.Err = fmt.Errorf("not attempted: RLIMIT_MEMLOCK is %s and CAP_IPC_LOCK is missing, so locking future memory would make allocations fail", rlimitString(lim.Cur))
		s.Hint = "LimitMEMLOCK=infinity in the systemd unit, ulimit -l unlimited, or CAP_IPC_LOCK"
		return s
	}
	// MCL_ONFAULT: lock pages as they are touched, not when mapped. Locking
	// every mapping as it is made (plain MCL_FUTURE) was tried: the Go
	// runtime maps large sparse tables it never fills, and the daemon
	// started with 150 MiB resident instead of 15. What the request path
	// will touch is faulted in ahead instead: the page store's Prefault,
	// and the heap warm-up in the daemon.
	err := unix.Mlockall(unix.MCL_CURRENT | unix.MCL_FUTURE | unix.MCL_ONFAULT)
	if err == nil {
		s.Done = "current and future memory locked (MCL_ONFAULT)"
		n, err := lockMappedFiles("/proc/self/maps", unlocked)
		if err != nil {
			s.Err = fmt.Errorf("memory locked, but faulting in the program's code: %w", err)
			return s
		}
		s.Done += fmt.Sprintf("; program and libraries faulted in (%d MiB)", n>>20)
		return s
	}
	s.Err = err
	switch {
	case errors.Is(err, syscall.EINVAL):
		s.Hint = "MCL_ONFAULT needs Linux 4.4 or later"
	case errors.Is(err, syscall.EPERM), errors.Is(err, syscall.ENOMEM):
		s.Hint = fmt.Sprintf("needs CAP_IPC_LOCK or a larger RLIMIT_MEMLOCK (now %s; LimitMEMLOCK=infinity in the systemd unit, ulimit -l unlimited by hand)", rlimitString(lim.Cur))
	}
	return s
}

// mayLockFuture reports whether mlockall(MCL_FUTURE) leaves the process
// able to map memory: with CAP_IPC_LOCK or an unlimited RLIMIT_MEMLOCK.
func mayLockFuture(capIPCLock bool, memlock uint64) bool {
	return capIPCLock || memlock == unix.RLIM_INFINITY
}

// capIPCLock is CAP_IPC_LOCK's bit (include/uapi/linux/capability.h).
const capIPCLock = 14

// hasCapability reports whether capability bit c is in the effective set,
// from /proc/self/status (false when that cannot be read).
func hasCapability(c uint) bool {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return false
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "CapEff:"); ok {
			mask, err := strconv.ParseUint(strings.TrimSpace(v), 16, 64)
			return err == nil && mask&(1<<c) != 0
		}
	}
	return false
}

func rlimitString(v uint64) string {
	if v == unix.RLIM_INFINITY {
		return "unlimited"
	}
	return strconv.FormatUint(v, 10) + " bytes"
}

// Thread flags of /proc/<pid>/task/<tid>/stat (include/linux/sched.h) that
// PR_SET_IO_FLUSHER sets.
const (
	pfMemallocNoIO  = 0x00080000
	pfLocalThrottle = 0x00100000
)

func checkIOFlusher() Step {
	s := Step{Name: "io_flusher"}
	flushers, threads, err := CountIOFlushers()
	if err != nil {
		s.Err = err
		return s
	}
	if flushers < threads {
		s.Err = fmt.Errorf("%d of %d threads are IO flushers", flushers, threads)
		if why := os.Getenv(reexecFailedEnv); why != "" {
			s.Err = fmt.Errorf("%w: %s", s.Err, why)
		}
		s.Hint = "PR_SET_IO_FLUSHER needs CAP_SYS_RESOURCE and Linux 5.6, and the re-exec that spreads it to every thread"
		return s
	}
	s.Done = fmt.Sprintf("all %d threads", threads)
	return s
}

// CountIOFlushers counts this process's threads that carry the flags
// PR_SET_IO_FLUSHER sets, and all its threads.
func CountIOFlushers() (flushers, threads int, err error) {
	dirs, err := filepath.Glob("/proc/self/task/*/stat")
	if err != nil || len(dirs) == 0 {
		return 0, 0, fmt.Errorf("listing threads in /proc/self/task: %v", err)
	}
	for _, p := range dirs {
		b, err := os.ReadFile(p)
		if err != nil {
			continue // the thread exited
		}
		flags, err := statFlags(string(b))
		if err != nil {
			return 0, 0, fmt.Errorf("%s: %w", p, err)
		}
		threads++
		if ioFlusher(flags) {
			flushers++
		}
	}
	return flushers, threads, nil
}

// threadIsIOFlusher reports whether the calling thread carries the flags
// PR_SET_IO_FLUSHER sets (false when that cannot be read).
func threadIsIOFlusher() bool {
	b, err := os.ReadFile("/proc/thread-self/stat")
	if err != nil {
		return false
	}
	flags, err := statFlags(string(b))
	return err == nil && ioFlusher(flags)
}

// ioFlusher reports whether a thread's flags are those of an IO flusher.
func ioFlusher(flags uint64) bool {
	return flags&(pfMemallocNoIO|pfLocalThrottle) == pfMemallocNoIO|pfLocalThrottle
}

// statFlags returns field 9 (flags) of a stat line. The command name
// (field 2) may hold spaces and parentheses, so fields count from the last ')'.
func statFlags(stat string) (uint64, error) {
	i := strings.LastIndexByte(stat, ')')
	if i < 0 {
		return 0, errors.New("malformed stat line")
	}
	f := strings.Fields(stat[i+1:])
	// f[0] is field 3 (state); flags is field 9.
	if len(f) < 7 {
		return 0, errors.New("short stat line")
	}
	return strconv.ParseUint(f[6], 10, 64)
}

// threadStack is the stack size given to the re-executed daemon's threads.
const threadStack = 2 << 20

// reexecEnv marks a process already re-executed as an IO flusher;
// reexecFailedEnv carries why PR_SET_IO_FLUSHER failed, for the report.
const (
	reexecEnv       = "GZRAMD_IO_FLUSHER_REEXEC"
	reexecFailedEnv = "GZRAMD_IO_FLUSHER_FAILED"
)

// ReExecuted reports whether this process is the one ReExecAsIOFlusher
// executed, until that process calls it again: what it logged before the
// re-exec need not be logged twice.
func ReExecuted() bool { return os.Getenv(reexecEnv) == "1" }

// ReExecAsIOFlusher marks the calling thread PR_SET_IO_FLUSHER and
// re-executes the program on it: the flag is per thread, inherited by
// threads cloned later and kept across execve, so after the re-exec every
// thread the Go runtime starts is an IO flusher. It does not return on
// success. It returns nil at once in the re-executed process, and in a
// process started by an IO flusher (the supervisor's serving process),
// whose threads all descend from a thread that had the flag at exec; it
// returns an error (the process carrying on unchanged) when the flag
// cannot be set.
func ReExecAsIOFlusher() error {
	if os.Getenv(reexecEnv) == "1" {
		os.Unsetenv(reexecEnv)
		return nil
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if threadIsIOFlusher() {
		return nil
	}
	if err := unix.Prctl(unix.PR_SET_IO_FLUSHER, 1, 0, 0, 0); err != nil {
		err = fmt.Errorf("prctl(PR_SET_IO_FLUSHER): %w%s", err, ioFlusherHint(err))
		os.Setenv(reexecFailedEnv, err.Error())
		return err
	}
	exe, err := os.Executable()
	if err != nil {
		return fmt.Errorf("finding the executable to re-exec: %w", err)
	}
	// Threads' stacks come from RLIMIT_STACK (glibc reads it at start);
	// the daemon's threads need far less than the usual 8 MiB, and less
	// stack is less to lock.
	var stack unix.Rlimit
	if unix.Getrlimit(unix.RLIMIT_STACK, &stack) == nil && (stack.Cur == unix.RLIM_INFINITY || stack.Cur > threadStack) {
		stack.Cur = threadStack
		_ = unix.Setrlimit(unix.RLIMIT_STACK, &stack) // best effort: larger stacks only cost memory
	}
	env := append(os.Environ(), reexecEnv+"=1")
	if err := syscall.Exec(exe, os.Args, env); err != nil {
		return fmt.Errorf("re-executing %s: %w", exe, err)
	}
	return nil // not reached
}

func ioFlusherHint(err error) string {
	switch {
	case errors.Is(err, syscall.EPERM):
		return " (needs CAP_SYS_RESOURCE)"
	case errors.Is(err, syscall.EINVAL):
		return " (needs Linux 5.6 or later)"
	}
	return ""
}

// lockMappedFiles faults in and locks every mapping of a file (the
// program's code and data, the C libraries) listed in maps, but for the
// whole pages of unlocked, and returns the bytes locked. Under MCL_ONFAULT
// a page of code runs for the first time with a page fault, and code
// first run while the kernel waits for gzramd to store swapped pages (an
// error path, a rare size of request) would freeze it.
func lockMappedFiles(maps string, unlocked [][]byte) (int64, error) {
	b, err := os.ReadFile(maps)
	if err != nil {
		return 0, err
	}
	holes := pageHoles(unlocked)
	var total int64
	for _, m := range parseMaps(string(b)) {
		if !strings.HasPrefix(m.path, "/") || m.perms == "---p" {
			continue
		}
		for lo, hi := range rangesBetween(m.lo, m.hi, holes) {
			if err := mlockRange(lo, hi); err != nil {
				return total, fmt.Errorf("mlock %#x-%#x (%s): %w", lo, hi, m.path, err)
			}
			total += int64(hi - lo)
		}
	}
	return total, nil
}

// pageHoles returns the whole pages of each of bufs as [lo, hi) ranges,
// in address order.
func pageHoles(bufs [][]byte) [][2]uintptr {
	page := uintptr(os.Getpagesize())
	var holes [][2]uintptr
	for _, b := range bufs {
		if len(b) == 0 {
			continue
		}
		start := uintptr(unsafe.Pointer(unsafe.SliceData(b)))
		lo, hi := (start+page-1)&^(page-1), (start+uintptr(len(b)))&^(page-1)
		if lo < hi {
			holes = append(holes, [2]uintptr{lo, hi})
		}
	}
	slices.SortFunc(holes, func(a, b [2]uintptr) int { return cmp.Compare(a[0], b[0]) })
	return holes
}

// rangesBetween yields the parts of [lo, hi) outside holes (sorted, not
// overlapping).
func rangesBetween(lo, hi uintptr, holes [][2]uintptr) iter.Seq2[uintptr, uintptr] {
	return func(yield func(uintptr, uintptr) bool) {
		for _, h := range holes {
			if h[1] <= lo || h[0] >= hi {
				continue
			}
			if h[0] > lo && !yield(lo, h[0]) {
				return
			}
			lo = max(lo, h[1])
		}
		if lo < hi {
			yield(lo, hi)
		}
	}
}

// mapping is one line of /proc/PID/maps.
type mapping struct {
	lo, hi uintptr
	perms  string // "rw-p" and the like
	path   string // empty for anonymous memory; "[stack]" and the like for the kernel's
}

// parseMaps reads the mappings of a /proc/PID/maps text (start-end perms
// offset dev inode path), skipping lines it cannot read.
func parseMaps(maps string) []mapping { return appendMaps(nil, maps) }

// appendMaps appends the mappings of a /proc/PID/maps text to dst. It
// allocates nothing but dst's growth, and the strings it keeps are parts
// of maps: LockHeap runs it every 250 ms on a thread that may fault.
func appendMaps(dst []mapping, maps string) []mapping {
	for line := range strings.Lines(maps) {
		var f [6]string
		if fields(line, f[:]) < 5 {
			continue
		}
		start, end, ok := strings.Cut(f[0], "-")
		if !ok {
			continue
		}
		lo, err1 := strconv.ParseUint(start, 16, 64)
		hi, err2 := strconv.ParseUint(end, 16, 64)
		if err1 != nil || err2 != nil || hi <= lo {
			continue
		}
		dst = append(dst, mapping{lo: uintptr(lo), hi: uintptr(hi), perms: f[1], path: f[5]})
	}
	return dst
}

// fields fills f with the first len(f) space-separated fields of line, as
// strings.Fields would, without allocating, and returns how many it found.
func fields(line string, f []string) int {
	n := 0
	for n < len(f) {
		line = strings.TrimLeft(line, " \t\n")
		if line == "" {
			break
		}
		end := strings.IndexAny(line, " \t\n")
		if end < 0 {
			end = len(line)
		}
		f[n], line = line[:end], line[end:]
		n++
	}
	return n
}

// mlockRange faults in and locks the pages of [lo, hi): a raw mlock, as
// the range is an address, not Go memory.
func mlockRange(lo, hi uintptr) error {
	if _, _, e := unix.Syscall(unix.SYS_MLOCK, lo, hi-lo, 0); e != 0 {
		return e
	}
	return nil
}

// realtimePriority is the SCHED_RR priority: the lowest, enough to be a
// real-time task for the page allocator and above every normal task.
const realtimePriority = 1

// setRealtime makes every thread SCHED_RR. Threads started later inherit
// the policy from the thread that starts them.
func setRealtime() Step {
	s := Step{Name: "realtime"}
	n, err := setPolicy(unix.SCHED_RR, realtimePriority)
	if err != nil {
		s.Err = err
		if errors.Is(err, syscall.EPERM) {
			s.Hint = "real-time scheduling needs CAP_SYS_NICE (or LimitRTPRIO=1 in the systemd unit); cgroup v1 hosts may also need RT runtime for the group"
		}
		return s
	}
	s.Done = fmt.Sprintf("all %d threads SCHED_RR priority %d", n, realtimePriority)
	return s
}

// DropRealtime puts every thread back to SCHED_NORMAL (see
// Options.Realtime), for a process that turns out to run code that
// busy-waits: a spinning real-time thread takes its CPU from every other
// task.
func DropRealtime() error {
	_, err := setPolicy(unix.SCHED_NORMAL, 0)
	return err
}

// setPolicy sets every thread's scheduling policy and returns how many
// threads it set.
func setPolicy(policy, priority uint32) (int, error) {
	tasks, err := os.ReadDir("/proc/self/task")
	if err != nil {
		return 0, err
	}
	set := 0
	for _, t := range tasks {
		tid, err := strconv.Atoi(t.Name())
		if err != nil {
			continue
		}
		attr := &unix.SchedAttr{Size: unix.SizeofSchedAttr, Policy: policy, Priority: priority}
		if err := unix.SchedSetAttr(tid, attr, 0); err != nil {
			if errors.Is(err, syscall.ESRCH) {
				continue // the thread ended
			}
			return set, fmt.Errorf("sched_setattr on thread %d: %w", tid, err)
		}
		set++
	}
	return set, nil
}
