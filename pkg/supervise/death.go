// Reading a dying serving process's end before wait(2) can, and shutting
// its sockets.

package supervise

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// dying is a serving process whose lifeline says it is dying, read
// through a pidfd: /proc/PID names it only while it is not reaped, and
// the pidfd tells whether it still is (a reaped process's PID may be
// another's).
type dying struct {
	pid, pidfd int
}

// unreaped reports whether the process has not been waited for: what
// /proc/PID said before this call was its own.
func (d dying) unreaped() bool {
	return unix.PidfdSendSignal(d.pidfd, 0, nil, 0) == nil
}

// end waits, at most limit, until none of the process's threads has its
// memory any more — each has passed exit_mm, so none runs user code or is
// inside a system call — and returns the wait status the process will
// have (the exit_code of /proc/PID/stat, set before exit_mm). ok is false
// if that could not be read: the caller waits for wait(2) instead.
func (d dying) end(limit time.Duration) (ws syscall.WaitStatus, ok bool) {
	deadline := time.Now().Add(limit)
	for pause := 20 * time.Microsecond; ; pause = min(2*pause, time.Millisecond) {
		gone, err := d.threadsGone()
		if err != nil {
			return 0, false
		}
		if gone {
			break
		}
		if time.Now().After(deadline) {
			return 0, false
		}
		time.Sleep(pause)
	}
	stat, err := os.ReadFile("/proc/" + strconv.Itoa(d.pid) + "/stat")
	if err != nil || !d.unreaped() {
		return 0, false
	}
	code, err := exitCodeOfStat(string(stat))
	if err != nil {
		return 0, false
	}
	return syscall.WaitStatus(code), true
}

// threadsGone reports whether no thread of the process has an address
// space: /proc/PID/task/TID/status shows VmSize only while it does.
func (d dying) threadsGone() (bool, error) {
	dir := "/proc/" + strconv.Itoa(d.pid) + "/task"
	tasks, err := os.ReadDir(dir)
	if err != nil {
		return false, err
	}
	for _, t := range tasks {
		status, err := os.ReadFile(dir + "/" + t.Name() + "/status")
		if err != nil {
			continue // exited and released
		}
		if strings.Contains(string(status), "\nVmSize:") {
			return false, nil
		}
	}
	if !d.unreaped() {
		return false, errors.New("reaped")
	}
	return true, nil
}

// exitCodeOfStat returns field 52 of a /proc/PID/stat line, exit_code:
// the process's status in wait(2)'s encoding (0 where the reader may not
// see it, which reads as a clean exit and so leaves the caller to wait).
func exitCodeOfStat(stat string) (int, error) {
	i := strings.LastIndexByte(stat, ')')
	if i < 0 {
		return 0, errors.New("malformed /proc/PID/stat")
	}
	fields := strings.Fields(stat[i+1:]) // from field 3, state
	const exitCode = 52 - 3
	if len(fields) <= exitCode {
		return 0, errors.New("/proc/PID/stat has no exit_code (Linux before 3.5)")
	}
	return strconv.Atoi(fields[exitCode])
}

// shutSockets shuts down every socket of the dead process that the
// supervisor does not hold too, and not the one at descriptor keep. Its
// teardown would close them only when it ends; until then the kernel's
// NBD device would not know its connections dead (and would take no new
// ones), and its listeners would still hold their addresses. It returns
// how many it shut.
func (d dying) shutSockets(keep int) (int, error) {
	held, err := socketInodes("self")
	if err != nil {
		return 0, err
	}
	mine := make(map[string]bool, len(held))
	for _, inode := range held {
		mine[inode] = true
	}
	theirs, err := socketInodes(strconv.Itoa(d.pid))
	if err != nil {
		return 0, err
	}
	if !d.unreaped() {
		return 0, errors.New("reaped")
	}
	n := 0
	var errs []error
	for fd, inode := range theirs {
		if fd == keep || mine[inode] {
			continue
		}
		dup, err := unix.PidfdGetfd(d.pidfd, fd, 0)
		if err != nil {
			errs = append(errs, fmt.Errorf("pidfd_getfd of descriptor %d: %w", fd, err))
			continue
		}
		if err := unix.Shutdown(dup, unix.SHUT_RDWR); err == nil {
			n++
		} else if !errors.Is(err, unix.ENOTCONN) && !errors.Is(err, unix.EOPNOTSUPP) {
			errs = append(errs, fmt.Errorf("shutdown of descriptor %d: %w", fd, err))
		}
		unix.Close(dup)
	}
	return n, errors.Join(errs...)
}

// socketInodes maps the descriptors of /proc/PROC/fd that are sockets to
// their inodes.
func socketInodes(proc string) (map[int]string, error) {
	dir := "/proc/" + proc + "/fd"
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	socks := make(map[int]string)
	for _, e := range entries {
		fd, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		target, err := os.Readlink(dir + "/" + e.Name())
		if err != nil {
			continue
		}
		if inode, ok := strings.CutPrefix(target, "socket:["); ok {
			socks[fd] = strings.TrimSuffix(inode, "]")
		}
	}
	return socks, nil
}
