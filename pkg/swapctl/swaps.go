// Package swapctl is gzramd's view of the kernel's swap: which areas are
// active and which of them its export backs, turning swap on and off on a
// block device, and the self-test a device passes before it becomes swap.
package swapctl

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// Area is one active swap area: a line of /proc/swaps.
type Area struct {
	Path string
	Used int64 // bytes
}

// Host reads the kernel's swap areas and block devices from its files.
// The zero value reads the real ones; tests point it at files of their
// own.
type Host struct {
	ProcSwaps string // default /proc/swaps
	SysBlock  string // default /sys/block
}

func (h Host) procSwaps() string {
	if h.ProcSwaps == "" {
		return "/proc/swaps"
	}
	return h.ProcSwaps
}

func (h Host) sysBlock() string {
	if h.SysBlock == "" {
		return "/sys/block"
	}
	return h.SysBlock
}

// Active lists the active swap areas.
func (h Host) Active() ([]Area, error) {
	b, err := os.ReadFile(h.procSwaps())
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", h.procSwaps(), err)
	}
	return parseSwaps(bytes.NewReader(b))
}

// parseSwaps reads /proc/swaps: a header, then "Filename Type Size Used
// Priority" with sizes in KiB and blanks in names escaped as \040.
func parseSwaps(r io.Reader) ([]Area, error) {
	sc := bufio.NewScanner(r)
	var out []Area
	first := true
	for sc.Scan() {
		if first {
			first = false
			continue
		}
		f := strings.Fields(sc.Text())
		if len(f) < 5 {
			continue
		}
		used, err := strconv.ParseInt(f[3], 10, 64)
		if err != nil {
			return nil, fmt.Errorf("swaps: bad Used field %q", f[3])
		}
		out = append(out, Area{Path: strings.ReplaceAll(f[0], `\040`, " "), Used: used << 10})
	}
	return out, sc.Err()
}

// NBDPID returns the pid recorded for a connected /dev/nbdN (the process
// that set it up), or 0.
func (h Host) NBDPID(dev string) int {
	name := filepath.Base(dev)
	b, err := os.ReadFile(filepath.Join(h.sysBlock(), name, "pid"))
	if err != nil {
		return 0
	}
	pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	return pid
}

// Ours returns the active swap areas the daemon's export backs:
// own is a kernel device gzramd attached or created itself (/dev/nbdN,
// /dev/ublkbN; or ""); other NBD devices count when the process that set
// them up is a peer of one of our Unix-socket connections. A TCP connection's peer cannot be told
// apart, so with TCP clients connected every unmatched NBD swap counts
// too, to err on the side of not stopping.
func (h Host) Ours(own string, tracker *Tracker) ([]Area, error) {
	swaps, err := h.Active()
	if err != nil {
		return nil, err
	}
	pids, unknown := tracker.Peers()
	var ours []Area
	for _, s := range swaps {
		if own != "" && SameFile(s.Path, own) {
			// Whatever its kind: a ublk device (/dev/ublkbN) is ours too.
			ours = append(ours, s)
			continue
		}
		if !strings.HasPrefix(filepath.Base(s.Path), "nbd") {
			continue
		}
		switch {
		case pids[h.NBDPID(s.Path)]:
			ours = append(ours, s)
		case unknown > 0 && h.NBDPID(s.Path) != os.Getpid():
			ours = append(ours, s)
		}
	}
	return ours, nil
}

// SameFile reports whether a and b name the same file. A path the kernel
// lists for a swap area is resolved in the mount namespace of whoever
// turned it on: once that namespace is gone (a systemd unit's, after the
// process that ran swapon and everything else in it ended), /proc/swaps
// shows only the device's name under the root ("/nbd0" for /dev/nbd0),
// which then matches by name.
func SameFile(a, b string) bool {
	if a == b {
		return true
	}
	fa, err1 := os.Stat(a)
	fb, err2 := os.Stat(b)
	if err1 == nil && err2 == nil {
		return os.SameFile(fa, fb)
	}
	return detachedName(a, b) || detachedName(b, a)
}

// detachedName reports whether listed is a swap path whose mount is gone
// ("/nbd0", not found) naming the device dev ("/dev/nbd0").
func detachedName(listed, dev string) bool {
	if filepath.Dir(listed) != "/" || !strings.HasPrefix(dev, "/dev/") {
		return false
	}
	if _, err := os.Stat(listed); !errors.Is(err, os.ErrNotExist) {
		return false
	}
	return filepath.Base(listed) == filepath.Base(dev)
}

// InUse reports whether block device dev is held open exclusively (as
// active swap is, and a mounted file system), whatever /proc/swaps says.
func InUse(dev string) bool {
	fd, err := unix.Open(dev, unix.O_RDONLY|unix.O_EXCL|unix.O_CLOEXEC, 0)
	if err != nil {
		return errors.Is(err, unix.EBUSY)
	}
	unix.Close(fd)
	return false
}

// IsSwap reports whether dev is listed as active swap (true when that
// cannot be read, to stay on the safe side).
func (h Host) IsSwap(dev string) bool {
	swaps, err := h.Active()
	if err != nil {
		return true
	}
	for _, s := range swaps {
		if SameFile(s.Path, dev) {
			return true
		}
	}
	return false
}
