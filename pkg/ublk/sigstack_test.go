package ublk

import (
	"os"
	"runtime"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"
)

// A queue's thread has every page of its signal stack resident before it
// serves: the Go runtime's preemption signal writes its frame there.
func TestSignalStackResident(t *testing.T) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		// A thread of its own, ended with the goroutine (locked and never
		// unlocked), as a queue's is.
		runtime.LockOSThread()
		if err := signalStackResident(); err != nil {
			t.Error(err)
			return
		}
		ss, err := currentSignalStack()
		if err != nil {
			t.Error(err)
			return
		}
		if ss.flags&ssDisable != 0 || ss.size == 0 {
			t.Errorf("the Go runtime gave this thread no signal stack (flags %#x, size %d)", ss.flags, ss.size)
			return
		}
		start, end := ss.pages()
		vec := make([]byte, (end-start)/uintptr(os.Getpagesize()))
		if _, _, errno := unix.Syscall(unix.SYS_MINCORE, start, end-start, uintptr(unsafe.Pointer(&vec[0]))); errno != 0 {
			t.Error(errno)
			return
		}
		for i, v := range vec {
			if v&1 == 0 {
				t.Errorf("page %d of %d of the signal stack is not resident", i, len(vec))
			}
		}
		t.Logf("signal stack: %d bytes, %d pages resident", ss.size, len(vec))
	}()
	<-done
}
