package ublk

import (
	"context"
	"fmt"
	"runtime"
	"sync"
	"testing"
	"unsafe"

	"github.com/pierrec/lz4/v4"
	"golang.org/x/sys/unix"
)

// packedBackend keeps each 4 KiB page LZ4-compressed in a slot of memory
// mapped up front: a small slot where the page compresses to 512 bytes or
// less, a whole page where it does not. Swapping to it frees memory, as
// swapping to gzramd does (an uncompressed memory backend only moves the
// pages), and serving a request allocates nothing: the store a server of
// swap must be, in its simplest form, for TestSwap.
type packedBackend struct {
	mu        sync.Mutex
	size      int64
	pages     []slotRef // per device page
	small     []byte    // smallSlots slots of smallSlot bytes
	big       []byte    // bigSlots pages
	freeSmall []int32
	freeBig   []int32
	scratch   []byte // one page, compressed
	stored    int    // pages held
	onErr     func(error)
	// A compressor of its own, its table faulted in up front, not a
	// package-level call: s2's and lz4's take their tables from a
	// sync.Pool, which every GC empties, so that the next page stored
	// allocated one (seen in the e2e guest: a queue's thread in mallocgc,
	// faulting a fresh span into direct reclaim that waited on the device
	// it serves).
	lz lz4.Compressor
}

const smallSlot = 512

// slotRef is where a page is: kind 0 none (zeroes), 1 a small slot of n
// compressed bytes, 2 a whole page.
type slotRef struct {
	kind uint8
	n    uint16
	slot int32
}

func newPackedBackend(t *testing.T, size int64, smallSlots, bigSlots int) *packedBackend {
	t.Helper()
	// Faulted in up front, as the queues' buffers: storing a page must
	// not allocate one while the device is swap.
	mmap := func(n int) []byte {
		b, err := unix.Mmap(-1, 0, n, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
		if err != nil {
			t.Fatal(err)
		}
		prefault(b)
		t.Cleanup(func() { unix.Munmap(b) })
		return b
	}
	p := &packedBackend{
		size:      size,
		pages:     make([]slotRef, size/4096),
		small:     mmap(smallSlots * smallSlot),
		big:       mmap(bigSlots * 4096),
		freeSmall: make([]int32, smallSlots),
		freeBig:   make([]int32, bigSlots),
		scratch:   make([]byte, lz4.CompressBlockBound(4096)),
	}
	for i := range p.scratch { // touched now, not first while serving swap
		p.scratch[i] = 1
	}
	// The compressor's table too, 136 KiB of it: compressing writes only
	// the entries a page's hashes land on, and the first write to each of
	// its pages faulted (seen in the e2e guest, as s2's pool was).
	prefault(unsafe.Slice((*byte)(unsafe.Pointer(&p.lz)), unsafe.Sizeof(p.lz)))
	for i := range p.pages {
		p.pages[i] = slotRef{slot: -1}
	}
	for i := range p.freeSmall {
		p.freeSmall[i] = int32(len(p.freeSmall) - 1 - i)
	}
	for i := range p.freeBig {
		p.freeBig[i] = int32(len(p.freeBig) - 1 - i)
	}
	return p
}

func (p *packedBackend) Size() int64 { return p.size }

func (p *packedBackend) free(i int64) {
	r := p.pages[i]
	switch r.kind {
	case 1:
		p.freeSmall = append(p.freeSmall, r.slot)
	case 2:
		p.freeBig = append(p.freeBig, r.slot)
	}
	if r.kind != 0 {
		p.stored--
	}
	p.pages[i] = slotRef{}
}

func (p *packedBackend) ReadAt(_ context.Context, b []byte, off int64) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	for ; len(b) > 0; b, off = b[4096:], off+4096 {
		page := b[:4096]
		switch r := p.pages[off/4096]; r.kind {
		case 0:
			clear(page)
		case 1:
			src := p.small[int(r.slot)*smallSlot:][:r.n]
			if n, err := lz4.UncompressBlock(src, page); err != nil || n != 4096 {
				return fmt.Errorf("page %d: %d bytes compressed from %d: %v: %w", off/4096, r.n, n, err, unix.EIO)
			}
		case 2:
			copy(page, p.big[int(r.slot)*4096:])
		}
	}
	return nil
}

func (p *packedBackend) WriteAt(_ context.Context, b []byte, off int64, _ bool) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	for ; len(b) > 0; b, off = b[4096:], off+4096 {
		i := off / 4096
		p.free(i)
		n, err := p.lz.CompressBlock(b[:4096], p.scratch)
		if err != nil {
			n = 0
		}
		c := p.scratch[:n]
		switch {
		case n > 0 && n <= smallSlot && len(p.freeSmall) > 0:
			s := p.freeSmall[len(p.freeSmall)-1]
			p.freeSmall = p.freeSmall[:len(p.freeSmall)-1]
			copy(p.small[int(s)*smallSlot:], c)
			p.pages[i] = slotRef{kind: 1, n: uint16(len(c)), slot: s}
		case len(p.freeBig) > 0:
			s := p.freeBig[len(p.freeBig)-1]
			p.freeBig = p.freeBig[:len(p.freeBig)-1]
			copy(p.big[int(s)*4096:], b[:4096])
			p.pages[i] = slotRef{kind: 2, slot: s}
		default:
			err := fmt.Errorf("page %d: no slot left (%d pages held, this one %d bytes compressed): %w", i, p.stored, len(c), unix.ENOSPC)
			if p.onErr != nil {
				p.onErr(err)
			}
			return err
		}
		p.stored++
	}
	return nil
}

