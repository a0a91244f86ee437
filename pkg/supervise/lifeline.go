// The lifeline: hearing of a serving process's death as it begins, not
// when its teardown ends.

package supervise

import (
	"errors"
	"fmt"
	"runtime"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/gzramd/gzramd/internal/memfd"
)

// EnvLifeline is the descriptor of a serving process's lifeline page,
// which Started.HoldLifeline arms.
const EnvLifeline = "GZRAMD_LIFELINE_FD"

// wait(2) returns only once a dead process is torn down, and a process
// with a CUDA context takes 90-120 ms for that (its driver's files close
// last). Every request the kernel sends meanwhile waits, though nothing
// of the dead process can run any more a fraction of a millisecond after
// the kill.
//
// So each serving process holds a robust futex in a page it shares with
// the supervisor: a thread of its own takes the lock and never lets go.
// As that thread exits, before its memory is released, the kernel marks
// the lock FUTEX_OWNER_DIED and wakes the supervisor (exit_mm,
// exit_robust_list). The supervisor then waits until no thread of the
// process has its memory (none can run user code or be inside a system
// call), reads how it ended from /proc, and shuts down its sockets, which
// its teardown would otherwise keep open: the kernel's NBD device notices
// its dead connections at once and the next serving process can listen
// where it listened. Only then is the next one let go.
//
// The page holds the lock word, the word the supervisor sets to end its
// watch, and the holder's robust list: its head and its one entry, which
// the kernel reads from the holder's own mapping as the holder exits.
const (
	lifelineLock   = 0   // the holder's thread ID, then FUTEX_OWNER_DIED
	lifelineClosed = 4   // the supervisor's: its watch is to end
	lifelineHead   = 64  // struct robust_list_head: next, futex_offset, list_op_pending
	lifelineEntry  = 128 // struct robust_list: next
	lifelineSize   = 4096
)

// The lock word's bits (linux/futex.h).
const (
	futexWaiters   = 0x80000000
	futexOwnerDied = 0x40000000
	futexTIDMask   = 0x3fffffff
)

// lifeline is the supervisor's side of one serving process's lifeline.
type lifeline struct {
	file *memfd.File // the child's descriptor, until it starts
	mem  []byte
	died chan struct{} // closed once the holder's lock is found dead
	done chan struct{} // closed when watch returns
}

func newLifeline() (*lifeline, error) {
	f, err := memfd.Create("gzramd-lifeline")
	if err != nil {
		return nil, err
	}
	if err := f.Grow(lifelineSize); err != nil {
		f.Close()
		return nil, err
	}
	mem, err := f.Map(0, lifelineSize)
	if err != nil {
		f.Close()
		return nil, err
	}
	return &lifeline{file: f, mem: mem, died: make(chan struct{}), done: make(chan struct{})}, nil
}

func (l *lifeline) word(off int) *uint32 { return (*uint32)(unsafe.Pointer(&l.mem[off])) }

// started drops the supervisor's descriptor (the child has its own) and
// starts the watch.
func (l *lifeline) started() {
	l.file.Close()
	l.file = nil
	go l.watch()
}

// watch waits until the lock is marked dead, or close asks it to end.
func (l *lifeline) watch() {
	defer close(l.done)
	lock, closed := l.word(lifelineLock), l.word(lifelineClosed)
	for atomic.LoadUint32(closed) == 0 {
		v := atomic.LoadUint32(lock)
		if v&futexOwnerDied != 0 {
			close(l.died)
			return
		}
		// The kernel wakes a waiter only if the word says there is one.
		if v != 0 && v&futexWaiters == 0 {
			if !atomic.CompareAndSwapUint32(lock, v, v|futexWaiters) {
				continue
			}
			v |= futexWaiters
		}
		_ = futexWait(lock, v) // woken, changed under it, or interrupted: look again
	}
}

// close ends the watch and unmaps the page. A wake can come between the
// watch's look at the closed word and its wait, so it is sent until the
// watch has ended.
func (l *lifeline) close() {
	if l.file != nil {
		l.file.Close()
	}
	atomic.StoreUint32(l.word(lifelineClosed), 1)
	if l.file == nil { // the watch runs only once started
		l.endWatch()
	}
	_ = unix.Munmap(l.mem)
}

// endWatch wakes the watch until it has seen the closed word and ended.
func (l *lifeline) endWatch() {
	ms := unix.NsecToTimespec(int64(time.Millisecond))
	for {
		futexWake(l.word(lifelineLock))
		select {
		case <-l.done:
			return
		default:
			_ = unix.Nanosleep(&ms, nil) // no timer to allocate: it may run at a death
		}
	}
}

// holdLifeline arms the lifeline page at descriptor fd (see
// Started.HoldLifeline).
func holdLifeline(fd int) error {
	f, err := memfd.Open(fd)
	if err != nil {
		return fmt.Errorf("supervise: lifeline: %w", err)
	}
	mem, err := f.Map(0, lifelineSize)
	f.Close() // the mapping stays
	if err != nil {
		return fmt.Errorf("supervise: lifeline: %w", err)
	}
	armed := make(chan error, 1)
	go func() {
		// Never unlocked: the thread holds the lock until the process
		// ends, and its exit is what releases it.
		runtime.LockOSThread()
		armed <- hold(mem)
		select {}
	}()
	return <-armed
}

// hold makes the calling thread's robust list the page's one entry, whose
// lock is the page's lock word, and takes the lock.
func hold(mem []byte) error {
	base := uintptr(unsafe.Pointer(&mem[0]))
	head := (*[3]uintptr)(unsafe.Pointer(&mem[lifelineHead]))
	entry := (*uintptr)(unsafe.Pointer(&mem[lifelineEntry]))
	*entry = base + lifelineHead                  // the list is circular: back to its head
	offset := int64(lifelineLock - lifelineEntry) // from the entry to its lock, a signed long
	head[1] = uintptr(offset)
	head[2] = 0
	head[0] = base + lifelineEntry
	if _, _, e := unix.RawSyscall(unix.SYS_SET_ROBUST_LIST, base+lifelineHead, unsafe.Sizeof(*head), 0); e != 0 {
		return fmt.Errorf("supervise: lifeline: set_robust_list: %w", e)
	}
	lock := (*uint32)(unsafe.Pointer(&mem[lifelineLock]))
	tid := uint32(unix.Gettid()) & futexTIDMask
	if !atomic.CompareAndSwapUint32(lock, 0, tid) {
		return errors.New("supervise: lifeline: its lock is taken already")
	}
	futexWake(lock) // a supervisor waiting for the lock to be taken
	return nil
}

// Futex operations on a word shared between processes: no
// FUTEX_PRIVATE_FLAG, as the kernel's wake at a robust owner's death is
// shared too.
const (
	futexWaitOp = 0 // FUTEX_WAIT
	futexWakeOp = 1 // FUTEX_WAKE
)

func futexWait(addr *uint32, val uint32) error {
	_, _, e := unix.Syscall6(unix.SYS_FUTEX, uintptr(unsafe.Pointer(addr)), futexWaitOp, uintptr(val), 0, 0, 0)
	if e != 0 {
		return e
	}
	return nil
}

func futexWake(addr *uint32) {
	_, _, _ = unix.Syscall6(unix.SYS_FUTEX, uintptr(unsafe.Pointer(addr)), futexWakeOp, uintptr(^uint32(0)>>1), 0, 0, 0)
}
