package ublk

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/gzramd/gzramd/internal/testneeds"
	"github.com/gzramd/gzramd/pkg/blockdev"
	"github.com/gzramd/gzramd/pkg/nbd"
	"github.com/gzramd/gzramd/pkg/nbddev"
	"github.com/gzramd/gzramd/pkg/swapsafe"
)

// needDriver skips a test that needs a ublk driver and root where either
// is missing (this is most machines: the e2e guest's 6.12 kernel has one,
// test/e2e's ublk scenario).
func needDriver(t *testing.T) {
	t.Helper()
	if _, err := os.Stat(DefaultControlPath); err != nil {
		testneeds.Skip(t, testneeds.KindModule, "ublk_drv", "%s: %v (modprobe ublk_drv; Linux 6.5 or later with USER_COPY; or E2E_SCENARIOS=ublk ./test/e2e/run.sh)", DefaultControlPath, err)
	}
	testneeds.Root(t, "creating a ublk device")
}

// served is a device Serve serves from a memory backend for one test.
type served struct {
	dev  Device
	mem  *memBackend  // where the backend is one
	stop func() error // cancels Serve and returns its error
}

func serveMem(t *testing.T, cfg Config, size int64) *served {
	t.Helper()
	m := newMemBackend(size)
	s := serveBackend(t, cfg, m)
	s.mem = m
	return s
}

func serveBackend(t *testing.T, cfg Config, b blockdev.Backend) *served {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	ready := make(chan Device, 1)
	errc := make(chan error, 1)
	cfg.Ready = func(d Device) { ready <- d }
	go func() { errc <- Serve(ctx, cfg, b) }()
	s := &served{}
	select {
	case s.dev = <-ready:
	case err := <-errc:
		cancel()
		t.Fatalf("Serve: %v", err)
	case <-time.After(60 * time.Second):
		cancel()
		t.Fatal("no device after 60 s")
	}
	var stopped bool
	var stopErr error
	s.stop = func() error {
		if !stopped {
			stopped = true
			cancel()
			stopErr = <-errc
		}
		return stopErr
	}
	t.Cleanup(func() { s.stop() })
	t.Logf("serving %s: %d queues of depth %d, requests of at most %d bytes, flags %#x",
		s.dev.Block, s.dev.Queues, s.dev.Depth, s.dev.MaxIOBytes, s.dev.Flags)
	return s
}

// alignedBuf is memory O_DIRECT takes: page-aligned.
func alignedBuf(t *testing.T, n int) []byte {
	t.Helper()
	b, err := unix.Mmap(-1, 0, n, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Munmap(b) })
	return b
}

