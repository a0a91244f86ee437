// The GPU of a serving process that took the device over: opened while it
// already serves on the CPU.

package serving

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/gzramd/gzramd/internal/memfd"
	"github.com/gzramd/gzramd/pkg/codec"
	"github.com/gzramd/gzramd/pkg/gpu"
)

// lateGPU stands in for the GPU (route.Accelerator, route.Readier) in a
// serving process that takes the device over from one that died, until
// the GPU it opens meanwhile is ready. Opening the GPU (the driver, a
// context, the kernels, pinned memory) took 160-460 ms on an H200, and
// every request waits through a takeover: the CPU backend's took 14 ms.
// Until then the router compresses on the CPU, and the memory the GPU
// will read and write (the output sets, staging) is kept to be pinned
// when it comes.
type lateGPU struct {
	g       atomic.Pointer[gpu.Backend]
	mu      sync.Mutex // guards pending, and attach against Register/Unregister
	pending [][]byte   // memory to pin once the GPU is open
}

var errGPUNotReady = errors.New("the GPU is not open yet")

func (l *lateGPU) Ready() bool  { return l.g.Load() != nil }
func (l *lateGPU) Name() string { return "gpu" }

func (l *lateGPU) CompressBatch(ctx context.Context, b *codec.Batch) error {
	g := l.g.Load()
	if g == nil {
		return errGPUNotReady
	}
	return g.CompressBatch(ctx, b)
}

func (l *lateGPU) RegisterPages(mem []byte) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if g := l.g.Load(); g != nil {
		return g.RegisterPages(mem)
	}
	l.pending = append(l.pending, mem)
	return nil
}

func (l *lateGPU) UnregisterPages(mem []byte) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if g := l.g.Load(); g != nil {
		return g.UnregisterPages(mem)
	}
	l.pending = slices.DeleteFunc(l.pending, func(m []byte) bool { return unsafe.SliceData(m) == unsafe.SliceData(mem) })
	return nil
}

// NewOutputs lays the output sets over memory of their own, faulted in now
// (resident and locked under mlockall) and pinned when the GPU is open;
// they live as long as the process.
func (l *lateGPU) NewOutputs(sets, pages int) ([]*codec.Batch, error) {
	size := (codec.OutputSetBytes(sets, pages) + unix.Getpagesize() - 1) &^ (unix.Getpagesize() - 1)
	mem, err := unix.Mmap(-1, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		return nil, fmt.Errorf("memory for %d output sets of %d pages: %w", sets, pages, err)
	}
	memfd.Populate(mem)
	l.mu.Lock()
	l.pending = append(l.pending, mem)
	l.mu.Unlock()
	return codec.OutputSets(mem, sets, pages), nil
}

// attach pins the memory kept for g and makes g the accelerator. On an
// error nothing stays pinned, and the caller closes g: the device goes on
// on the CPU.
func (l *lateGPU) attach(g *gpu.Backend) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	for i, mem := range l.pending {
		if err := g.RegisterPages(mem); err != nil {
			for _, m := range l.pending[:i] {
				g.UnregisterPages(m) //nolint:errcheck // the GPU is closed next
			}
			return err
		}
	}
	l.pending = nil
	l.g.Store(g)
	return nil
}
