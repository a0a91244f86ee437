// Package batch groups page writes into batches for a compression backend,
// like a group commit: while the backend is busy, arriving pages gather in
// the open batch; when a backend slot frees up the batch goes out. A batch
// also closes when full, and for backends that want large batches (the GPU)
// it waits up to a deadline to grow before it goes to the CPU instead.
//
// A page stays in its batch's input buffer until every waiter has committed
// its result, so a failed backend can be replaced by the CPU codec for
// exactly the pages not yet held.
package batch

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gzramd/gzramd/internal/freelist"
	"github.com/gzramd/gzramd/pkg/codec"
)

// Config tunes the batcher. Zero values take the defaults.
type Config struct {
	// MaxPages closes a batch when it holds this many pages (default 256).
	MaxPages int
	// InFlight is the number of batches compressing at once; writers block
	// (backpressure) when all are busy and the open batch is full
	// (default 4).
	InFlight int
	// MinPrimaryPages is the smallest batch the primary backend gets; a
	// smaller batch goes to the CPU backend (default 1: any batch).
	MinPrimaryPages int
	// Deadline is how long a batch smaller than MinPrimaryPages may wait
	// to grow before it goes to the CPU (default 500µs).
	Deadline time.Duration
	// Limit is the longest compressed page worth keeping (codec.Batch's
	// Limit): set it below the device's huge threshold so pages that will
	// be stored raw anyway cost less to try. 0: PageSize-1.
	Limit int
}

func (c *Config) setDefaults() error {
	if c.MaxPages == 0 {
		c.MaxPages = 256
	}
	if c.InFlight == 0 {
		c.InFlight = 4
	}
	if c.MinPrimaryPages == 0 {
		c.MinPrimaryPages = 1
	}
	if c.Deadline == 0 {
		c.Deadline = 500 * time.Microsecond
	}
	switch {
	case c.MaxPages < 1 || c.MaxPages > 1<<16:
		return fmt.Errorf("batch: max pages %d out of range [1, 65536]", c.MaxPages)
	case c.InFlight < 1 || c.InFlight > 1024:
		return fmt.Errorf("batch: in-flight batches %d out of range [1, 1024]", c.InFlight)
	case c.MinPrimaryPages > c.MaxPages:
		return fmt.Errorf("batch: min primary pages %d above max pages %d", c.MinPrimaryPages, c.MaxPages)
	case c.Deadline < 0:
		return fmt.Errorf("batch: negative deadline %v", c.Deadline)
	}
	return nil
}

// ErrClosed is returned for pages submitted after Close.
var ErrClosed = errors.New("batch: batcher closed")

// Stats are cumulative counters, safe to read at any time.
type Stats struct {
	Batches        uint64 // batches compressed, all backends
	Pages          uint64
	PrimaryBatches uint64
	CPUBatches     uint64
	BackendErrors  uint64 // primary failures the CPU covered
	DirectRequests uint64 // requests compressed on the CPU in their own goroutine
}

// Observer sees each compressed batch (for metrics); it must be cheap.
type Observer interface {
	BatchDone(backend string, pages int, d time.Duration)
}

// Batcher is safe for concurrent use.
type Batcher struct {
	cfg      Config
	primary  codec.BatchCompressor
	cpu      codec.BatchCompressor
	observer Observer

	mu      sync.Mutex
	open    *slot // batch accepting pages; nil when none is free
	free    []*slot
	idle    int // workers waiting for a batch
	closed  bool
	ready   *sync.Cond // signalled when open gets a page or closes
	freed   *sync.Cond // signalled when a slot returns to free
	timer   *time.Timer
	workers sync.WaitGroup
	refs    *freelist.List[*[]ref] // so requests do not allocate
	// scratch holds the direct path's output buffers (batches without
	// Pages), all made and written by New: a direct request waits for one
	// rather than allocating fresh memory while the kernel waits for it.
	scratch chan *codec.Batch

	isClosed atomic.Bool
	active   atomic.Int64 // pages inside Compress

	batches, pages, primaryBatches, cpuBatches, backendErrors, cpuDirect atomic.Uint64
}

