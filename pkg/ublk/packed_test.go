package ublk

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/klauspost/compress/s2"
	"golang.org/x/sys/unix"
)

// packedBackend keeps each 4 KiB page s2-compressed in a slot of memory
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
		scratch:   make([]byte, s2.MaxEncodedLen(4096)),
	}
	for i := range p.scratch { // touched now, not first while serving swap
		p.scratch[i] = 1
	}
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
			if n, err := s2.DecodedLen(src); err != nil || n != 4096 {
				return fmt.Errorf("page %d: %d bytes compressed to %d: %v: %w", off/4096, n, r.n, err, unix.EIO)
			}
			if _, err := s2.Decode(page, src); err != nil {
				return fmt.Errorf("page %d: %v: %w", off/4096, err, unix.EIO)
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
		c := s2.Encode(p.scratch, b[:4096])
		switch {
		case len(c) <= smallSlot && len(p.freeSmall) > 0:
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