func openDirect(t *testing.T, path string) *os.File {
	t.Helper()
	f, err := os.OpenFile(path, os.O_RDWR|unix.O_DIRECT, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}

func TestBlockDevice(t *testing.T) {
	needDriver(t)
	const size = 64 << 20
	s := serveMem(t, Config{}, size)
	f := openDirect(t, s.dev.Block)

	t.Run("size", func(t *testing.T) {
		var n uint64
		if _, _, errno := unix.Syscall(unix.SYS_IOCTL, f.Fd(), unix.BLKGETSIZE64, uintptr(unsafe.Pointer(&n))); errno != 0 {
			t.Fatal(errno)
		}
		if n != size {
			t.Errorf("BLKGETSIZE64 %d, want %d", n, size)
		}
		lbs, err := unix.IoctlGetInt(int(f.Fd()), unix.BLKSSZGET)
		if err != nil || lbs != 4096 {
			t.Errorf("logical block size %d (%v), want 4096", lbs, err)
		}
	})

	t.Run("patterns", func(t *testing.T) {
		buf := alignedBuf(t, 1<<20)
		got := alignedBuf(t, 1<<20)
		// Sizes from a block to several requests' worth, at the start,
		// in the middle and at the very end.
		for i, c := range []struct{ off, n int64 }{
			{0, 4096}, {4096, 8192}, {1 << 20, 64 << 10}, {3<<20 + 4096, 128 << 10},
			{17 << 20, 1 << 20}, {size - 4096, 4096}, {size - 1<<20, 1 << 20},
		} {
			copy(buf, pattern(int(c.n), byte(i+1)))
			if _, err := f.WriteAt(buf[:c.n], c.off); err != nil {
				t.Fatalf("write %d at %d: %v", c.n, c.off, err)
			}
			clear(got)
			if _, err := f.ReadAt(got[:c.n], c.off); err != nil {
				t.Fatalf("read %d at %d: %v", c.n, c.off, err)
			}
			if !bytes.Equal(got[:c.n], buf[:c.n]) {
				t.Errorf("%d bytes at %d: read back differs", c.n, c.off)
			}
			s.mem.mu.Lock()
			held := bytes.Equal(s.mem.data[c.off:c.off+c.n], buf[:c.n])
			s.mem.mu.Unlock()
			if !held {
				t.Errorf("%d bytes at %d: the backend holds something else", c.n, c.off)
			}
		}
	})

	t.Run("dd", func(t *testing.T) {
		dd, ok := testneeds.CommandFor(t, "dd", "coreutils", "writing and reading with dd")
		if !ok {
			return
		}
		dir := t.TempDir()
		in, out := filepath.Join(dir, "in"), filepath.Join(dir, "out")
		data := pattern(256<<10, 0xa5)
		rand.New(rand.NewPCG(1, 2)).Shuffle(len(data), func(i, j int) { data[i], data[j] = data[j], data[i] })
		if err := os.WriteFile(in, data, 0o600); err != nil {
			t.Fatal(err)
		}
		const seek = 5000 // blocks
		run := func(args ...string) {
			t.Helper()
			if b, err := exec.Command(dd, args...).CombinedOutput(); err != nil {
				t.Fatalf("dd %v: %v\n%s", args, err, b)
			}
		}
		run("if="+in, "of="+s.dev.Block, "bs=4096", "seek="+strconv.Itoa(seek), "oflag=direct", "conv=notrunc")
		run("if="+s.dev.Block, "of="+out, "bs=4096", "skip="+strconv.Itoa(seek), "count="+strconv.Itoa(len(data)/4096), "iflag=direct")
		got, err := os.ReadFile(out)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, data) {
			t.Error("dd read back something else than dd wrote")
		}
	})

	t.Run("flush", func(t *testing.T) {
		s.mem.mu.Lock()
		before := s.mem.flushes
		s.mem.mu.Unlock()
		if err := f.Sync(); err != nil {
			t.Fatal(err)
		}
		s.mem.mu.Lock()
		after := s.mem.flushes
		s.mem.mu.Unlock()
		if after == before {
			t.Error("fsync sent no flush")
		}
	})

	t.Run("discard", func(t *testing.T) {
		buf := alignedBuf(t, 64<<10)
		copy(buf, pattern(len(buf), 9))
		const off = 8 << 20
		if _, err := f.WriteAt(buf, off); err != nil {
			t.Fatal(err)
		}
		r := [2]uint64{off + 4096, 32 << 10}
		if _, _, errno := unix.Syscall(unix.SYS_IOCTL, f.Fd(), unix.BLKDISCARD, uintptr(unsafe.Pointer(&r))); errno != 0 {
			t.Fatalf("BLKDISCARD: %v", errno)
		}
		r = [2]uint64{off + 48<<10, 8 << 10}
		if _, _, errno := unix.Syscall(unix.SYS_IOCTL, f.Fd(), unix.BLKZEROOUT, uintptr(unsafe.Pointer(&r))); errno != 0 {
			t.Fatalf("BLKZEROOUT: %v", errno)
		}
		got := alignedBuf(t, 64<<10)
		if _, err := f.ReadAt(got, off); err != nil {
			t.Fatal(err)
		}
		want := slices.Clone(buf)
		clear(want[4096 : 4096+32<<10])
		clear(want[48<<10 : 56<<10])
		if !bytes.Equal(got, want) {
			t.Error("after a discard and a zeroing the device reads something else")
		}
		s.mem.mu.Lock()
		trims, zeroes := s.mem.trims, s.mem.zeroes
		s.mem.mu.Unlock()
		if trims == 0 || zeroes == 0 {
			t.Errorf("the backend saw %d trims and %d zeroings, want both", trims, zeroes)
		}
	})

	t.Run("stop", func(t *testing.T) {
		f.Close()
		if err := s.stop(); err != nil {
			t.Fatalf("Serve after the stop: %v", err)
		}
		if _, err := os.Stat(s.dev.Block); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s after the stop: %v, want it gone", s.dev.Block, err)
		}
	})
}