func (p *packedBackend) Trim(_ context.Context, off, length int64) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	for i := off / 4096; i < (off+length)/4096; i++ {
		p.free(i)
	}
	return nil
}

func (p *packedBackend) WriteZeroes(ctx context.Context, off, length int64, _ bool) error {
	return p.Trim(ctx, off, length)
}

func (p *packedBackend) Flush(context.Context) error { return nil }

func TestPackedBackend(t *testing.T) {
	p := newPackedBackend(t, 64<<12, 4, 2)
	ctx := context.Background()
	comp := pattern(8192, 3)
	for i := range comp {
		if i%64 >= 8 {
			comp[i] = 0x11
		}
	}
	noise := make([]byte, 8192)
	for i := range noise {
		noise[i] = byte(uint32(i) * 2654435761 >> 13)
	}
	if err := p.WriteAt(ctx, comp, 0, false); err != nil {
		t.Fatal(err)
	}
	if err := p.WriteAt(ctx, noise, 8192, false); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, 16384)
	if err := p.ReadAt(ctx, got, 0); err != nil {
		t.Fatal(err)
	}
	if string(got[:8192]) != string(comp) || string(got[8192:]) != string(noise) {
		t.Error("read back differs")
	}
	if p.pages[0].kind != 1 || p.pages[2].kind != 2 {
		t.Errorf("slots %+v %+v: want a small one and a whole page", p.pages[0], p.pages[2])
	}
	// No whole page left: a third incompressible page is refused.
	if err := p.WriteAt(ctx, noise[:4096], 5*4096, false); err == nil {
		t.Error("a write with no slot left was taken")
	}
	// Nor does storing and loading a page allocate, even right after a GC
	// (which empties sync.Pools: s2's encoder allocated here).
	allocs := testing.AllocsPerRun(10, func() {
		runtime.GC()
		if err := p.WriteAt(ctx, comp[:4096], 3*4096, false); err != nil {
			t.Fatal(err)
		}
		if err := p.ReadAt(ctx, got[:4096], 3*4096); err != nil {
			t.Fatal(err)
		}
	})
	if allocs != 0 {
		t.Errorf("a page stored and loaded after a GC: %v allocations, want none", allocs)
	}
	// Nor fault: pages of many kinds, whose hashes land all over the
	// compressor's table, on a thread whose faults are counted.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	pages := make([]byte, 64*4096)
	for i := range pages {
		if k := i >> 12; i%64 < 62 {
			pages[i] = byte(k)
		} else {
			pages[i] = byte(uint32(i*k) * 2654435761 >> 24)
		}
	}
	faults := func() int64 {
		var ru unix.Rusage
		if err := unix.Getrusage(unix.RUSAGE_THREAD, &ru); err != nil {
			t.Fatal(err)
		}
		return ru.Minflt + ru.Majflt
	}
	big := newPackedBackend(t, int64(len(pages)), 64, 64)
	// The first page grows the goroutine's stack: not the backend's.
	if err := big.WriteAt(ctx, pages[:4096], 0, false); err != nil {
		t.Fatal(err)
	}
	if err := big.ReadAt(ctx, got[:4096], 0); err != nil {
		t.Fatal(err)
	}
	// And not the runtime's: a signal to this thread (a collection's
	// stack scan, a preemption) writes its frame on the thread's signal
	// stack, which a queue makes resident before it serves (CI, as an
	// ordinary user: 1 fault).
	if err := signalStackResident(); err != nil {
		t.Fatal(err)
	}
	before := faults()
	for off := 4096; off < len(pages); off += 4096 {
		if err := big.WriteAt(ctx, pages[off:off+4096], int64(off), false); err != nil {
			t.Fatal(err)
		}
		if err := big.ReadAt(ctx, got[:4096], int64(off)); err != nil {
			t.Fatal(err)
		}
	}
	switch n := faults() - before; {
	case raceEnabled:
		t.Logf("63 pages stored and loaded: %d page faults, not counted under the race detector", n)
	case n != 0:
		t.Errorf("63 pages stored and loaded: %d page faults, want none", n)
	}
	if big.stored != 64 || len(big.freeSmall) != 0 {
		t.Errorf("%d pages stored, %d of them whole: want all 64 in small slots", big.stored, 64-len(big.freeBig))
	}
	if err := p.Trim(ctx, 0, 16384); err != nil {
		t.Fatal(err)
	}
	if p.stored != 0 || len(p.freeSmall) != 4 || len(p.freeBig) != 2 {
		t.Errorf("after the trim: %d stored, %d and %d slots free", p.stored, len(p.freeSmall), len(p.freeBig))
	}
	if err := p.ReadAt(ctx, got[:4096], 0); err != nil || got[0] != 0 {
		t.Errorf("a trimmed page reads %x (%v)", got[:8], err)
	}
}