// slot is one batch buffer and the waiters on its pages.
type slot struct {
	b       *codec.Batch
	opened  time.Time
	done    chan struct{} // closed when compression finished
	pending atomic.Int32  // waiters that have not committed yet
	filling atomic.Int32  // writers still copying pages in
}

// New starts a batcher. primary compresses batches of at least
// MinPrimaryPages pages; cpu takes the rest and must never fail. primary
// may be the same as cpu. Batches come from primary when it is a
// codec.BatchAllocator (pinned memory for the GPU).
func New(primary, cpu codec.BatchCompressor, cfg Config, obs Observer) (*Batcher, error) {
	if err := cfg.setDefaults(); err != nil {
		return nil, err
	}
	if primary == nil || cpu == nil {
		return nil, errors.New("batch: nil backend")
	}
	bt := &Batcher{cfg: cfg, primary: primary, cpu: cpu, observer: obs}
	bt.ready = sync.NewCond(&bt.mu)
	bt.freed = sync.NewCond(&bt.mu)
	workers := cfg.InFlight
	if primary == cpu {
		workers = -1 // direct mode: no batch buffers, no workers
	}
	for range workers + 1 { // one more than in flight: one can fill while the others compress
		var b *codec.Batch
		if a, ok := primary.(codec.BatchAllocator); ok {
			var err error
			if b, err = a.NewBatch(cfg.MaxPages); err != nil {
				return nil, fmt.Errorf("batch: allocating %s batch buffers: %w", primary.Name(), err)
			}
		} else {
			b = codec.NewBatch(cfg.MaxPages)
		}
		b.Limit = cfg.Limit
		bt.free = append(bt.free, &slot{b: b})
	}
	// Kept across collections, as many as requests have needed at once.
	bt.refs = freelist.New(maxConcurrentRequests, func() *[]ref {
		r := make([]ref, 64)
		clear(r) // written now, not first while serving
		r = r[:0]
		return &r
	})
	bt.refs.Fill()
	// More than can compress at once (one per thread running Go code).
	bt.scratch = make(chan *codec.Batch, 2*runtime.GOMAXPROCS(0)+2)
	for range cap(bt.scratch) {
		k := min(directChunk, cfg.MaxPages)
		b := &codec.Batch{Out: make([]byte, k*codec.PageSize), Offsets: make([]uint32, k), Lens: make([]uint32, k), Limit: cfg.Limit}
		clear(b.Out)
		bt.scratch <- b
	}
	bt.timer = time.AfterFunc(time.Hour, func() {
		// Under the lock, or a worker between its deadline check and its
		// Wait would miss the wakeup.
		bt.mu.Lock()
		bt.ready.Broadcast()
		bt.mu.Unlock()
	})
	bt.timer.Stop()
	for range workers {
		bt.workers.Add(1)
		go bt.work()
	}
	return bt, nil
}

// ref locates one submitted page in its batch.
type ref struct {
	s    *slot
	i    int // index in the batch
	page int // index in the caller's pages
}

