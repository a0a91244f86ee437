package gpu

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gzramd/gzramd/pkg/codec"
)

// FallbackOptions tunes WithFallback.
type FallbackOptions struct {
	// Timeout is the watchdog deadline of one batch on the primary
	// (default 1s; a full batch takes about a millisecond on the GPU).
	Timeout time.Duration
	// MinBackoff is how long the primary is skipped after a failure; it
	// doubles on each consecutive failure up to MaxBackoff (defaults 100ms
	// and 1m).
	MinBackoff, MaxBackoff time.Duration
	// MinPages sends smaller batches straight to the CPU (0: none).
	// `--backend auto` uses DefaultAutoMinPages.
	MinPages int
	// Logger receives one line per fallback (default slog.Default()).
	Logger *slog.Logger
}

// FallbackStats counts what a Fallback did with its batches.
type FallbackStats struct {
	Primary   uint64 // batches compressed by the primary
	CPU       uint64 // batches compressed by the CPU, for any reason
	Fallbacks uint64 // batches the primary failed or overran, redone on the CPU
	Timeouts  uint64 // of Fallbacks: watchdog deadlines
	Skipped   uint64 // batches sent to the CPU while the primary backed off
	Small     uint64 // batches below MinPages, sent to the CPU
}

// Fallback is a codec.BatchCompressor that uses a primary compressor (the
// GPU) and redoes on the CPU compressor, with the same batch, every batch
// the primary fails or does not finish within the watchdog deadline. The
// caller never sees a failure of the primary.
//
// The primary never writes the caller's batch: it gets a batch that shares
// the (read-only) pages but has outputs of its own, which are copied to the
// caller's batch on success. So a primary that is still running after its
// deadline (a hung GPU) cannot touch results the CPU has since written;
// its private outputs are reused only once it has returned.
type Fallback struct {
	primary codec.BatchCompressor
	cpu     codec.BatchCompressor
	opt     FallbackOptions
	log     *slog.Logger

	retryAt  atomic.Int64 // unix nanoseconds before which the primary is skipped
	mu       sync.Mutex   // guards failures
	failures int          // consecutive failures of the primary

	shadowMu sync.Mutex
	shadows  []*codec.Batch // private outputs for the primary, free ones

	primaryN, cpuN, fallbacks, timeouts, skipped, small atomic.Uint64
}

// WithFallback returns primary guarded by cpu, which must never fail.
func WithFallback(primary, cpu codec.BatchCompressor, opt FallbackOptions) *Fallback {
	if opt.Timeout <= 0 {
		opt.Timeout = time.Second
	}
	if opt.MinBackoff <= 0 {
		opt.MinBackoff = 100 * time.Millisecond
	}
	if opt.MaxBackoff < opt.MinBackoff {
		opt.MaxBackoff = max(time.Minute, opt.MinBackoff)
	}
	if opt.Logger == nil {
		opt.Logger = slog.Default()
	}
	return &Fallback{primary: primary, cpu: cpu, opt: opt, log: opt.Logger}
}

// Name implements codec.BatchCompressor: the primary's name.
func (f *Fallback) Name() string { return f.primary.Name() }

// NewBatch implements codec.BatchAllocator with the primary's allocator
// when it has one (pinned memory for the GPU).
func (f *Fallback) NewBatch(capacity int) (*codec.Batch, error) {
	if a, ok := f.primary.(codec.BatchAllocator); ok {
		b, err := a.NewBatch(capacity)
		if err == nil {
			return b, nil
		}
		f.log.Warn("gpu: primary cannot allocate a batch, using the Go heap", "err", err)
	}
	return codec.NewBatch(capacity), nil
}

// Stats returns the counters.
func (f *Fallback) Stats() FallbackStats {
	return FallbackStats{
		Primary: f.primaryN.Load(), CPU: f.cpuN.Load(), Fallbacks: f.fallbacks.Load(),
		Timeouts: f.timeouts.Load(), Skipped: f.skipped.Load(), Small: f.small.Load(),
	}
}

func (f *Fallback) toCPU(ctx context.Context, b *codec.Batch) error {
	f.cpuN.Add(1)
	return f.cpu.CompressBatch(ctx, b)
}

