// Package osthread runs a goroutine on an operating system thread of its
// own, named, so that stack dumps (sysrq-t, top -H, /proc/PID/task) show
// what that thread is doing.
package osthread

import (
	"runtime"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Run runs fn on a thread locked to it and named name (at most 15 bytes
// show). Never the process's main thread: its name is the process's own
// in ps and top.
func Run(name string, fn func()) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if unix.Gettid() == unix.Getpid() {
		// While this goroutine holds the main thread, the new one gets
		// another.
		done := make(chan struct{})
		go func() {
			defer close(done)
			Run(name, fn)
		}()
		<-done
		return
	}
	b := append([]byte(name), 0)
	_ = unix.Prctl(unix.PR_SET_NAME, uintptr(unsafe.Pointer(&b[0])), 0, 0, 0)
	fn()
}
