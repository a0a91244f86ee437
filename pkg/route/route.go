// Package route is the one place that decides where gzramd compresses a
// page: on the accelerator (the GPU) or on the CPU.
//
// Writes reach it two ways. Staged writes (write-behind, only with an
// accelerator) come as sealed batches from the staging area, nobody
// waiting on them: CompressBatch sends a batch to the accelerator when it
// is large enough to be worth a round trip and the accelerator is healthy,
// and redoes on the CPU, with the same pages, any batch the accelerator
// fails or does not finish within the watchdog deadline. Inline writes (no
// accelerator, staging full, or the accelerator backing off after a
// failure, or too few writes to fill batches worth the accelerator) are a
// request's own pages, compressed on the CPU in the request's goroutine by
// CompressInline. Stage tells the device which of the two a write takes.
//
// The accelerator never writes the caller's outputs: it gets a shadow batch
// that shares the (read-only) pages and has a pinned output set of its own,
// which becomes the caller's batch's on success. So an accelerator still
// running after its deadline (a hung GPU) cannot touch results the CPU has
// since written; a set is reused only once the accelerator has returned.
// Staged batches carry no outputs of their own: a batch takes a set when
// it is compressed, from the accelerator on success or for the CPU, and
// gives it back once committed (ReleaseOutputs). So the sets number the
// batches compressed at once and one more, not twice that.
package route

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gzramd/gzramd/internal/memfd"
	"github.com/gzramd/gzramd/pkg/codec"
)

// Accelerator is a batch compressor with memory of its own kind (pinned,
// for the GPU's DMA): pkg/gpu's Backend.
type Accelerator interface {
	codec.BatchCompressor
	// RegisterPages makes staging memory the caller mapped readable by
	// the accelerator with no copy (pinned); UnregisterPages undoes it,
	// before the caller unmaps it.
	RegisterPages(mem []byte) error
	UnregisterPages(mem []byte) error
	// NewOutputs returns sets batches of pages pages with outputs only,
	// in that memory, made together: pinned memory comes in large
	// pieces, and a piece for each set would waste most of each.
	NewOutputs(sets, pages int) ([]*codec.Batch, error)
}

// Readier is an Accelerator that is not ready from the start: one a
// serving process that took the device over opens while it already serves
// on the CPU. Until Ready, writes compress inline and staged batches on
// the CPU, as with no accelerator, and none of that counts as a failure.
type Readier interface {
	Ready() bool
}

// Observer sees each compressed batch (for metrics); it must be cheap.
type Observer interface {
	BatchDone(backend string, pages int, d time.Duration)
}

// DefaultMinAcceleratorPages is the smallest staged batch sent to the
// accelerator by default. Staged batches wait for nobody, so what decides
// is CPU time: what a GPU batch costs the CPU (driver calls, wake-ups)
// against a few microseconds a page on the CPU. 16 is a first estimate:
// pkg/gpu's TestBenchReport measures both, batch size by batch size, and
// its next run on a GPU is to set this.
const DefaultMinAcceleratorPages = 16

// Config sets a Router up. Zero durations take the defaults.
type Config struct {
	// Accelerator, if not nil, gets the staged batches.
	Accelerator Accelerator
	// Codec is the CPU codec: inline writes, small batches and every
	// batch the accelerator cannot take.
	Codec codec.Codec
	// CPUWorkers spreads a batch compressed on the CPU over this many
	// goroutines (0: GOMAXPROCS).
	CPUWorkers int
	// MinAcceleratorPages sends smaller staged batches to the CPU
	// (0: DefaultMinAcceleratorPages). Writes are staged only while at
	// least that many pages are written per Window: below that rate the
	// batches would be small, and a write compressing its own pages
	// costs the CPU less than staging them.
	MinAcceleratorPages int
	// Window is the staging area's batch deadline (0: staging whatever
	// the rate).
	Window time.Duration
	// Watchdog is the deadline of one batch on the accelerator (default
	// 1s; a full batch takes about a millisecond on a GPU).
	Watchdog time.Duration
	// MinBackoff is how long the accelerator is skipped after a failure;
	// it doubles on each consecutive failure up to MaxBackoff (defaults
	// 100ms and 1m).
	MinBackoff, MaxBackoff time.Duration
	// BatchPages is the largest staged batch, and Workers the most
	// batches compressed at once (the staging area's workers): the
	// router makes Workers+1 output sets of BatchPages pages, in the
	// accelerator's memory. The accelerator runs at most Workers batches
	// at once, fewer by each batch it still holds after the watchdog gave
	// up on it, so that should all of them hang, a set is left for the
	// CPU to redo them with; a batch finding no room goes to the CPU.
	// Both 0 without staging.
	BatchPages, Workers int
	Observer            Observer
	Logger              *slog.Logger
}