// TestQD1ReadLatency measures 4 KiB reads at queue depth 1 through a ublk
// device and, where the nbd module is there, through the kernel's NBD
// client to pkg/nbd's server on a unix socket, both served from memory by
// this process: the e2e guest's figures (UBLK_LATENCY_READS, default
// 2000 each).
func TestQD1ReadLatency(t *testing.T) {
	needDriver(t)
	const size = 64 << 20
	n := 2000
	if v, err := strconv.Atoi(os.Getenv("UBLK_LATENCY_READS")); err == nil && v > 0 {
		n = v
	}
	s := serveMem(t, Config{}, size)
	u := qd1Reads(t, openDirect(t, s.dev.Block), size, n)
	t.Logf("QD1 4 KiB random reads, ublk: n=%d p50=%v p90=%v p99=%v", n, u[n/2], u[n*9/10], u[n*99/100])
	path, ok := attachNBD(t, newMemBackend(size))
	if !ok {
		return
	}
	b := qd1Reads(t, openDirect(t, path), size, n)
	t.Logf("QD1 4 KiB random reads, nbd: n=%d p50=%v p90=%v p99=%v", n, b[n/2], b[n*9/10], b[n*99/100])
	t.Logf("QD1 4 KiB random reads, ublk/nbd: p50 %.2f p99 %.2f",
		float64(u[n/2])/float64(b[n/2]), float64(u[n*99/100])/float64(b[n*99/100]))
}

