// The kernel's swap list and nbd devices: which swap is ours, swapon and swapoff.

package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// swapEntry is one line of /proc/swaps.
type swapEntry struct {
	Path string
	Used int64 // bytes
}

// procSwaps is where the kernel lists active swap; a variable for tests.
var procSwaps = "/proc/swaps"

// activeSwaps lists the active swap areas.
func activeSwaps() ([]swapEntry, error) {
	b, err := os.ReadFile(procSwaps)
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", procSwaps, err)
	}
	return parseSwaps(bytes.NewReader(b))
}

// parseSwaps reads /proc/swaps: a header, then "Filename Type Size Used
// Priority" with sizes in KiB and blanks in names escaped as \040.
func parseSwaps(r io.Reader) ([]swapEntry, error) {
	sc := bufio.NewScanner(r)
	var out []swapEntry
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
			return nil, fmt.Errorf("%s: bad Used field %q", procSwaps, f[3])
		}
		out = append(out, swapEntry{Path: strings.ReplaceAll(f[0], `\040`, " "), Used: used << 10})
	}
	return out, sc.Err()
}

// sysBlock is where block devices are described; a variable for tests.
var sysBlock = "/sys/block"

// nbdPID returns the pid recorded for a connected /dev/nbdN (the process
// that set it up), or 0.
func nbdPID(dev string) int {
	name := filepath.Base(dev)
	b, err := os.ReadFile(filepath.Join(sysBlock, name, "pid"))
	if err != nil {
		return 0
	}
	pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	return pid
}

// ourSwaps returns the active swap areas the daemon's export backs:
// own is a kernel device gzramd attached itself (or ""); other NBD
// devices count when the process that set them up is a peer of one of
// our Unix-socket connections. A TCP connection's peer cannot be told
// apart, so with TCP clients connected every unmatched NBD swap counts
// too, to err on the side of not stopping.
func ourSwaps(own string, tracker *connTracker) ([]swapEntry, error) {
	swaps, err := activeSwaps()
	if err != nil {
		return nil, err
	}
	pids, unknown := tracker.peers()
	var ours []swapEntry
	for _, s := range swaps {
		if !strings.HasPrefix(filepath.Base(s.Path), "nbd") {
			continue
		}
		switch {
		case own != "" && sameFile(s.Path, own):
			ours = append(ours, s)
		case pids[nbdPID(s.Path)]:
			ours = append(ours, s)
		case unknown > 0 && nbdPID(s.Path) != os.Getpid():
			ours = append(ours, s)
		}
	}
	return ours, nil
}

func sameFile(a, b string) bool {
	if a == b {
		return true
	}
	fa, err1 := os.Stat(a)
	fb, err2 := os.Stat(b)
	return err1 == nil && err2 == nil && os.SameFile(fa, fb)
}

// runTool runs an administration tool and folds its output into the error.
func runTool(ctx context.Context, name string, args ...string) error {
	path, err := exec.LookPath(name)
	if err != nil {
		return fmt.Errorf("%s not found (Debian package util-linux): %w", name, err)
	}
	out, err := exec.CommandContext(ctx, path, args...).CombinedOutput()
	if err != nil {
		msg := strings.TrimSpace(string(out))
		if msg == "" {
			return fmt.Errorf("%s %s: %w", name, strings.Join(args, " "), err)
		}
		return fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, msg)
	}
	return nil
}

// enableSwap formats dev as swap and turns it on with discard, so that
// freed swap slots reach the daemon as trims and their memory is given
// back.
func enableSwap(ctx context.Context, dev string, priority int) error {
	if err := runTool(ctx, "mkswap", "--label", "gzramd", dev); err != nil {
		return err
	}
	args := []string{"--discard"}
	if priority >= 0 {
		args = append(args, "--priority", strconv.Itoa(priority))
	}
	return runTool(ctx, "swapon", append(args, dev)...)
}

// disableSwap turns swap on dev off; the kernel reads every page back
// first, so this takes as long as reading the swapped data.
func disableSwap(ctx context.Context, dev string) error {
	return runTool(ctx, "swapoff", dev)
}

// parseDevice accepts /dev/nbdN, nbdN or "auto" (any free device).
func parseDevice(s string) (index int, err error) {
	if s == "auto" {
		return -1, nil
	}
	n, ok := strings.CutPrefix(strings.TrimPrefix(s, "/dev/"), "nbd")
	if ok {
		if i, err := strconv.Atoi(n); err == nil && i >= 0 && strconv.Itoa(i) == n {
			return i, nil
		}
	}
	return 0, errors.New("want /dev/nbdN (e.g. /dev/nbd0) or auto")
}

// swapoffTimeout bounds swapoff at stop; it can take minutes when much
// is swapped out, and systemd's TimeoutStopSec must be longer.
const swapoffTimeout = 30 * time.Minute