// CompressBatch implements codec.BatchCompressor.
func (f *Fallback) CompressBatch(ctx context.Context, b *codec.Batch) error {
	if b.N == 0 {
		return nil
	}
	if b.N < f.opt.MinPages {
		f.small.Add(1)
		return f.toCPU(ctx, b)
	}
	if time.Now().UnixNano() < f.retryAt.Load() {
		f.skipped.Add(1)
		return f.toCPU(ctx, b)
	}
	sb := f.shadow(b)
	wctx, cancel := context.WithTimeout(ctx, f.opt.Timeout)
	done := make(chan error, 1)
	start := time.Now()
	go func() { done <- f.primary.CompressBatch(wctx, sb) }()
	var err error
	select {
	case err = <-done:
		cancel()
		if err == nil {
			f.adopt(b, sb)
			f.recycle(sb)
			f.succeeded()
			f.primaryN.Add(1)
			return nil
		}
		f.recycle(sb)
	case <-wctx.Done():
		cancel()
		// The primary may still write sb: recycle it only once it returns.
		go func() {
			<-done
			f.recycle(sb)
		}()
		err = fmt.Errorf("watchdog: no result after %v: %w", time.Since(start).Round(time.Microsecond), wctx.Err())
		if ctx.Err() == nil {
			f.timeouts.Add(1)
		}
	}
	if ctx.Err() == nil {
		// A failure of the primary, not the caller giving up.
		f.failed(b.N, err)
	}
	return f.toCPU(ctx, b)
}

// outputAllocator is implemented by primaries that want their private
// outputs in special memory (the GPU: pinned, so it writes them by DMA).
type outputAllocator interface {
	newOutputs(capacity int) (*codec.Batch, error)
}

// shadow returns a batch sharing b's pages with outputs of its own.
func (f *Fallback) shadow(b *codec.Batch) *codec.Batch {
	need := b.Cap()
	var sb *codec.Batch
	f.shadowMu.Lock()
	for i := len(f.shadows) - 1; i >= 0; i-- {
		if v := f.shadows[i]; v.Cap() >= need && len(v.Out) >= need*codec.PageSize {
			sb = v
			f.shadows = append(f.shadows[:i], f.shadows[i+1:]...)
			break
		}
	}
	f.shadowMu.Unlock()
	if sb == nil {
		if a, ok := f.primary.(outputAllocator); ok {
			if v, err := a.newOutputs(need); err == nil {
				sb = v
			}
		}
	}
	if sb == nil {
		sb = &codec.Batch{
			Out:     make([]byte, need*codec.PageSize),
			Offsets: make([]uint32, need),
			Lens:    make([]uint32, need),
		}
	}
	sb.Pages = b.Pages
	sb.N = b.N
	return sb
}

// adopt copies the primary's results into the caller's batch.
func (f *Fallback) adopt(b, sb *codec.Batch) {
	n := b.N
	end := 0
	for i := range n {
		if l := sb.Lens[i]; l > 0 {
			end = max(end, int(sb.Offsets[i]+l))
		}
	}
	copy(b.Out[:end], sb.Out[:end])
	copy(b.Offsets[:n], sb.Offsets[:n])
	copy(b.Lens[:n], sb.Lens[:n])
}

// recycle returns a shadow batch to the pool, without the caller's pages.
func (f *Fallback) recycle(sb *codec.Batch) {
	sb.Pages = nil
	sb.N = 0
	f.shadowMu.Lock()
	f.shadows = append(f.shadows, sb)
	f.shadowMu.Unlock()
}

func (f *Fallback) succeeded() {
	if f.retryAt.Load() == 0 {
		return
	}
	f.mu.Lock()
	f.failures = 0
	f.retryAt.Store(0)
	f.mu.Unlock()
	f.log.Info("gpu: primary compressor recovered", "primary", f.primary.Name())
}

func (f *Fallback) failed(pages int, err error) {
	f.fallbacks.Add(1)
	f.mu.Lock()
	f.failures++
	backoff := f.opt.MinBackoff
	for i := 1; i < f.failures && backoff < f.opt.MaxBackoff; i++ {
		backoff *= 2
	}
	backoff = min(backoff, f.opt.MaxBackoff)
	f.retryAt.Store(time.Now().Add(backoff).UnixNano())
	failures := f.failures
	f.mu.Unlock()
	f.log.Warn("gpu: batch failed on the primary compressor, compressed on the CPU instead",
		"primary", f.primary.Name(), "pages", pages, "err", err,
		"consecutive_failures", failures, "retry_in", backoff)
}

// Auto returns the compressor for `--backend auto`: the GPU of cfg guarded
// by cpu (batches under DefaultAutoMinPages go to the CPU), or cpu alone
// when no GPU can be used. The returned close function releases the GPU.
func Auto(cfg Config, cpu codec.BatchCompressor, opt FallbackOptions) (codec.BatchCompressor, func() error, error) {
	g, err := Open(cfg)
	if err != nil {
		if errors.Is(err, ErrUnavailable) {
			log := opt.Logger
			if log == nil {
				log = slog.Default()
			}
			log.Info("gpu: not used, compressing on the CPU", "reason", err)
			return cpu, func() error { return nil }, nil
		}
		return nil, nil, err
	}
	if opt.MinPages == 0 {
		opt.MinPages = DefaultAutoMinPages
	}
	return WithFallback(g, cpu, opt), g.Close, nil
}
