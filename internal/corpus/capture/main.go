// Command capture makes a corpus of memory pages from this machine: the
// resident anonymous pages of its largest processes (or of those named),
// sampled evenly, written as one zstd stream of 4 KiB pages that
// internal/corpus loads (GZRAMD_CORPUS). Reading another process's memory
// needs root (CAP_SYS_PTRACE).
//
//	go run ./internal/corpus/capture -o /tmp/memory-pages.bin.zst
//	go run ./internal/corpus/capture -o pages.bin.zst -pid 1234,5678 -pages 8192
//
// The pages are the processes' own data: keep the file private.
package main

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/klauspost/compress/zstd"

	"github.com/gzramd/gzramd/internal/corpus"
)

// segment is one process's part of the corpus, as ../shared/corpus's
// manifest.json lists them.
type segment struct {
	Workload  string `json:"workload"`
	PID       int    `json:"pid"`
	FirstPage int    `json:"first_page"`
	Pages     int    `json:"pages"`
	ZeroPages int    `json:"zero_pages"`
}

type manifest struct {
	PageSize int       `json:"page_size"`
	Segments []segment `json:"segments"`
}

func main() {
	out := flag.String("o", "", "the corpus file to write (zstd); its manifest goes beside it as FILE.json")
	pidList := flag.String("pid", "", "comma-separated processes to read (default: the -procs largest by anonymous memory)")
	procs := flag.Int("procs", 6, "how many of the largest processes to read when -pid is not given")
	perProcess := flag.Int("pages", 4096, "at most this many pages from each process, sampled evenly")
	flag.Parse()
	if *out == "" || *perProcess <= 0 {
		fmt.Fprintln(os.Stderr, "capture: -o FILE is required, and -pages must be positive")
		flag.Usage()
		os.Exit(2)
	}
	pids, err := parsePIDs(*pidList)
	if err == nil && len(pids) == 0 {
		pids, err = largestProcesses(*procs)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "capture:", err)
		os.Exit(1)
	}
	if err := run(*out, pids, *perProcess); err != nil {
		fmt.Fprintln(os.Stderr, "capture:", err)
		os.Exit(1)
	}
}