// Compress adds the pages (a whole number of PageSize pages) to batches
// and, once each page's batch is compressed, calls commit with the page's
// index and its compressed bytes (nil when it did not compress below
// PageSize) while the batch still holds the page. commit is called exactly
// once for each of the first accepted pages; accepted < len(pages)/PageSize
// only when err is not nil (closed, or ctx done while waiting for a
// buffer). err is otherwise commit's first error. The pages are copied; the
// caller may reuse them when Compress returns.
func (bt *Batcher) Compress(ctx context.Context, pages []byte, commit func(i int, compressed []byte) error) (accepted int, err error) {
	n := len(pages) / codec.PageSize
	if n == 0 || len(pages)%codec.PageSize != 0 {
		return 0, fmt.Errorf("batch: %d bytes is not a whole number of %d-byte pages", len(pages), codec.PageSize)
	}
	// Pages from requests in flight right now; fewer than the primary's
	// minimum cannot make a batch for it without waiting for more, so
	// under light load they are compressed at once on the CPU instead of
	// idling until the deadline.
	active := bt.active.Add(int64(n))
	defer bt.active.Add(-int64(n))
	if bt.primary == bt.cpu || active < int64(bt.cfg.MinPrimaryPages) {
		return bt.direct(pages, n, commit)
	}
	refs := bt.refs.Get()
	defer bt.refs.Put(refs)
	*refs = (*refs)[:0]
	// settle commits every page submitted so far. A request must settle
	// before it waits for a buffer: the buffers its pages hold can only be
	// freed by its own commits.
	settled := 0 // of *refs
	settle := func() {
		for ; settled < len(*refs); settled++ {
			r := (*refs)[settled]
			<-r.s.done
			cerr := commit(r.page, r.s.b.Compressed(r.i))
			if cerr != nil && err == nil {
				err = cerr
			}
			bt.settled(r.s)
		}
		*refs = (*refs)[:0]
		settled = 0
	}
	defer func() {
		// Only after a panic in commit are pages left: give their slots
		// back, or the batcher would run out of buffers for everyone.
		for _, r := range (*refs)[min(settled+1, len(*refs)):] {
			<-r.s.done
			bt.settled(r.s)
		}
		if settled < len(*refs) {
			bt.settled((*refs)[settled].s) // the page whose commit panicked
		}
	}()
	for accepted < n {
		bt.mu.Lock()
		if bt.closed {
			bt.mu.Unlock()
			settle()
			return accepted, ErrClosed
		}
		if bt.open == nil || bt.open.b.N == bt.cfg.MaxPages {
			if bt.open == nil && len(bt.free) > 0 {
				bt.open = bt.free[len(bt.free)-1]
				bt.free = bt.free[:len(bt.free)-1]
				bt.open.b.N = 0
				bt.open.done = make(chan struct{})
			} else if len(*refs) > 0 {
				bt.mu.Unlock()
				settle()
				continue
			} else {
				if cerr := ctx.Err(); cerr != nil {
					bt.mu.Unlock()
					return accepted, cerr
				}
				bt.freed.Wait() // backpressure: every buffer is full or compressing
				bt.mu.Unlock()
				continue
			}
		}
		// Reserve slots under the lock; copy the pages outside it, so
		// that writers fill a batch in parallel. The worker waits for
		// the copies (filling) before it compresses.
		s := bt.open
		first, from := s.b.N, accepted
		k := min(n-accepted, bt.cfg.MaxPages-first)
		s.b.N += k
		s.pending.Add(int32(k))
		s.filling.Add(1)
		if first == 0 {
			s.opened = time.Now()
			if bt.cfg.MinPrimaryPages > 1 {
				bt.timer.Reset(bt.cfg.Deadline)
			}
		}
		for j := range k {
			*refs = append(*refs, ref{s: s, i: first + j, page: accepted + j})
		}
		accepted += k
		if bt.idle > 0 {
			bt.ready.Signal()
		}
		bt.mu.Unlock()
		copy(s.b.Pages[first*codec.PageSize:(first+k)*codec.PageSize], pages[from*codec.PageSize:accepted*codec.PageSize])
		s.filling.Add(-1)
	}
	settle()
	return accepted, err
}

// maxConcurrentRequests is how many requests' page lists the batcher
// keeps for reuse; more at once allocate.
const maxConcurrentRequests = 64

// directChunk bounds the scratch memory of one direct request.
const directChunk = 32

