// Reading a dying serving process's end before wait(2) can, and shutting
// its sockets.

package supervise

import (
	"bytes"
	"errors"
	"slices"
	"strconv"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Everything here runs at the worst moment: the kernel device has lost its
// server, and the kernel's reclaim may be stuck on it. A page the
// supervisor faults in now may have to wait for reclaim, which waits for
// the next server, which waits for the supervisor: a guest froze so, its
// supervisor in a page fault under os.ReadDir. So nothing here allocates:
// /proc is read with system calls into a buffer Run made when it started
// (newScratch, written then, so resident and locked), and paths are built
// in it too. TestShutSockets and TestLifelineHearsADeathBeforeWait check.

// dyingBuf is the size of a dying's buffer: a getdents batch, a status
// file, and room for paths.
const dyingBuf = 64 << 10

// newScratch returns what Run handles a death in: a dying's buffer and a
// handover message (taken), written so that it is resident (and locked,
// under mlockall) before it is needed.
func newScratch() []byte {
	b := make([]byte, max(dyingBuf, maxMessage))
	for i := range b {
		b[i] = 1
	}
	return b
}

// dying is a serving process whose lifeline says it is dying, read
// through a pidfd: /proc/PID names it only while it is not reaped, and
// the pidfd tells whether it still is (a reaped process's PID may be
// another's).
type dying struct {
	pid, pidfd int
	buf        []byte // dyingBuf bytes, faulted in (newScratch)
}

// unreaped reports whether the process has not been waited for: what
// /proc/PID said before this call was its own.
func (d dying) unreaped() bool {
	return unix.PidfdSendSignal(d.pidfd, 0, nil, 0) == nil
}

// The buffer's parts: directory entries, a file's contents, and the paths
// (NUL-terminated) of what is opened.
func (d dying) dents() []byte { return d.buf[:32<<10] }
func (d dying) text() []byte  { return d.buf[32<<10 : 60<<10] }
func (d dying) path() []byte  { return d.buf[60<<10:] }

var errDying = errors.New("supervise: the dying process could not be read")

// Byte strings searched for, made once.
var (
	vmSize       = []byte("\nVmSize:")
	socketPrefix = []byte("socket:[")
	procSelf     = []byte("/proc/self/")
)

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
		ts := unix.NsecToTimespec(int64(pause)) // time.Sleep's timer may be allocated on first use
		_ = unix.Nanosleep(&ts, nil)
	}
	stat, err := d.readFile(d.procPath("stat"))
	if err != nil || !d.unreaped() {
		return 0, false
	}
	code, ok := exitCodeOfStat(stat)
	if !ok {
		return 0, false
	}
	return syscall.WaitStatus(code), true
}

// threadsGone reports whether no thread of the process has an address
// space: /proc/PID/task/TID/status shows VmSize only while it does.
func (d dying) threadsGone() (bool, error) {
	dir := d.procPath("task")
	tasks := d.dents()
	n, err := d.readDir(dir, tasks)
	if err != nil {
		return false, err
	}
	hasMM := false
	eachName(tasks[:n], func(tid []byte) bool {
		p := d.path()[:0]
		p = append(p, "/proc/"...)
		p = strconv.AppendInt(p, int64(d.pid), 10)
		p = append(p, "/task/"...)
		p = append(p, tid...)
		p = append(p, "/status\x00"...)
		status, err := d.readFile(p)
		if err != nil {
			return true // exited and released
		}
		if bytes.Contains(status, vmSize) {
			hasMM = true
			return false
		}
		return true
	})
	if hasMM {
		return false, nil
	}
	if !d.unreaped() {
		return false, errDying
	}
	return true, nil
}

// procPath builds /proc/PID/name, NUL-terminated, in the path buffer.
func (d dying) procPath(name string) []byte {
	p := d.path()[:0]
	p = append(p, "/proc/"...)
	p = strconv.AppendInt(p, int64(d.pid), 10)
	p = append(p, '/')
	p = append(p, name...)
	return append(p, 0)
}

// readFile reads the file at path (NUL-terminated) into the text buffer.
func (d dying) readFile(path []byte) ([]byte, error) {
	fd, err := openat(path, unix.O_RDONLY)
	if err != nil {
		return nil, err
	}
	defer unix.Close(fd)
	buf := d.text()
	n := 0
	for n < len(buf) {
		k, err := unix.Read(fd, buf[n:])
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return nil, err
		}
		if k == 0 {
			break
		}
		n += k
	}
	return buf[:n], nil
}

// readDir reads the entries of the directory at path (NUL-terminated)
// into buf, as getdents64 writes them, and returns their length. A
// directory whose entries do not fit fails.
func (d dying) readDir(path, buf []byte) (int, error) {
	fd, err := openat(path, unix.O_RDONLY|unix.O_DIRECTORY)
	if err != nil {
		return 0, err
	}
	defer unix.Close(fd)
	n := 0
	for {
		k, err := unix.Getdents(fd, buf[n:])
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return 0, err
		}
		if k == 0 {
			return n, nil
		}
		n += k
		if len(buf)-n < 512 {
			return 0, errDying
		}
	}
}

