// The bays: a stream and its buffers each, taken and given back (quarantined while the GPU may still write).

package gpu

import (
	"context"
	"fmt"
	"time"

	"github.com/gzramd/gzramd/pkg/codec"
)

// bay is one batch in flight: a stream and its buffers.
type bay struct {
	stream stream
	// GPU buffers: input pages (also the decompressed output), the
	// per-page encoding scratch, the packed output, and meta: the packed
	// size (word 0, padded to 16 bytes), then offsets, lengths and
	// decode status, maxPages words each.
	dPages, dScratch, dPacked, dMeta devicePtr
	// Pinned host buffers: meta, and a bounce buffer of MaxBatchPages
	// pages, made on first need (bounce): the daemon's batches come and go
	// in pinned memory of this backend's own (NewBatch, NewOutputs,
	// RegisterPages), so it never makes one.
	hMeta      []uint32
	hMetaBytes []byte
	hBounce    []byte
	// pending, when set, delivers the result of a stream synchronization
	// that a caller stopped waiting for.
	pending chan error
}

// BayBytes is the pinned host memory the bays hold: the metadata of
// each, and the bounce buffers made so far.
func (g *Backend) BayBytes() int64 {
	n := g.cfg.MaxBatchPages
	total := int64(g.cfg.Bays) * 4 * int64(metaWords(n))
	g.mu.Lock()
	defer g.mu.Unlock()
	return total + g.bounced
}

// bounce returns s's bounce buffer, pinned, making it on first use: for a
// batch whose memory is not pinned memory of this backend (a caller's
// own buffers), which the GPU cannot reach by DMA. The caller holds s.
func (g *Backend) bounce(s *bay) ([]byte, error) {
	if s.hBounce == nil {
		b, err := g.dr.hostAlloc(g.cfg.MaxBatchPages * codec.PageSize)
		if err != nil {
			return nil, fmt.Errorf("gpu: a bounce buffer for memory that is not pinned: %w", err)
		}
		s.hBounce = b
		g.mu.Lock()
		g.bounced += int64(len(b))
		g.mu.Unlock()
	}
	return s.hBounce, nil
}

func (g *Backend) acquire(ctx context.Context) (*bay, error) {
	if g.closed.Load() {
		return nil, errClosed
	}
	select {
	case s := <-g.free:
		return s, nil
	case <-g.done:
		return nil, errClosed
	case <-ctx.Done():
		return nil, fmt.Errorf("gpu: waiting for a free bay: %w", ctx.Err())
	}
}

// release returns a bay to the pool once its stream has no work left. A
// bay whose batch was abandoned (deadline, error) stays quarantined until
// the GPU is done with it, so nothing the GPU still writes can reach
// memory that a later batch or the CPU fallback uses.
func (g *Backend) release(s *bay) {
	if s.pending == nil && g.dr.streamQuery(s.stream) == nil {
		g.free <- s
		return
	}
	go func() {
		start := time.Now()
		if s.pending != nil {
			<-s.pending
			s.pending = nil
		}
		err := g.dr.streamSync(s.stream)
		g.log.Warn("gpu: quarantined bay released", "held", time.Since(start), "stream_error", err)
		g.free <- s
	}()
}

// wait blocks until the bay's stream finishes or ctx ends. In the latter
// case the synchronization goes on in the background (s.pending) and the
// bay must be released, which quarantines it.
func (g *Backend) wait(ctx context.Context, s *bay) error {
	if ctx.Done() == nil {
		return g.dr.streamSync(s.stream)
	}
	done := make(chan error, 1)
	go func() { done <- g.dr.streamSync(s.stream) }()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		s.pending = done
		return fmt.Errorf("gpu: batch overran its deadline: %w", ctx.Err())
	}
}
