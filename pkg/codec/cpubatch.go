// Compressing a batch on CPU cores: the CPU backend, and the fallback for
// every batch an accelerator does not finish.

package codec

import (
	"context"
	"runtime"
	"sync"
)

// CPUBatch compresses batches on CPU cores with a Codec. It is the fallback
// for every other backend, so it never fails.
type CPUBatch struct {
	codec   Codec
	workers int
}

// NewCPUBatch spreads each batch over up to workers goroutines
// (runtime.GOMAXPROCS when workers <= 0).
func NewCPUBatch(c Codec, workers int) *CPUBatch {
	if workers <= 0 {
		workers = runtime.GOMAXPROCS(0)
	}
	return &CPUBatch{codec: c, workers: workers}
}

// Name implements BatchCompressor.
func (*CPUBatch) Name() string { return "cpu" }

// minPagesPerWorker keeps goroutine hand-off cheap relative to the work.
const minPagesPerWorker = 16

// CompressBatch implements BatchCompressor. Page i's output goes to
// Out[i*PageSize:], bounded to b.Limit (PageSize-1 by default) so a page
// that does not shrink enough is reported as raw. An object of several
// pages (b.Objects, which the caller checked) is compressed with the codec
// as one input, into the outputs of its pages, bounded to ObjectLimit.
func (c *CPUBatch) CompressBatch(_ context.Context, b *Batch) error {
	n := b.N
	w := min(c.workers, (n+minPagesPerWorker-1)/minPagesPerWorker)
	if w <= 1 {
		c.run(b, 0, n)
		return nil
	}
	var wg sync.WaitGroup
	per := (n + w - 1) / w
	for lo := 0; lo < n; lo += per {
		hi := min(lo+per, n)
		wg.Add(1)
		go func() {
			defer wg.Done()
			c.run(b, lo, hi)
		}()
	}
	wg.Wait()
	return nil
}

func (c *CPUBatch) run(b *Batch, lo, hi int) {
	for i := lo; i < hi; i++ {
		b.Offsets[i] = uint32(i * PageSize)
	}
	if b.Objects != nil {
		c.runObjects(b, lo, hi)
		return
	}
	if l, ok := c.codec.(*LZ4); ok {
		l.compressPages(b.Pages[lo*PageSize:], b.Out[lo*PageSize:], b.Lens[lo:hi], hi-lo, b.limit())
		return
	}
	for i := lo; i < hi; i++ {
		off := i * PageSize
		b.Lens[i] = uint32(c.codec.Compress(b.Out[off:off+b.limit()], b.Page(i)))
	}
}

// runObjects compresses the objects that start at pages [lo, hi) of b,
// whose Objects the caller checked, each object into the outputs of its
// pages. An object that reaches past hi is read from the pages there,
// whose outputs no other worker writes: pages within an object only get
// length 0.
func (c *CPUBatch) runObjects(b *Batch, lo, hi int) {
	l, isLZ4 := c.codec.(*LZ4)
	for i := lo; i < hi; i++ {
		off := i * PageSize
		switch p := int(b.Objects[i]); {
		case p == 0:
			b.Offsets[i], b.Lens[i] = 0, 0
		case p == 1 && isLZ4:
			l.compressPages(b.Pages[off:], b.Out[off:], b.Lens[i:i+1], 1, b.limit())
		case p == 1:
			b.Lens[i] = uint32(c.codec.Compress(b.Out[off:off+b.limit()], b.Page(i)))
		default:
			b.Lens[i] = uint32(c.codec.Compress(b.Out[off:off+b.ObjectLimit(p)], b.Pages[off:off+p*PageSize]))
		}
	}
}
