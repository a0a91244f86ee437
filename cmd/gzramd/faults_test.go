package main

import (
	"encoding/binary"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/gzramd/gzramd/internal/testneeds"
	"github.com/gzramd/gzramd/pkg/nbd"
)

// TestServingDoesNotFault serves swap-like traffic from a hardened daemon
// and counts the page faults of each of its threads. Under mlockall every
// first touch of a page is a fault, and when gzramd is the swap device a
// fault that needs memory waits for swap-out, which waits for gzramd: the
// machine freezes. Once the daemon has seen each kind of request, only
// the threads that fault memory in ahead of use (the page store's, the
// page table's, the heap's), which may wait, may fault.
func TestServingDoesNotFault(t *testing.T) { testServingDoesNotFault(t, nil) }

// Recording a trace adds nothing that faults to the request path.
func TestServingDoesNotFaultWhileRecording(t *testing.T) {
	d := testServingDoesNotFault(t, nil, "--record-trace", filepath.Join(t.TempDir(), "trace"))
	if v, _ := d.scrape().Value("gzramd_trace_records_total"); v < 4*loadRequests {
		t.Errorf("gzramd_trace_records_total = %v: the load was not recorded", v)
	}
}

// With zstd, libzstd's contexts are made in memory written at start.
func TestServingDoesNotFaultWithZstd(t *testing.T) {
	testServingDoesNotFault(t, nil, "--algorithm", "zstd")
}

// Objects of several pages are read from scratch made at start.
func TestServingDoesNotFaultWithObjects(t *testing.T) {
	d := testServingDoesNotFault(t, nil, "--object-pages", "8")
	if v, _ := d.scrape().Value("gzramd_packed_pages"); v == 0 {
		t.Error("gzramd_packed_pages = 0: no page was kept in an object of several pages")
	}
}

// The dense tier recompresses groups while they are served (idle after
// 1 ms), in memory made at start, and its pages are read from there.
func TestServingDoesNotFaultWithTheDenseTier(t *testing.T) {
	d := testServingDoesNotFault(t, []string{"GZRAMD_FAULT_COMPACT_OFTEN=1"}, "--dense-after", "1ms", "--dense-cpu", "1")
	if v, _ := d.scrape().Value("gzramd_dense_recompressed_groups_total"); v == 0 {
		t.Error("gzramd_dense_recompressed_groups_total = 0: no group went to the dense tier")
	}
	// Compacted every 20 ms (GZRAMD_FAULT_COMPACT_OFTEN): the slabs it
	// gives back are not faulted in by the writers (b61e08b's trims and
	// released slabs alike; with released slabs taken cold, 195-262
	// faults here).
	if v, _ := d.scrape().Value("gzramd_pages_compacted_total"); v == 0 {
		t.Error("gzramd_pages_compacted_total = 0: the store was not compacted while served")
	}
}

// Writers that outrun the prefaulter (bursts of writes against a store
// that holds little ahead, as right after a restart) wait for it rather
// than fault store memory in themselves, and no write fails. Before they
// waited, a guest swapping onto a restarted daemon froze: a writer's
// fault waited on reclaim, which waited on that writer.
func TestServingDoesNotFaultWhenWritersOutrunThePrefaulter(t *testing.T) {
	d := testServingDoesNotFaultUnder(t, swapOutBurst, nil, "--prefault", "1MiB")
	if v, _ := d.scrape().Value("gzramd_store_prefault_misses_total"); v == 0 {
		t.Error("gzramd_store_prefault_misses_total = 0: the writers never outran the prefaulter, as the test meant them to")
	}
}