func run(out string, pids []int, perProcess int) error {
	f, err := os.OpenFile(out, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	zw, err := zstd.NewWriter(f, zstd.WithEncoderLevel(zstd.SpeedBetterCompression))
	if err != nil {
		f.Close()
		return err
	}
	m, err := capture(zw, pids, perProcess, os.Stderr)
	if cerr := zw.Close(); err == nil {
		err = cerr
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(out)
		return err
	}
	js, _ := json.MarshalIndent(m, "", " ")
	if err := os.WriteFile(out+".json", append(js, '\n'), 0o600); err != nil {
		return err
	}
	total := 0
	for _, s := range m.Segments {
		total += s.Pages
	}
	fmt.Fprintf(os.Stderr, "capture: %d pages from %d processes in %s (manifest %s.json); use it with %s=%s\n",
		total, len(m.Segments), out, out, corpus.EnvPath, out)
	return nil
}

// capture writes up to perProcess resident anonymous pages of each of pids
// to w and returns what it wrote. A process it cannot read is reported on
// log and left out; none readable is an error.
func capture(w io.Writer, pids []int, perProcess int, log io.Writer) (manifest, error) {
	m := manifest{PageSize: corpus.PageSize}
	next := 0
	page := make([]byte, corpus.PageSize)
	for _, pid := range pids {
		addrs, err := residentAnonPages(pid)
		if err != nil {
			fmt.Fprintf(log, "capture: pid %d left out: %v\n", pid, err)
			continue
		}
		mem, err := os.Open(fmt.Sprintf("/proc/%d/mem", pid))
		if err != nil {
			fmt.Fprintf(log, "capture: pid %d left out: %v\n", pid, err)
			continue
		}
		s := segment{Workload: comm(pid), PID: pid, FirstPage: next}
		for _, a := range sample(addrs, perProcess) {
			if _, err := mem.ReadAt(page, int64(a)); err != nil {
				continue // unmapped since its maps were read
			}
			if _, err := w.Write(page); err != nil {
				mem.Close()
				return m, err
			}
			if !slices.ContainsFunc(page, func(b byte) bool { return b != 0 }) {
				s.ZeroPages++
			}
			s.Pages++
		}
		mem.Close()
		if s.Pages > 0 {
			m.Segments = append(m.Segments, s)
			next += s.Pages
		}
	}
	if next == 0 {
		return m, errors.New("no pages read from any process (reading another process's memory needs root)")
	}
	return m, nil
}

// residentAnonPages returns the address of each resident page of pid's
// private, writable, anonymous mappings (heap, stacks, anonymous mmaps).
func residentAnonPages(pid int) ([]uint64, error) {
	maps, err := os.ReadFile(fmt.Sprintf("/proc/%d/maps", pid))
	if err != nil {
		return nil, err
	}
	pagemap, err := os.Open(fmt.Sprintf("/proc/%d/pagemap", pid))
	if err != nil {
		return nil, err
	}
	defer pagemap.Close()
	var addrs []uint64
	entries := make([]byte, 8*512)
	for line := range strings.Lines(string(maps)) {
		f := strings.Fields(line)
		if len(f) < 5 || f[1] != "rw-p" || len(f) > 5 && f[5] != "[heap]" && !strings.HasPrefix(f[5], "[stack") && !strings.HasPrefix(f[5], "[anon") {
			continue
		}
		lo, hi, ok := strings.Cut(f[0], "-")
		if !ok {
			continue
		}
		start, err1 := strconv.ParseUint(lo, 16, 64)
		end, err2 := strconv.ParseUint(hi, 16, 64)
		if err1 != nil || err2 != nil {
			continue
		}
		for a := start; a < end; {
			n := min((end-a)/corpus.PageSize, uint64(len(entries)/8))
			got, err := pagemap.ReadAt(entries[:8*n], int64(a/corpus.PageSize*8))
			if err != nil && got == 0 {
				break
			}
			for i := 0; i+8 <= got; i += 8 {
				if binary.LittleEndian.Uint64(entries[i:])&(1<<63) != 0 { // present
					addrs = append(addrs, a+uint64(i/8)*corpus.PageSize)
				}
			}
			a += n * corpus.PageSize
		}
	}
	return addrs, nil
}

// sample returns at most n of addrs, evenly spread.
func sample(addrs []uint64, n int) []uint64 {
	if len(addrs) <= n {
		return addrs
	}
	out := make([]uint64, n)
	for i := range out {
		out[i] = addrs[i*len(addrs)/n]
	}
	return out
}

// largestProcesses returns the n processes with the most anonymous
// resident memory, other than this one.
func largestProcesses(n int) ([]int, error) {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil, err
	}
	type proc struct{ pid, anonKB int }
	var ps []proc
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		status, err := os.ReadFile(filepath.Join("/proc", e.Name(), "status"))
		if err != nil {
			continue
		}
		for line := range strings.Lines(string(status)) {
			if v, ok := strings.CutPrefix(line, "RssAnon:"); ok {
				kb, _ := strconv.Atoi(strings.TrimSuffix(strings.TrimSpace(v), " kB"))
				ps = append(ps, proc{pid, kb})
			}
		}
	}
	slices.SortFunc(ps, func(a, b proc) int { return b.anonKB - a.anonKB })
	var pids []int
	for _, p := range ps[:min(n, len(ps))] {
		pids = append(pids, p.pid)
	}
	if len(pids) == 0 {
		return nil, errors.New("no process with anonymous memory found in /proc")
	}
	return pids, nil
}

func parsePIDs(list string) ([]int, error) {
	var pids []int
	for f := range strings.SplitSeq(list, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		pid, err := strconv.Atoi(f)
		if err != nil || pid <= 0 {
			return nil, fmt.Errorf("-pid: %q is not a process ID", f)
		}
		pids = append(pids, pid)
	}
	return pids, nil
}

func comm(pid int) string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
	if err != nil {
		return "pid" + strconv.Itoa(pid)
	}
	return strings.TrimSpace(string(b))
}
