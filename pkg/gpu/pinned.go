// Pinned host memory for batches and shadow outputs, and the registry of it.

package gpu

import (
	"fmt"
	"unsafe"

	"github.com/gzramd/gzramd/pkg/codec"
)

// NewBatch implements codec.BatchAllocator. The whole batch (pages,
// output, offsets, lengths) lives in pinned host memory, so pages go up and
// compressed bytes come down by DMA with no staging copy.
//
// Because CompressBatch then writes b.Out by DMA, a batch that fails with
// a deadline error may still have b.Out written by the device until its
// slot is released; pkg/route gives the device shadow outputs (NewOutputs)
// for that reason.
func (g *Backend) NewBatch(capacity int) (*codec.Batch, error) {
	b, err := g.newPinned(capacity, true)
	if err != nil {
		return nil, err
	}
	return b, nil
}

// RegisterPages pins mem, staging memory the caller mapped (from a memfd,
// so that staged pages outlive the process), so that the GPU reads it by
// DMA with no copy. The caller unregisters it before unmapping it.
func (g *Backend) RegisterPages(mem []byte) error {
	if len(mem) == 0 || len(mem)%codec.PageSize != 0 {
		return fmt.Errorf("gpu: registering %d bytes, not whole pages", len(mem))
	}
	if g.closed.Load() {
		return errClosed
	}
	if err := g.dr.hostRegister(mem); err != nil {
		return fmt.Errorf("gpu: pinning %d bytes of staging: %w", len(mem), err)
	}
	return nil
}

// UnregisterPages unpins memory RegisterPages pinned.
func (g *Backend) UnregisterPages(mem []byte) error {
	if g.closed.Load() {
		return errClosed
	}
	if err := g.dr.hostUnregister(mem); err != nil {
		return fmt.Errorf("gpu: unpinning staging: %w", err)
	}
	return nil
}

// NewOutputs returns a batch with pinned outputs and no pages: the shadow
// outputs pkg/route gives the device, so that a late write by a batch it
// gave up on reaches no memory in use.
func (g *Backend) NewOutputs(capacity int) (*codec.Batch, error) {
	return g.newPinned(capacity, false)
}

func (g *Backend) newPinned(capacity int, withPages bool) (*codec.Batch, error) {
	if capacity < 1 || capacity > g.cfg.MaxBatchPages {
		return nil, fmt.Errorf("gpu: batch capacity %d out of range 1..%d", capacity, g.cfg.MaxBatchPages)
	}
	if g.closed.Load() {
		return nil, errClosed
	}
	pageBytes := 0
	if withPages {
		pageBytes = capacity * codec.PageSize
	}
	size := pageBytes + capacity*codec.PageSize + 8*capacity
	mem, err := g.dr.hostAlloc(size)
	if err != nil {
		return nil, fmt.Errorf("gpu: pinned batch of %d pages: %w", capacity, err)
	}
	g.mu.Lock()
	g.pinned = append(g.pinned, mem)
	g.mu.Unlock()
	out := mem[pageBytes : pageBytes+capacity*codec.PageSize]
	meta := mem[pageBytes+capacity*codec.PageSize:]
	b := &codec.Batch{
		Out:     out,
		Offsets: unsafe.Slice((*uint32)(unsafe.Pointer(&meta[0])), capacity),
		Lens:    unsafe.Slice((*uint32)(unsafe.Pointer(&meta[4*capacity])), capacity),
	}
	if withPages {
		b.Pages = mem[:pageBytes]
	}
	return b, nil
}

// ownsPinned reports whether p lies in pinned memory made by NewBatch.
func (g *Backend) ownsPinned(p []byte) bool {
	if len(p) == 0 {
		return false
	}
	lo := uintptr(unsafe.Pointer(&p[0]))
	hi := lo + uintptr(len(p))
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, m := range g.pinned {
		start := uintptr(unsafe.Pointer(&m[0]))
		if lo >= start && hi <= start+uintptr(len(m)) {
			return true
		}
	}
	return false
}