// A standby gives its heap reserve back until it takes over
// (swapsafe.HeapReserve.GiveBack), and faults it in again as it does: the
// process it becomes serves as the first did, on slabs the first left
// half full.
func TestServingDoesNotFaultAfterATakeover(t *testing.T) {
	d := startFaultsDaemon(t, nil)
	first := d.servingPID()
	if err := swapLikeLoad(dialRaw(t, d.socket).NC, 99, 16, 5, swapLike); err != nil {
		t.Fatal(err)
	}
	d.waitLog(`standby: started ahead and hardened`, 20*time.Second)
	if err := syscall.Kill(first, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	d.waitLog(`the standby serving process takes over`, 20*time.Second)
	d.waitLog(`(?s)gzramd ready.*gzramd ready`, 20*time.Second)
	if d.servingPID() == first {
		t.Fatalf("still the first serving process, %d:\n%s", first, d.log.String())
	}
	urls := regexp.MustCompile(`msg="serving metrics" url=http://([0-9.:]+)/metrics`).FindAllStringSubmatch(d.log.String(), -1)
	d.metrics = urls[len(urls)-1][1]
	serveWithoutFaults(t, d, swapLike)
}

// testServingDoesNotFault runs the test on a daemon started with env and
// args besides the test's own, and returns it.
func testServingDoesNotFault(t *testing.T, env []string, args ...string) *daemonProc {
	t.Helper()
	return testServingDoesNotFaultUnder(t, swapLike, env, args...)
}

// Loads: swap-like (reads and writes of pages that compress about as a
// program's do, trims), or a burst of swap-out (writes only, of pages
// that do not compress, which the store keeps whole: the most store
// memory a write can take), 23 MiB a connection for each load, the four
// loads of two connections within the first 240 MiB of the device.
const (
	swapLike = iota
	swapOutBurst

	burstWrite = 8 << 10
)

// testServingDoesNotFaultUnder is testServingDoesNotFault under a load of
// kind (swapLike, swapOutBurst).
func testServingDoesNotFaultUnder(t *testing.T, kind int, env []string, args ...string) *daemonProc {
	d := startFaultsDaemon(t, env, args...)
	serveWithoutFaults(t, d, kind)
	return d
}

// startFaultsDaemon starts a hardened daemon for the fault tests, or
// skips where mlockall does not take.
func startFaultsDaemon(t *testing.T, env []string, args ...string) *daemonProc {
	t.Helper()
	testneeds.Memlock(t, -1, "the daemon's mlockall (without it, page faults are not locked-memory faults)")
	d := startDaemon(t, env, append([]string{"--size", "256MiB", "--backend", "cpu"}, args...)...)
	if !strings.Contains(d.log.String(), "msg=hardening step=mlockall done=") {
		testneeds.Machine(t, "mlockall, which fails here though the memlock limit allows it (see the daemon's log): without it page faults are not locked-memory faults")
	}
	return d
}

// serveWithoutFaults serves d's serving process a load of kind and fails
// t if any thread but those that fault memory in ahead faulted.
func serveWithoutFaults(t *testing.T, d *daemonProc, kind int) {
	t.Helper()
	pid := d.servingPID()
	conns := []net.Conn{dialRaw(t, d.socket).NC, dialRaw(t, d.socket).NC}
	load := func(seed uint64, inFlight, maxShift int) {
		var wg sync.WaitGroup
		for i, nc := range conns {
			wg.Go(func() {
				if err := swapLikeLoad(nc, seed*16+uint64(i), inFlight, maxShift, kind); err != nil {
					t.Error(err)
				}
			})
		}
		wg.Wait()
	}
	// Warm-up: a few requests at a time, about what the self-test before
	// swapon sends. The kernel then keeps up to 128 requests in flight
	// per connection, of up to 128 KiB (gzramd sets max_sectors_kb).
	load(1, 4, 5)
	allocated := func() float64 {
		m := d.scrape()["go_memstats_alloc_bytes_total"]
		if m == nil || len(m.GetMetric()) == 0 {
			return 0
		}
		return m.GetMetric()[0].GetCounter().GetValue()
	}
	// Scrapes allocate and may fault on their own: outside the count.
	alloc0 := allocated()
	before := threadFaults(t, pid)
	for seed := uint64(2); seed < 5; seed++ {
		load(seed, 128, 5)
	}
	after := threadFaults(t, pid)
	t.Logf("%.0f bytes allocated on the Go heap per request", (allocated()-alloc0)/(3*float64(len(conns))*loadRequests))
	var total int64
	var report []string
	for tid, a := range after {
		n := a.minflt + a.majflt
		if b, ok := before[tid]; ok {
			n -= b.minflt + b.majflt
		} else {
			report = append(report, fmt.Sprintf("thread %d (%s) started during the load", tid, a.comm))
		}
		if n > 0 {
			report = append(report, fmt.Sprintf("thread %d (%s): %d faults", tid, a.comm, n))
			if a.comm != "gzramd-prefault" && a.comm != "gzramd-heaplock" && a.comm != "gzramd-table" {
				total += n
			}
		}
	}
	t.Logf("faults during the load:\n%s", strings.Join(report, "\n"))
	// A handful, not zero: the runtime's own bookkeeping (the first
	// preemption of a goroutine saves its vector registers in fresh
	// memory, and the like) still touches a new page now and then.
	const allowed = 4
	if total > allowed {
		t.Errorf("%d page faults outside gzramd-prefault, gzramd-table and gzramd-heaplock while serving (allowed %d)", total, allowed)
	}
}

type taskFaults struct {
	comm           string
	minflt, majflt int64
}

// threadFaults reads the page fault counts of each thread of pid.
func threadFaults(t *testing.T, pid int) map[int]taskFaults {
	t.Helper()
	dir := fmt.Sprintf("/proc/%d/task", pid)
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	m := make(map[int]taskFaults, len(ents))
	for _, e := range ents {
		tid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		stat, err := os.ReadFile(filepath.Join(dir, e.Name(), "stat"))
		if err != nil {
			continue // the thread ended
		}
		// pid (comm) state ppid ... : comm may hold spaces, so split
		// after its closing parenthesis; minflt and majflt are fields
		// 10 and 12.
		s := string(stat)
		open, end := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')')
		if open < 0 || end < open {
			t.Fatalf("%s/%s/stat: %q", dir, e.Name(), s)
		}
		f := strings.Fields(s[end+1:])
		if len(f) < 10 {
			t.Fatalf("%s/%s/stat: %q", dir, e.Name(), s)
		}
		minflt, _ := strconv.ParseInt(f[7], 10, 64)
		majflt, _ := strconv.ParseInt(f[9], 10, 64)
		m[tid] = taskFaults{comm: s[open+1 : end], minflt: minflt, majflt: majflt}
	}
	return m
}