// Stats count what the router did.
type Stats struct {
	AcceleratorPages, AcceleratorBatches uint64 // compressed on the accelerator
	CPUPages                             uint64 // compressed on the CPU, inline writes included
	CPUBatches                           uint64 // staged batches compressed on the CPU
	InlinePages                          uint64 // of CPUPages: a request's own pages, in its goroutine
	Fallbacks                            uint64 // batches the accelerator failed or overran, redone on the CPU
	Timeouts                             uint64 // of Fallbacks: watchdog deadlines
	Skipped                              uint64 // batches sent to the CPU while the accelerator backed off
	Small                                uint64 // batches below MinAcceleratorPages, sent to the CPU
	NoShadow                             uint64 // batches sent to the CPU for want of room on the accelerator or a free set
	NotReady                             uint64 // batches sent to the CPU before the accelerator was ready (Readier)
}

// Router is safe for concurrent use.
type Router struct {
	cfg    Config
	accel  Accelerator
	ready  func() bool     // the accelerator's Readier, or nil: always ready
	cpu    *codec.CPUBatch // batches, spread over CPUs
	inline *codec.CPUBatch // a request's pages, in its goroutine
	log    *slog.Logger

	retryAt  atomic.Int64 // unix nanoseconds before which the accelerator is skipped
	mu       sync.Mutex   // guards failures
	failures int          // consecutive failures of the accelerator

	// sets are the free output sets; lent holds the structs of the sets
	// whose outputs a batch holds, to carry them back (ReleaseOutputs).
	sets, lent chan *codec.Batch
	// setObjects is each set's own copy of its batch's objects
	// (codec.Batch.Objects): an accelerator the watchdog gave up on may
	// still read them after the batch's owner has moved on.
	setObjects map[*codec.Batch][]uint8
	// onAccel counts the accelerator's calls not yet returned, given up
	// on or not; calls waits for them.
	onAccel atomic.Int64
	calls   sync.WaitGroup

	// The write rate, for Stage: pages written since winStart (unix
	// nanoseconds), and whether the last window had enough of them.
	winStart, winPages atomic.Int64
	busy               atomic.Bool

	accelPages, accelBatches, cpuPages, cpuBatches, inlinePages    atomic.Uint64
	fallbacks, timeouts, skipped, small, noShadow, notReadyBatches atomic.Uint64
}

