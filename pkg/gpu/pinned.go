// Pinned host memory for batches and shadow outputs, and the registry of it.

package gpu

import (
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/gzramd/gzramd/pkg/codec"
)

// pinnedMemory is the backend's pinned host memory, which the GPU
// reaches by DMA: the batches and output sets it made (NewBatch,
// NewOutputs), which the backend's teardown frees, and the caller's
// memory it pinned in place (RegisterPages), until unregistered.
type pinnedMemory struct {
	dr       cuda
	maxPages int          // the backend's MaxBatchPages
	closed   *atomic.Bool // the backend's: nothing is pinned once it is closed

	mu     sync.Mutex
	pinned [][]byte // memory of batches made by NewBatch and NewOutputs
	// registered is the caller's memory RegisterPages pinned.
	registered [][]byte
}

// NewBatch implements codec.BatchAllocator. The whole batch (pages,
// output, offsets, lengths) lives in pinned host memory, so pages go up and
// compressed bytes come down by DMA with no staging copy.
//
// Because CompressBatch then writes b.Out by DMA, a batch that fails with
// a deadline error may still have b.Out written by the GPU until its
// bay is released; pkg/route gives the GPU shadow outputs (NewOutputs)
// for that reason.
func (pm *pinnedMemory) NewBatch(capacity int) (*codec.Batch, error) {
	pageBytes := capacity * codec.PageSize
	mem, err := pm.pin(capacity, pageBytes+capacity*(codec.PageSize+8))
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
func (pm *pinnedMemory) RegisterPages(mem []byte) error {
	if len(mem) == 0 || len(mem)%codec.PageSize != 0 {
		return fmt.Errorf("gpu: registering %d bytes, not whole pages", len(mem))
	}
	if pm.closed.Load() {
		return errClosed
	}
	if err := pm.dr.hostRegister(mem); err != nil {
		return fmt.Errorf("gpu: pinning %d bytes of staging: %w", len(mem), err)
	}
	pm.mu.Lock()
	pm.registered = append(pm.registered, mem)
	pm.mu.Unlock()
	return nil
}

// UnregisterPages unpins memory RegisterPages pinned.
func (pm *pinnedMemory) UnregisterPages(mem []byte) error {
	if pm.closed.Load() {
		return errClosed
	}
	pm.mu.Lock()
	pm.registered = slices.DeleteFunc(pm.registered, func(m []byte) bool { return unsafe.SliceData(m) == unsafe.SliceData(mem) })
	pm.mu.Unlock()
	if err := pm.dr.hostUnregister(mem); err != nil {
		return fmt.Errorf("gpu: unpinning staging: %w", err)
	}
	return nil
}

// NewOutputs returns sets batches of capacity pages with pinned outputs
// and no pages, the shadow outputs pkg/route gives the GPU, so that a
// late write by a batch it gave up on reaches no memory in use. They are
// carved from one allocation: the driver hands out pinned memory in
// pieces of 2 MiB, and 16 sets of 256 pages (1 MiB and 2 KiB each),
// allocated one by one, took 32 MiB (H100, driver 580).
func (pm *pinnedMemory) NewOutputs(sets, capacity int) ([]*codec.Batch, error) {
	if sets < 1 {
		return nil, fmt.Errorf("gpu: %d output sets", sets)
	}
	mem, err := pm.pin(capacity, codec.OutputSetBytes(sets, capacity))
	if err != nil {
		return nil, err
	}
	return codec.OutputSets(mem, sets, capacity), nil
}

// pin allocates size bytes of pinned memory for batches of capacity
// pages and records it (ownsPinned, teardown).
func (pm *pinnedMemory) pin(capacity, size int) ([]byte, error) {
	if capacity < 1 || capacity > pm.maxPages {
		return nil, fmt.Errorf("gpu: batch capacity %d out of range 1..%d", capacity, pm.maxPages)
	}
	if pm.closed.Load() {
		return nil, errClosed
	}
	mem, err := pm.dr.hostAlloc(size)
	if err != nil {
		return nil, fmt.Errorf("gpu: pinned memory for batches of %d pages: %w", capacity, err)
	}
	pm.mu.Lock()
	pm.pinned = append(pm.pinned, mem)
	pm.mu.Unlock()
	return mem, nil
}

// ownsPinned reports whether p lies in pinned memory: made by NewBatch or
// NewOutputs, or registered (RegisterPages), as the output sets of an
// accelerator attached after the pipeline was made are.
func (pm *pinnedMemory) ownsPinned(p []byte) bool {
	if len(p) == 0 {
		return false
	}
	lo := uintptr(unsafe.Pointer(&p[0]))
	hi := lo + uintptr(len(p))
	pm.mu.Lock()
	defer pm.mu.Unlock()
	within := func(m []byte) bool {
		start := uintptr(unsafe.Pointer(&m[0]))
		return lo >= start && hi <= start+uintptr(len(m))
	}
	return slices.ContainsFunc(pm.pinned, within) || slices.ContainsFunc(pm.registered, within)
}

// freePinned frees the memory NewBatch and NewOutputs made. Only call it
// when no work is on the GPU.
func (pm *pinnedMemory) freePinned() error {
	pm.mu.Lock()
	defer pm.mu.Unlock()
	var errs []error
	for _, p := range pm.pinned {
		errs = append(errs, pm.dr.hostFree(p))
	}
	pm.pinned = nil
	return errors.Join(errs...)
}