// swapLikeLoad sends a mix of what the kernel sends a swap device: many
// 4 KiB writes and reads, clustered writes and read-ahead, discards and
// zeroed ranges, over 64 MiB of the device, and checks that every request
// succeeds.
const loadRequests = 3000

// inFlight requests at a time, of up to 4 KiB << maxShift.
func swapLikeLoad(nc net.Conn, seed uint64, inFlight, maxShift, kind int) error {
	const (
		span     = 64 << 20
		requests = loadRequests
	)
	rng := rand.New(rand.NewPCG(seed, 7))
	// Replies come in any order: the reader finds a read's length by
	// its cookie, the index into replyLen.
	var replyLen [requests]atomic.Uint32
	slots := make(chan struct{}, inFlight)
	readErr := make(chan error, 1)
	go func() {
		var rep [16]byte
		discard := make([]byte, 1<<20)
		for range requests {
			err := func() error {
				if _, err := io.ReadFull(nc, rep[:]); err != nil {
					return fmt.Errorf("reading a reply: %w", err)
				}
				cookie := binary.BigEndian.Uint64(rep[8:])
				if errno := binary.BigEndian.Uint32(rep[4:]); errno != 0 || cookie >= requests {
					return fmt.Errorf("request %d failed with NBD error %d", cookie, errno)
				}
				if _, err := io.ReadFull(nc, discard[:replyLen[cookie].Load()]); err != nil {
					return fmt.Errorf("reading a reply's data: %w", err)
				}
				return nil
			}()
			if err != nil {
				nc.Close() // the sender's next write fails
				readErr <- err
				return
			}
			<-slots
		}
		readErr <- nil
	}()
	// A window into content, moved for each write, so that no two
	// writes store the same pages.
	content := make([]byte, 2<<20)
	for i := range content {
		if kind == swapOutBurst {
			content[i] = byte(rng.Uint32())
		} else {
			content[i] = byte(i / 7 * 31 % 251) // compressible, but not same-filled
		}
	}
	hdr := make([]byte, 28)
	var err error
	for cookie := range uint64(requests) {
		var cmd nbd.Command
		length := uint32(4096)
		switch r := rng.IntN(100); {
		case r < 45:
			cmd = nbd.CmdWrite
		case r < 85:
			cmd = nbd.CmdRead
		case r < 92:
			cmd, length = nbd.CmdWrite, 4096<<rng.IntN(maxShift+1)
		case r < 97:
			cmd, length = nbd.CmdRead, 4096<<rng.IntN(maxShift+1)
		case r < 99:
			cmd, length = nbd.CmdTrim, 1<<20
		default:
			cmd, length = nbd.CmdWriteZeroes, 64<<10
		}
		off := uint64(rng.IntN(span/4096)) * 4096
		off = min(off, span-uint64(length))
		if kind == swapOutBurst {
			// Each load of each connection writes a region of its
			// own: pages the store has not held before.
			cmd, length = nbd.CmdWrite, burstWrite
			off = (seed>>4*2+seed&1)*requests*burstWrite + cookie*burstWrite
		}
		binary.BigEndian.PutUint32(hdr[0:], 0x25609513)
		binary.BigEndian.PutUint16(hdr[4:], 0)
		binary.BigEndian.PutUint16(hdr[6:], uint16(cmd))
		binary.BigEndian.PutUint64(hdr[8:], cookie)
		binary.BigEndian.PutUint64(hdr[16:], off)
		binary.BigEndian.PutUint32(hdr[24:], length)
		if cmd == nbd.CmdRead {
			replyLen[cookie].Store(length)
		}
		select {
		case slots <- struct{}{}:
		case err = <-readErr:
			return err
		}
		bufs := net.Buffers{hdr}
		if cmd == nbd.CmdWrite {
			at := int(cookie*4099) % (len(content) - int(length))
			content[at] = byte(cookie)
			bufs = append(bufs, content[at:at+int(length)])
		}
		if _, err = bufs.WriteTo(nc); err != nil {
			err = fmt.Errorf("sending a request: %w", err)
			break
		}
	}
	if rerr := <-readErr; rerr != nil {
		return rerr
	}
	return err
}