// eachName calls fn with the name of each entry of getdents64's output
// that is a number (a PID or a descriptor), until fn returns false.
func eachName(dents []byte, fn func(name []byte) bool) {
	for len(dents) >= 19 {
		reclen := int(*(*uint16)(unsafe.Pointer(&dents[16])))
		if reclen < 19 || reclen > len(dents) {
			return
		}
		name := dents[19:reclen]
		if i := bytes.IndexByte(name, 0); i >= 0 {
			name = name[:i]
		}
		if len(name) > 0 && name[0] >= '0' && name[0] <= '9' && !fn(name) {
			return
		}
		dents = dents[reclen:]
	}
}

func openat(path []byte, flags int) (int, error) {
	cwd := unix.AT_FDCWD // a variable: the constant is negative
	fd, _, e := unix.Syscall6(unix.SYS_OPENAT, uintptr(cwd), uintptr(unsafe.Pointer(&path[0])),
		uintptr(flags|unix.O_CLOEXEC), 0, 0, 0)
	if e != 0 {
		return -1, e
	}
	return int(fd), nil
}

// exitCodeOfStat returns field 52 of a /proc/PID/stat line, exit_code:
// the process's status in wait(2)'s encoding (0 where the reader may not
// see it, which reads as a clean exit and so leaves the caller to wait).
func exitCodeOfStat(stat []byte) (int, bool) {
	i := bytes.LastIndexByte(stat, ')')
	if i < 0 {
		return 0, false
	}
	const exitCode = 52 - 3 // fields from 3, state
	f, rest := 0, stat[i+1:]
	for {
		rest = bytes.TrimLeft(rest, " \n")
		if len(rest) == 0 {
			return 0, false // Linux before 3.5 has no exit_code
		}
		end := bytes.IndexAny(rest, " \n")
		if end < 0 {
			end = len(rest)
		}
		if f == exitCode {
			return atoiBytes(rest[:end])
		}
		f, rest = f+1, rest[end:]
	}
}

func atoiBytes(b []byte) (int, bool) {
	if len(b) == 0 {
		return 0, false
	}
	n := 0
	for _, c := range b {
		if c < '0' || c > '9' {
			return 0, false
		}
		n = 10*n + int(c-'0')
	}
	return n, true
}

// maxHeld bounds the supervisor's own sockets that shutSockets leaves
// alone: its handover sockets (one a child) and whatever it inherited.
const maxHeld = 256

// shutSockets shuts down every socket of the dead process that the
// supervisor does not hold too, and not the one at descriptor keep. Its
// teardown would close them only when it ends; until then the kernel's
// NBD device would not know its connections dead (and would take no new
// ones), and its listeners would still hold their addresses. It returns
// how many it shut, and the first error.
func (d dying) shutSockets(keep int) (int, error) {
	var mine [maxHeld]uint64
	held, err := d.socketInodes(append(append(d.path()[:0], "/proc/self/fd"...), 0), mine[:0])
	if err != nil {
		return 0, err
	}
	var theirs [2 * maxHeld]uint64 // descriptor, inode pairs
	list, err := d.socketInodes(d.procPath("fd"), theirs[:0])
	if err != nil {
		return 0, err
	}
	if !d.unreaped() {
		return 0, errDying
	}
	n := 0
	var first error
	for i := 0; i+1 < len(list); i += 2 {
		fd, inode := int(list[i]), list[i+1]
		if fd == keep || slices.Contains(held, inode) {
			continue
		}
		dup, err := unix.PidfdGetfd(d.pidfd, fd, 0)
		if err != nil {
			if first == nil {
				first = err
			}
			continue
		}
		if err := unix.Shutdown(dup, unix.SHUT_RDWR); err == nil {
			n++
		} else if err != unix.ENOTCONN && err != unix.EOPNOTSUPP && first == nil {
			first = err
		}
		unix.Close(dup)
	}
	return n, first
}

// socketInodes appends, for each descriptor in the directory at path
// (/proc/PID/fd, NUL-terminated) that is a socket, its inode: after the
// descriptor for /proc/PID/fd, alone for /proc/self/fd.
func (d dying) socketInodes(path []byte, out []uint64) ([]uint64, error) {
	self := bytes.HasPrefix(path, procSelf)
	dents := d.dents()
	n, err := d.readDir(path, dents)
	if err != nil {
		return out, err
	}
	base := len(path) - 1 // before the NUL
	var link [64]byte
	eachName(dents[:n], func(name []byte) bool {
		if len(out)+2 > cap(out) {
			err = errDying
			return false
		}
		p := append(append(append(d.path()[:base], '/'), name...), 0)
		cwd := unix.AT_FDCWD
		k, _, e := unix.Syscall6(unix.SYS_READLINKAT, uintptr(cwd), uintptr(unsafe.Pointer(&p[0])),
			uintptr(unsafe.Pointer(&link[0])), uintptr(len(link)), 0, 0)
		if e != 0 {
			return true // closed meanwhile
		}
		target := link[:k]
		rest, ok := bytes.CutPrefix(target, socketPrefix)
		if !ok || len(rest) < 2 {
			return true
		}
		inode, ok := atoiBytes(rest[:len(rest)-1])
		if !ok {
			return true
		}
		if !self {
			fd, _ := atoiBytes(name)
			out = append(out, uint64(fd))
		}
		out = append(out, uint64(inode))
		return true
	})
	return out, err
}
