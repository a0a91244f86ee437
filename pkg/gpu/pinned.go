// Pinned host memory for batches and shadow outputs, and the registry of it.

package gpu

import (
	"fmt"
	"slices"
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
	pageBytes := capacity * codec.PageSize
	mem, err := g.pin(capacity, pageBytes+capacity*(codec.PageSize+8))
	if err != nil {
		return nil, err
	}
	b := codec.OutputSets(mem[pageBytes:], 1, capacity)[0]
	b.Pages = mem[:pageBytes]
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
	g.mu.Lock()
	g.registered = append(g.registered, mem)
	g.mu.Unlock()
	return nil
}

// UnregisterPages unpins memory RegisterPages pinned.
func (g *Backend) UnregisterPages(mem []byte) error {
	if g.closed.Load() {
		return errClosed
	}
	g.mu.Lock()
	g.registered = slices.DeleteFunc(g.registered, func(m []byte) bool { return unsafe.SliceData(m) == unsafe.SliceData(mem) })
	g.mu.Unlock()
	if err := g.dr.hostUnregister(mem); err != nil {
		return fmt.Errorf("gpu: unpinning staging: %w", err)
	}
	return nil
}

// NewOutputs returns sets batches of capacity pages with pinned outputs
// and no pages, the shadow outputs pkg/route gives the device, so that a
// late write by a batch it gave up on reaches no memory in use. They are
// carved from one allocation: the driver hands out pinned memory in
// pieces of 2 MiB, and 16 sets of 256 pages (1 MiB and 2 KiB each),
// allocated one by one, took 32 MiB (H100, driver 580).
func (g *Backend) NewOutputs(sets, capacity int) ([]*codec.Batch, error) {
	if sets < 1 {
		return nil, fmt.Errorf("gpu: %d output sets", sets)
	}
	mem, err := g.pin(capacity, codec.OutputSetBytes(sets, capacity))
	if err != nil {
		return nil, err
	}
	return codec.OutputSets(mem, sets, capacity), nil
}

// pin allocates size bytes of pinned memory for batches of capacity
// pages and records it (ownsPinned, teardown).
func (g *Backend) pin(capacity, size int) ([]byte, error) {
	if capacity < 1 || capacity > g.cfg.MaxBatchPages {
		return nil, fmt.Errorf("gpu: batch capacity %d out of range 1..%d", capacity, g.cfg.MaxBatchPages)
	}
	if g.closed.Load() {
		return nil, errClosed
	}
	mem, err := g.dr.hostAlloc(size)
	if err != nil {
		return nil, fmt.Errorf("gpu: pinned memory for batches of %d pages: %w", capacity, err)
	}
	g.mu.Lock()
	g.pinned = append(g.pinned, mem)
	g.mu.Unlock()
	return mem, nil
}

// ownsPinned reports whether p lies in pinned memory: made by NewBatch or
// NewOutputs, or registered (RegisterPages), as the output sets of an
// accelerator attached after the pipeline was made are.
func (g *Backend) ownsPinned(p []byte) bool {
	if len(p) == 0 {
		return false
	}
	lo := uintptr(unsafe.Pointer(&p[0]))
	hi := lo + uintptr(len(p))
	g.mu.Lock()
	defer g.mu.Unlock()
	within := func(m []byte) bool {
		start := uintptr(unsafe.Pointer(&m[0]))
		return lo >= start && hi <= start+uintptr(len(m))
	}
	return slices.ContainsFunc(g.pinned, within) || slices.ContainsFunc(g.registered, within)
}