// attachNBD serves m with pkg/nbd on a unix socket and attaches a kernel
// /dev/nbdN to it, for the comparison; false (the part noted) where the
// nbd module is missing.
func attachNBD(t *testing.T, m *memBackend) (string, bool) {
	t.Helper()
	if _, err := os.Stat("/sys/module/nbd"); err != nil {
		testneeds.Part(t, testneeds.KindModule, "nbd", "the comparison with NBD (modprobe nbd)")
		return "", false
	}
	srv, err := nbd.NewServer([]nbd.Export{{Name: "mem", Backend: m}}, nbd.Options{})
	if err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(t.TempDir(), "nbd.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ln)
	ctx := context.Background()
	d, err := nbddev.Attach(ctx, nbddev.Options{Network: "unix", Address: sock, Export: "mem", Index: nbddev.AnyIndex})
	if err != nil {
		srv.Shutdown(ctx)
		t.Fatalf("attaching /dev/nbdN: %v", err)
	}
	t.Cleanup(func() {
		if err := d.Detach(); err != nil {
			t.Error(err)
		}
		srv.Shutdown(ctx)
	})
	return d.Path, true
}

// qd1Reads reads n random 4 KiB blocks of f one after another and returns
// each read's time, sorted.
func qd1Reads(t *testing.T, f *os.File, size int64, n int) []time.Duration {
	t.Helper()
	buf := alignedBuf(t, 4096)
	r := rand.New(rand.NewPCG(3, 4))
	lat := make([]time.Duration, n)
	for i := range lat {
		off := r.Int64N(size/4096) * 4096
		t0 := time.Now()
		if _, err := f.ReadAt(buf, off); err != nil {
			t.Fatal(err)
		}
		lat[i] = time.Since(t0)
	}
	slices.Sort(lat)
	return lat
}

// TestSwap makes a ublk device served by this process the guest's swap
// and runs the e2e hog (test/e2e/hog.c) over it: every word the hog wrote
// must read back, and the kernel must have swapped out. The backend
// compresses (packedBackend): one that keeps pages as they are frees no
// memory by swapping. For the e2e guest only, in a process of its own (the
// heaps of the tests before it would be locked too): UBLK_SWAP_HOG_MIB is
// the hog's size.
func TestSwap(t *testing.T) {
	needDriver(t)
	hogMiB := testneeds.Env(t, "UBLK_SWAP_HOG_MIB", "swapping through a ublk device while the e2e memory hog runs (the e2e guest: E2E_SCENARIOS=ublk)")
	hog, err := exec.LookPath("hog")
	if err != nil {
		t.Fatalf("UBLK_SWAP_HOG_MIB is set but there is no hog (test/e2e/hog.c, in the e2e guest): %v", err)
	}
	mkswap := testneeds.Command(t, "mkswap", "util-linux")
	swapon := testneeds.Command(t, "swapon", "util-linux")
	swapoff := testneeds.Command(t, "swapoff", "util-linux")
	// 256 MiB of swap: a small slot for every page (32 MiB; the hog's
	// compress to 338 bytes) and 8 MiB of pages that do not compress.
	p := newPackedBackend(t, 256<<20, 65536, 2048)
	errs := 0
	p.onErr = func(err error) {
		// To the kernel's log, at once: the guest may not live to the end.
		if errs++; errs <= 10 {
			if f, ferr := os.OpenFile("/dev/kmsg", os.O_WRONLY, 0); ferr == nil {
				fmt.Fprintf(f, "packedBackend: %v\n", err)
				f.Close()
			}
		}
	}
	// As the daemon serves swap (pkg/swapsafe): its memory locked
	// (MCL_ONFAULT: plain MCL_FUTURE locked 137 MiB in the guest, Go's
	// heap mapped 64 MiB at a time) and every thread real-time, so that
	// the faults left (the Go runtime's own: a lock word's page, a fresh
	// span, seen in the guest) are served below the min watermark rather
	// than by reclaim that waits on this device. The queues' threads are
	// IO flushers (Config.IOFlusher), and start real-time too.
	if failed := swapsafe.Failed(swapsafe.Apply(swapsafe.Options{LockMemory: true, Realtime: true})); len(failed) > 0 {
		t.Fatalf("swap safety: %+v", failed)
	}
	// And threads started now and kept idle, as the daemon's are
	// (thread_reserve): without them, a goroutine back from a blocking
	// call had a queue's thread start another, allocating its M in a
	// fresh span whose fault waited on reclaim that waited on this
	// device (seen in the e2e guest: ublk0-q1 in mallocgc, type
	// runtime.mPadded, 1 run in 4).
	if s := swapsafe.ReserveThreads(16); s.Err != nil {
		t.Fatalf("swap safety: %+v", s)
	}
	// And the heap kept resident and locked, with every page of the
	// program's data and bss it has touched (gzramd-heaplock): a page of
	// the bss only read so far is the kernel's zero page, and the first
	// write to it copies it (seen in the e2e guest: a queue's thread in
	// runtime.lock2 on runtime.sched, in do_wp_page, in direct reclaim).
	reserve, step := swapsafe.ReserveHeap(8 << 20)
	if step.Err != nil {
		t.Fatalf("swap safety: %+v", step)
	}
	defer reserve.KeepAlive()
	defer swapsafe.DropRealtime()
	defer unix.Munlockall()
	s := serveBackend(t, Config{IOFlusher: true}, p)
	if step := reserve.TopUp(); step.Err != nil {
		t.Fatalf("swap safety: %+v", step)
	}
	lockCtx, stopLocking := context.WithCancel(context.Background())
	lockErr := make(chan error, 1)
	go reserve.KeepHeapLocked(lockCtx, 250*time.Millisecond, func(err error) {
		select {
		case lockErr <- err:
		default:
		}
	})
	defer func() {
		stopLocking()
		select {
		case err := <-lockErr:
			t.Errorf("keeping the heap locked: %v", err)
		default:
		}
	}()
	run := func(name string, args ...string) {
		t.Helper()
		if b, err := exec.Command(name, args...).CombinedOutput(); err != nil {
			t.Fatalf("%s %v: %v\n%s", name, args, err, b)
		}
	}
	run(mkswap, s.dev.Block)
	run(swapon, s.dev.Block)
	on := true
	defer func() {
		if on {
			exec.Command(swapoff, s.dev.Block).Run()
		}
	}()
	out0, in0 := vmstat(t, "pswpout"), vmstat(t, "pswpin")
	// No random pages (the third argument): every page compresses.
	cmd := exec.Command(hog, hogMiB, "1", "0")
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	t0 := time.Now()
	if err := cmd.Run(); err != nil {
		t.Errorf("hog %s MiB: %v", hogMiB, err)
	}
	out, in := vmstat(t, "pswpout")-out0, vmstat(t, "pswpin")-in0
	p.mu.Lock()
	stored, small, big := p.stored, cap(p.freeSmall)-len(p.freeSmall), cap(p.freeBig)-len(p.freeBig)
	p.mu.Unlock()
	t.Logf("hog %s MiB over %s in %v: pswpout %d, pswpin %d; %d pages held after it (%d small slots, %d whole)",
		hogMiB, s.dev.Block, time.Since(t0).Round(time.Millisecond), out, in, stored, small, big)
	if out == 0 {
		t.Error("the kernel swapped nothing out: the test proved nothing (a larger UBLK_SWAP_HOG_MIB)")
	}
	run(swapoff, s.dev.Block)
	on = false
	if err := s.stop(); err != nil {
		t.Errorf("Serve after the stop: %v", err)
	}
}

// vmstat is the counter name of /proc/vmstat.
func vmstat(t *testing.T, name string) int64 {
	t.Helper()
	b, err := os.ReadFile("/proc/vmstat")
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.Lines(string(b)) {
		if k, v, ok := strings.Cut(strings.TrimSpace(line), " "); ok && k == name {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				t.Fatalf("/proc/vmstat %s: %v", name, err)
			}
			return n
		}
	}
	t.Fatalf("/proc/vmstat has no %s", name)
	return 0
}