// direct compresses a request's pages on the CPU in the caller's
// goroutine: with only the CPU to compress on, or too few pages in flight
// for the primary, batching buys nothing, and handing pages to a worker
// costs two goroutine switches and a copy per request, which at queue
// depth 1 is most of a write's latency.
func (bt *Batcher) direct(pages []byte, n int, commit func(i int, compressed []byte) error) (int, error) {
	if bt.isClosed.Load() {
		return 0, ErrClosed
	}
	bt.cpuDirect.Add(1)
	b := <-bt.scratch
	defer func() { bt.scratch <- b }()
	var err error
	for done := 0; done < n; {
		k := min(n-done, len(b.Lens))
		b.Pages, b.N = pages[done*codec.PageSize:(done+k)*codec.PageSize], k
		bt.compressWith(bt.cpu, b)
		for i := range k {
			if cerr := commit(done+i, b.Compressed(i)); cerr != nil && err == nil {
				err = cerr
			}
		}
		done += k
	}
	b.Pages = nil
	return n, err
}

// settled marks one page of s as committed; the last one frees s.
func (bt *Batcher) settled(s *slot) {
	if s.pending.Add(-1) == 0 {
		bt.release(s)
	}
}

func (bt *Batcher) release(s *slot) {
	bt.mu.Lock()
	bt.free = append(bt.free, s)
	bt.mu.Unlock()
	bt.freed.Broadcast()
}

// take waits for a batch worth sending and detaches it.
func (bt *Batcher) take() *slot {
	bt.mu.Lock()
	defer bt.mu.Unlock()
	for {
		s := bt.open
		if s != nil && s.b.N > 0 {
			if s.b.N >= bt.cfg.MinPrimaryPages || bt.closed ||
				time.Since(s.opened) >= bt.cfg.Deadline {
				bt.open = nil
				bt.freed.Broadcast() // writers waiting on a full batch can open a new one
				return s
			}
		} else if bt.closed {
			return nil
		}
		bt.idle++
		bt.ready.Wait()
		bt.idle--
	}
}

func (bt *Batcher) work() {
	defer bt.workers.Done()
	for {
		s := bt.take()
		if s == nil {
			return
		}
		bt.compress(s)
		close(s.done)
	}
}

func (bt *Batcher) compress(s *slot) {
	for s.filling.Load() != 0 {
		runtime.Gosched() // a writer is still copying its pages in
	}
	backend := bt.cpu
	if s.b.N >= bt.cfg.MinPrimaryPages {
		backend = bt.primary
	}
	bt.compressWith(backend, s.b)
}

// compressWith compresses b on backend, on the CPU if backend fails, and
// keeps the counters.
func (bt *Batcher) compressWith(backend codec.BatchCompressor, b *codec.Batch) {
	start := time.Now()
	err := backend.CompressBatch(context.Background(), b)
	if err != nil && backend != bt.cpu {
		bt.backendErrors.Add(1)
		backend = bt.cpu
		err = backend.CompressBatch(context.Background(), b)
	}
	if err != nil {
		// The CPU backend does not fail; if it ever does, store every page raw
		// rather than lose one.
		for i := range b.N {
			b.Lens[i] = 0
		}
	}
	if backend == bt.cpu && bt.cpu != bt.primary {
		bt.cpuBatches.Add(1)
	} else {
		bt.primaryBatches.Add(1)
	}
	bt.batches.Add(1)
	bt.pages.Add(uint64(b.N))
	if bt.observer != nil {
		bt.observer.BatchDone(backend.Name(), b.N, time.Since(start))
	}
}

// Stats returns the cumulative counters.
func (bt *Batcher) Stats() Stats {
	return Stats{
		Batches:        bt.batches.Load(),
		Pages:          bt.pages.Load(),
		PrimaryBatches: bt.primaryBatches.Load(),
		CPUBatches:     bt.cpuBatches.Load(),
		BackendErrors:  bt.backendErrors.Load(),
		DirectRequests: bt.cpuDirect.Load(),
	}
}

// Close compresses what is queued, waits for the workers and refuses new
// pages.
func (bt *Batcher) Close() {
	bt.mu.Lock()
	bt.closed = true
	bt.isClosed.Store(true)
	bt.mu.Unlock()
	bt.ready.Broadcast()
	bt.freed.Broadcast()
	bt.timer.Stop()
	bt.workers.Wait()
}
