// Package procmem reads what a process holds in memory from /proc: its
// resident set, its proportional share of it, and the anonymous, locked
// and pinned parts, so that gzramd can say what it costs its user.
package procmem

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// Usage is a process's memory, in bytes.
type Usage struct {
	// RSS is what it has resident, shared pages counted whole.
	RSS int64 `json:"rss_bytes"`
	// PSS is its proportional share of that: a page shared by n
	// processes counts 1/n. Summed over processes it counts every page
	// once, which is what the machine pays.
	PSS int64 `json:"pss_bytes"`
	// Anon is its anonymous memory (the Go heap, stacks, C's malloc).
	Anon int64 `json:"anon_bytes"`
	// Locked is what mlock keeps resident.
	Locked int64 `json:"locked_bytes"`
	// Pinned is what drivers pinned for DMA (VmPin).
	Pinned int64 `json:"pinned_bytes"`
}

// Read returns pid's memory from /proc/PID/smaps_rollup and status.
// Reading smaps_rollup walks the process's page tables under its mmap
// lock for reading: a few milliseconds for gigabytes mapped.
func Read(pid int) (Usage, error) {
	var u Usage
	dir := filepath.Join("/proc", strconv.Itoa(pid))
	err := fields(filepath.Join(dir, "smaps_rollup"), map[string]*int64{
		"Rss": &u.RSS, "Pss": &u.PSS, "Anonymous": &u.Anon, "Locked": &u.Locked,
	})
	if err != nil {
		return u, err
	}
	return u, fields(filepath.Join(dir, "status"), map[string]*int64{"VmPin": &u.Pinned})
}

// fields reads "Name:   N kB" lines of path into the named fields, in
// bytes.
func fields(path string, into map[string]*int64) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		name, rest, ok := strings.Cut(sc.Text(), ":")
		p := into[name]
		if !ok || p == nil {
			continue
		}
		f := strings.Fields(rest)
		if len(f) != 2 || f[1] != "kB" {
			return fmt.Errorf("%s: %s: unexpected %q", path, name, rest)
		}
		n, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil {
			return fmt.Errorf("%s: %s: %w", path, name, err)
		}
		*p = n << 10
	}
	return nil
}

// Children returns the pids of pid's children, from every process's
// stat (which names its parent): /proc/PID/task/TID/children exists only
// in kernels built with CONFIG_PROC_CHILDREN.
func Children(pid int) ([]int, error) {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil, err
	}
	var kids []int
	for _, e := range ents {
		child, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if parent, err := Parent(child); err == nil && parent == pid {
			kids = append(kids, child)
		}
	}
	return kids, nil
}

// Parent returns pid's parent, from /proc/PID/stat.
func Parent(pid int) (int, error) {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return 0, err
	}
	// pid (comm) state ppid ...: comm may hold spaces and parentheses.
	end := bytes.LastIndexByte(b, ')')
	if end < 0 {
		return 0, fmt.Errorf("/proc/%d/stat: no command", pid)
	}
	f := strings.Fields(string(b[end+1:]))
	if len(f) < 2 {
		return 0, fmt.Errorf("/proc/%d/stat: no parent", pid)
	}
	return strconv.Atoi(f[1])
}
