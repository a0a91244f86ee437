// Package routetest gives tests that run without a GPU a stand-in for it,
// as net/http/httptest does for a server: an accelerator
// (route.Accelerator) that compresses with the CPU codec, so its results
// are real, and that can be made to fail or hang. A hung call, once
// released, scribbles over the outputs it was given, as a late GPU would
// write them by DMA.
package routetest

import (
	"context"
	"errors"
	"sync/atomic"
	"time"

	"github.com/gzramd/gzramd/pkg/codec"
)

// ErrFailed is what a failing Accelerator returns.
var ErrFailed = errors.New("routetest: device error")

// Accelerator is safe for concurrent use.
type Accelerator struct {
	cpu *codec.CPUBatch
	// Failing makes calls fail at once (after scribbling on their
	// outputs); FailEvery > 0 fails every n-th call.
	Failing   atomic.Bool
	FailEvery atomic.Int64
	// HangFor, when positive, makes calls hang that long, ignoring their
	// context (a driver call that does not return), then scribble and
	// fail.
	HangFor atomic.Int64 // nanoseconds
	// Delay, when positive, is how long each call takes.
	Delay atomic.Int64 // nanoseconds

	Calls, Returned, Pages atomic.Int64
}

// NewAccelerator returns a healthy accelerator that writes LZ4.
func NewAccelerator() *Accelerator { return NewAcceleratorFor(codec.NewLZ4()) }

// NewAcceleratorFor returns a healthy accelerator that compresses with c,
// as a GPU of c's algorithm does.
func NewAcceleratorFor(c codec.Codec) *Accelerator {
	return &Accelerator{cpu: codec.NewCPUBatch(c, 1)}
}

// Name implements codec.BatchCompressor.
func (*Accelerator) Name() string { return "gpu" }

// RegisterPages implements route.Accelerator: nothing to pin.
func (*Accelerator) RegisterPages([]byte) error { return nil }

// UnregisterPages implements route.Accelerator.
func (*Accelerator) UnregisterPages([]byte) error { return nil }

// NewOutputs implements route.Accelerator with Go memory.
func (*Accelerator) NewOutputs(sets, pages int) ([]*codec.Batch, error) {
	bs := make([]*codec.Batch, sets)
	for i := range bs {
		bs[i] = &codec.Batch{
			Out: make([]byte, pages*codec.PageSize), Offsets: make([]uint32, pages), Lens: make([]uint32, pages),
		}
	}
	return bs, nil
}

// CompressBatch implements codec.BatchCompressor.
func (a *Accelerator) CompressBatch(ctx context.Context, b *codec.Batch) error {
	n := a.Calls.Add(1)
	defer a.Returned.Add(1)
	if d := a.Delay.Load(); d > 0 {
		time.Sleep(time.Duration(d))
	}
	if d := a.HangFor.Load(); d > 0 {
		time.Sleep(time.Duration(d))
		scribble(b)
		return errors.New("routetest: late")
	}
	if a.Failing.Load() || (a.FailEvery.Load() > 0 && n%a.FailEvery.Load() == 0) {
		scribble(b)
		return ErrFailed
	}
	if err := a.cpu.CompressBatch(ctx, b); err != nil {
		return err
	}
	a.Pages.Add(int64(b.N))
	return nil
}

func scribble(b *codec.Batch) {
	for i := range b.Out {
		b.Out[i] = 0xFF
	}
	for i := range b.Lens {
		b.Lens[i], b.Offsets[i] = 7, 9
	}
}
