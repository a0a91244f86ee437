package device

import (
	"bytes"
	"context"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Zero-length write at the very end passes check() and then indexes the
// page table one past its end.
func TestZeroLengthWriteAtEnd(t *testing.T) {
	f := newDevice(t, 1<<20, 0)
	defer func() {
		if p := recover(); p != nil {
			t.Fatalf("panic: %v", p)
		}
	}()
	if err := f.dev.WriteAt(context.Background(), nil, 1<<20, false); err != nil {
		t.Log("err", err)
	}
}

// Zero-length write in range does a needless read-modify-write + compress.
func TestZeroLengthWriteChangesNothing(t *testing.T) {
	f := newDevice(t, 1<<20, 0)
	p := make([]byte, 4096)
	for i := range p {
		p[i] = byte(i * 7)
	}
	if err := f.dev.WriteAt(context.Background(), p, 0, false); err != nil {
		t.Fatal(err)
	}
	// The write may be staged: its commit must not be counted as the
	// zero-length write's (a newcomer's make test failed so, 1 in ~300).
	f.settle(t)
	before := f.store.Stats().Allocations
	if err := f.dev.WriteAt(context.Background(), nil, 100, false); err != nil {
		t.Fatal(err)
	}
	f.settle(t)
	if after := f.store.Stats().Allocations; after != before {
		t.Fatalf("a zero-length write changed the objects stored: %d -> %d", before, after)
	}
}

// A write whose first piece is partial leaves the whole pages after it at
// an unaligned address; fillWord converts that to *uint64 (checkptr: fatal
// under -race).
func TestUnalignedWrites(t *testing.T) {
	f := newDevice(t, 1<<20, 0)
	p := make([]byte, 3*4096)
	if err := f.dev.WriteAt(context.Background(), p[:4096+4093], 3, false); err != nil {
		t.Fatal(err)
	}
	if err := f.dev.ReadAt(context.Background(), p[:4096+4093], 3); err != nil {
		t.Fatal(err)
	}
}

// A full-page write A is staged, its batch compressing, when a 512-byte
// write M to the same page runs its read-modify-write: M must see A (the
// staged page) and A's late commit must not undo M. Both are
// acknowledged, so the page must read as A then M.
func TestPartialWriteOverStagedPage(t *testing.T) {
	f := newDevice(t, 1<<20, 0)
	f.accel.Delay.Store(int64(50 * time.Millisecond))
	ctx := context.Background()
	a := make([]byte, 4096)
	for i := range a {
		a[i] = byte(i*13 + 1) // not same-filled
	}
	if err := f.dev.WriteAt(ctx, a, 0, false); err != nil {
		t.Fatal(err)
	}
	waitCompressing(t, f)
	m := make([]byte, 512)
	for i := range m {
		m[i] = 0xEE
	}
	if err := f.dev.WriteAt(ctx, m, 512, false); err != nil {
		t.Fatal(err)
	}
	f.settle(t)
	got := make([]byte, 4096)
	if err := f.dev.ReadAt(ctx, got, 0); err != nil {
		t.Fatal(err)
	}
	want := append(append(append([]byte(nil), a[:512]...), m...), a[1024:]...)
	if !bytes.Equal(got, want) {
		t.Fatalf("page after a staged write and a partial write over it: %x..., want %x...", got[:8], want[:8])
	}
	checkSettled(t, f, 1)
}

// waitCompressing waits until the accelerator has a batch.
func waitCompressing(t *testing.T, f *fixture) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); f.accel.Calls.Load() == 0; time.Sleep(50 * time.Microsecond) {
		if time.Now().After(deadline) {
			t.Fatal("no batch reached the accelerator")
		}
	}
}

func rssKiB() int64 {
	b, _ := os.ReadFile("/proc/self/status")
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(l, "VmRSS:") {
			v, _ := strconv.ParseInt(strings.Fields(l)[1], 10, 64)
			return v
		}
	}
	return 0
}

// Discarding never-written pages faults in no page of table.
func TestTrimOfEmptyDeviceLeavesTableUntouched(t *testing.T) {
	f := newDevice(t, 64<<30, 0)
	before := f.dev.Held().Table
	for off := int64(0); off < 64<<30; off += 1 << 30 {
		if err := f.dev.Trim(context.Background(), off, 1<<30); err != nil {
			t.Fatal(err)
		}
	}
	if after := f.dev.Held().Table; after != before {
		t.Errorf("the table held %d bytes before discarding an empty 64 GiB device, %d after", before, after)
	}
}

// Unsynchronized version: a full-page write and a 512-byte write to the
// same page run concurrently; afterwards the 7 sectors only the full write
// touched must hold its data.
func TestConcurrentFullAndPartialWrites(t *testing.T) {
	f := newDevice(t, 64*pageSize, 0)
	ctx := context.Background()
	var lost atomic.Int64
	var wg sync.WaitGroup
	for pg := range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			a := make([]byte, pageSize)
			m := make([]byte, 512)
			got := make([]byte, pageSize)
			for round := range 300 {
				for i := range a {
					a[i] = byte(round) + byte(i/16) // compressible, not same-filled
				}
				for i := range m {
					m[i] = 0xEE
				}
				sec := round % 8
				var inner sync.WaitGroup
				inner.Add(2)
				go func() { defer inner.Done(); f.dev.WriteAt(ctx, a, int64(pg)*pageSize, false) }()
				go func() { defer inner.Done(); f.dev.WriteAt(ctx, m, int64(pg)*pageSize+int64(sec)*512, false) }()
				inner.Wait()
				f.dev.ReadAt(ctx, got, int64(pg)*pageSize)
				for s := range 8 {
					if s != sec && !bytes.Equal(got[s*512:(s+1)*512], a[s*512:(s+1)*512]) {
						lost.Add(1)
						break
					}
				}
			}
		}()
	}
	wg.Wait()
	if n := lost.Load(); n > 0 {
		t.Fatalf("%d of %d rounds lost the acknowledged full-page write", n, 64*300)
	}
}
