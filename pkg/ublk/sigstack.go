// The queue thread's signal stack, resident before it serves.

package ublk

import (
	"fmt"
	"os"
	"unsafe"

	"golang.org/x/sys/unix"
)

// ssDisable is SS_DISABLE: the thread has no alternate signal stack.
const ssDisable = 2

// signalStack is the kernel's stack_t.
type signalStack struct {
	sp    uintptr
	flags int32
	size  uintptr
}

// currentSignalStack is the calling thread's alternate signal stack.
func currentSignalStack() (signalStack, error) {
	var ss signalStack
	if _, _, errno := unix.RawSyscall(unix.SYS_SIGALTSTACK, 0, uintptr(unsafe.Pointer(&ss)), 0); errno != 0 {
		return ss, fmt.Errorf("sigaltstack: %w", errno)
	}
	return ss, nil
}

// pages is the page-aligned range that holds the stack.
func (ss signalStack) pages() (start, end uintptr) {
	page := uintptr(os.Getpagesize())
	return ss.sp &^ (page - 1), (ss.sp + ss.size + page - 1) &^ (page - 1)
}

// signalStackResident makes the calling thread's alternate signal stack
// resident and writable. The Go runtime preempts a goroutine by a signal
// (SIGURG), and the kernel writes the signal's frame (registers, FPU
// state) on that stack: on a page never written before, a page is
// allocated while the queue serves, and with the device as swap that
// allocation may wait for reclaim to write to the device. Seen in the e2e
// guest: a queue's thread in do_anonymous_page under
// copy_fpstate_to_sigframe, throttled in direct reclaim, with the swap
// writes it was to serve, the hog and kswapd waiting on it for minutes.
// MADV_POPULATE_WRITE faults each page in as a write would, writing
// nothing: a signal may be on the stack meanwhile.
func signalStackResident() error {
	ss, err := currentSignalStack()
	if err != nil {
		return err
	}
	if ss.flags&ssDisable != 0 || ss.size == 0 {
		// Signals run on the goroutine's stack, grown before serving.
		return nil
	}
	start, end := ss.pages()
	if _, _, errno := unix.Syscall(unix.SYS_MADVISE, start, end-start, unix.MADV_POPULATE_WRITE); errno != 0 {
		return fmt.Errorf("making the signal stack resident (MADV_POPULATE_WRITE, Linux 5.14): %w", errno)
	}
	return nil
}