// New makes a router and, with an accelerator, its output sets.
func New(cfg Config) (*Router, error) {
	if cfg.Codec == nil {
		return nil, errors.New("route: a CPU codec is required")
	}
	if cfg.MinAcceleratorPages <= 0 {
		cfg.MinAcceleratorPages = DefaultMinAcceleratorPages
	}
	if cfg.Watchdog <= 0 {
		cfg.Watchdog = time.Second
	}
	if cfg.MinBackoff <= 0 {
		cfg.MinBackoff = 100 * time.Millisecond
	}
	if cfg.MaxBackoff < cfg.MinBackoff {
		cfg.MaxBackoff = max(time.Minute, cfg.MinBackoff)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	r := &Router{
		cfg: cfg, accel: cfg.Accelerator, log: cfg.Logger,
		cpu:    codec.NewCPUBatch(cfg.Codec, cfg.CPUWorkers),
		inline: codec.NewCPUBatch(cfg.Codec, 1),
	}
	r.busy.Store(true)
	r.winStart.Store(time.Now().UnixNano())
	if rd, ok := r.accel.(Readier); ok {
		r.ready = rd.Ready
	}
	if r.accel != nil {
		if cfg.Workers < 1 || cfg.BatchPages < 1 {
			return nil, fmt.Errorf("route: %d workers with batches of %d pages for the accelerator: want at least 1 of 1", cfg.Workers, cfg.BatchPages)
		}
		n := r.numSets()
		sets, err := r.accel.NewOutputs(n, cfg.BatchPages)
		if err != nil {
			return nil, fmt.Errorf("route: output sets for staged batches: %w", err)
		}
		r.sets, r.lent = make(chan *codec.Batch, n), make(chan *codec.Batch, n)
		r.setObjects = make(map[*codec.Batch][]uint8, n)
		for _, s := range sets {
			// Faulted in now, in one system call each (a takeover
			// waits for this), so that they are resident.
			memfd.Populate(s.Out)
			r.setObjects[s] = make([]uint8, cfg.BatchPages)
			r.sets <- s
		}
	}
	return r, nil
}

// numSets is the output sets made: one for each worker's batch and one
// for the CPU when all of them hang on the accelerator.
func (r *Router) numSets() int { return r.cfg.Workers + 1 }

// takeOutputs gives b, a batch without outputs, a free set's, waiting for
// one if need be: a batch holding one is committed and gives it back, and
// the accelerator never holds them all (accelerate).
func (r *Router) takeOutputs(b *codec.Batch) {
	s := <-r.sets
	b.Out, b.Offsets, b.Lens = s.Out, s.Offsets, s.Lens
	s.Out, s.Offsets, s.Lens = nil, nil, nil
	r.lent <- s
}

// ReleaseOutputs takes back the output set CompressBatch gave a batch
// without outputs of its own, once the batch is committed; it does
// nothing if CompressBatch gave it none (a batch of no pages).
func (r *Router) ReleaseOutputs(b *codec.Batch) {
	if b.Out == nil {
		return
	}
	s := <-r.lent
	s.Out, s.Offsets, s.Lens = b.Out, b.Offsets, b.Lens
	b.Out, b.Offsets, b.Lens = nil, nil, nil
	r.sets <- s
}

// HeldBytes is the accelerator's memory the router holds: the output sets
// and their copies of objects.
func (r *Router) HeldBytes() int64 {
	if r.accel == nil {
		return 0
	}
	return int64(r.numSets()) * int64(r.cfg.BatchPages) * (codec.PageSize + 8 + 1)
}

// Stage reports whether a write of pages whole pages is to be staged for
// the accelerator: there is one, it is not backing off after a failure,
// and the write alone, or the writes of the last window together, fill a
// batch worth it (see Config.MinAcceleratorPages). Otherwise the write
// compresses its pages inline, which costs no copy into staging and no
// batch. It is a question only: Count tells the router of each write.
func (r *Router) Stage(pages int) bool {
	if r.accel == nil || r.notReady() {
		return false
	}
	if time.Now().UnixNano() < r.retryAt.Load() {
		return false
	}
	return pages >= r.cfg.MinAcceleratorPages || r.busy.Load()
}

// Count tells the router of a write of pages whole pages, staged or not,
// so that it knows the write rate (Config.Window): once for each write,
// however many times Stage was asked about it.
func (r *Router) Count(pages int) {
	w := int64(r.cfg.Window)
	if r.accel == nil || w <= 0 {
		return
	}
	now := time.Now().UnixNano()
	seen := r.winPages.Add(int64(pages))
	if start := r.winStart.Load(); now-start >= w && r.winStart.CompareAndSwap(start, now) {
		// The window that ended decides the next; pages counted
		// meanwhile by other writers fall into either.
		r.winPages.Add(-seen)
		r.busy.Store(seen*w >= int64(r.cfg.MinAcceleratorPages)*(now-start))
	}
}

// notReady reports whether the accelerator is a Readier not ready yet.
func (r *Router) notReady() bool { return r.ready != nil && !r.ready() }

// RegisterPages makes staging memory readable by the accelerator, if there
// is one, with no copy.
func (r *Router) RegisterPages(mem []byte) error {
	if r.accel != nil {
		return r.accel.RegisterPages(mem)
	}
	return nil
}

// UnregisterPages undoes RegisterPages, once no batch the watchdog gave
// up on can still be reading the pages. It fails, leaving mem registered,
// when one is still running after unregisterWait: the caller must not
// unmap mem then.
func (r *Router) UnregisterPages(mem []byte) error {
	if r.accel == nil {
		return nil
	}
	idle := make(chan struct{})
	go func() {
		r.calls.Wait()
		close(idle)
	}()
	select {
	case <-idle:
	case <-time.After(unregisterWait):
		return fmt.Errorf("route: the accelerator has not returned a batch it may be reading staging memory for, after %v", unregisterWait)
	}
	return r.accel.UnregisterPages(mem)
}

// unregisterWait is how long UnregisterPages waits for the batches the
// watchdog gave up on.
const unregisterWait = 10 * time.Second

// CompressInline compresses a request's own pages on the CPU, in the
// caller's goroutine, into b (which may have Pages pointing at the
// request's buffer).
func (r *Router) CompressInline(b *codec.Batch) {
	r.inline.CompressBatch(context.Background(), b) //nolint:errcheck // the CPU never fails
	r.inlinePages.Add(uint64(b.N))
	r.cpuPages.Add(uint64(b.N))
}

// CountInline counts pages the caller compressed inline itself, on the
// CPU, as CompressInline would have (a write's pages kept together as one
// object).
func (r *Router) CountInline(pages int) {
	r.inlinePages.Add(uint64(pages))
	r.cpuPages.Add(uint64(pages))
}

// CompressBatch compresses a sealed batch of staged pages: on the
// accelerator when there is one, it is not backing off, the batch is
// large enough and the accelerator has room (Config.Workers); on the CPU
// otherwise, and whenever the accelerator fails or overruns the
// watchdog. It never fails. A batch without outputs of its own (Out nil)
// is given a set, which the caller gives back with ReleaseOutputs.
func (r *Router) CompressBatch(b *codec.Batch) {
	if b.N == 0 {
		return
	}
	switch {
	case r.accel == nil:
	case r.notReady():
		r.notReadyBatches.Add(1)
	case b.N < r.cfg.MinAcceleratorPages:
		r.small.Add(1)
	case time.Now().UnixNano() < r.retryAt.Load():
		r.skipped.Add(1)
	default:
		if r.accelerate(b) {
			return
		}
	}
	if b.Out == nil {
		r.takeOutputs(b)
	}
	start := time.Now()
	r.cpu.CompressBatch(context.Background(), b) //nolint:errcheck // the CPU never fails
	r.cpuPages.Add(uint64(b.N))
	r.cpuBatches.Add(1)
	if r.cfg.Observer != nil {
		r.cfg.Observer.BatchDone(r.cpu.Name(), b.N, time.Since(start))
	}
}

// accelerate runs b on the accelerator under the watchdog and reports
// whether b now holds its results.
//
// The accelerator gets a set as its shadow of b, and only while fewer
// than Workers of its calls have not returned: so that, were every one of
// them to hang, the sets not held by one would still let the batches they
// left be redone on the CPU.
func (r *Router) accelerate(b *codec.Batch) bool {
	if b.N > r.cfg.BatchPages {
		r.noShadow.Add(1)
		return false
	}
	if r.onAccel.Add(1) > int64(r.cfg.Workers) {
		r.onAccel.Add(-1)
		r.noShadow.Add(1)
		return false
	}
	var sb *codec.Batch
	select {
	case sb = <-r.sets:
	default:
		// Hung calls hold the sets the other batches do not: to the
		// CPU, which waits for a batch to give one back.
		r.onAccel.Add(-1)
		r.noShadow.Add(1)
		return false
	}
	sb.Pages, sb.N, sb.Limit = b.Pages, b.N, b.Limit
	if b.Objects != nil {
		sb.Objects = r.setObjects[sb][:b.N]
		copy(sb.Objects, b.Objects)
	}
	ctx, cancel := context.WithTimeout(context.Background(), r.cfg.Watchdog)
	defer cancel()
	done := make(chan error, 1)
	start := time.Now()
	r.calls.Add(1)
	go func() {
		defer r.calls.Done()
		err := r.accel.CompressBatch(ctx, sb)
		r.onAccel.Add(-1)
		done <- err
	}()
	var err error
	select {
	case err = <-done:
		if err == nil {
			// The results are the shadow's: swap them in. The
			// caller's old outputs, if it had any, make a set again;
			// if not, the set's struct waits in lent for the outputs
			// the caller now holds.
			b.Out, sb.Out = sb.Out, b.Out
			b.Offsets, sb.Offsets = sb.Offsets, b.Offsets
			b.Lens, sb.Lens = sb.Lens, b.Lens
			if sb.Out == nil {
				sb.Pages, sb.N, sb.Objects = nil, 0, nil
				r.lent <- sb
			} else {
				r.recycle(sb)
			}
			r.succeeded()
			r.accelPages.Add(uint64(b.N))
			r.accelBatches.Add(1)
			if r.cfg.Observer != nil {
				r.cfg.Observer.BatchDone(r.accel.Name(), b.N, time.Since(start))
			}
			return true
		}
		r.recycle(sb)
	case <-ctx.Done():
		// The accelerator may still write sb: recycle it only once it
		// returns.
		go func() {
			<-done
			r.recycle(sb)
		}()
		err = fmt.Errorf("watchdog: no result after %v: %w", time.Since(start).Round(time.Microsecond), ctx.Err())
		r.timeouts.Add(1)
	}
	r.failed(b.N, err)
	return false
}

// recycle returns a set to the free ones, without the caller's pages.
func (r *Router) recycle(sb *codec.Batch) {
	sb.Pages, sb.N, sb.Objects = nil, 0, nil
	r.sets <- sb
}

func (r *Router) succeeded() {
	if r.retryAt.Load() == 0 {
		return
	}
	r.mu.Lock()
	r.failures = 0
	r.retryAt.Store(0)
	r.mu.Unlock()
	r.log.Info("route: the accelerator works again; staging writes for it", "accelerator", r.accel.Name())
}

func (r *Router) failed(pages int, err error) {
	r.fallbacks.Add(1)
	r.mu.Lock()
	r.failures++
	backoff := r.cfg.MinBackoff
	for i := 1; i < r.failures && backoff < r.cfg.MaxBackoff; i++ {
		backoff *= 2
	}
	backoff = min(backoff, r.cfg.MaxBackoff)
	r.retryAt.Store(time.Now().Add(backoff).UnixNano())
	failures := r.failures
	r.mu.Unlock()
	r.log.Warn("route: batch failed on the accelerator, compressed on the CPU instead; writes compress inline until it is retried",
		"accelerator", r.accel.Name(), "pages", pages, "err", err,
		"consecutive_failures", failures, "retry_in", backoff)
}

// Stats returns the counters.
func (r *Router) Stats() Stats {
	return Stats{
		AcceleratorPages: r.accelPages.Load(), AcceleratorBatches: r.accelBatches.Load(),
		CPUPages: r.cpuPages.Load(), CPUBatches: r.cpuBatches.Load(), InlinePages: r.inlinePages.Load(),
		Fallbacks: r.fallbacks.Load(), Timeouts: r.timeouts.Load(), Skipped: r.skipped.Load(),
		Small: r.small.Load(), NoShadow: r.noShadow.Load(), NotReady: r.notReadyBatches.Load(),
	}
}
