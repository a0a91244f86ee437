// Package stage is gzramd's write-behind staging area: pages a writer has
// handed over wait here, already acknowledged, until a worker compresses
// them in batches and their owner commits the results.
//
// The area is a fixed set of batch buffers, allocated (for the GPU: pinned)
// and written when the area is made. Writers take slots in the open batch
// and copy their pages in; the batch is sealed when it is full or when its
// first page has waited Config.Deadline, and a worker hands it to the
// owner's flush function, which compresses it and commits every page, and
// then returns the buffer for reuse. Nobody waits for a batch but its
// worker: a write costs a copy, not a compression.
//
// A staged page stays in its buffer until the flush of its batch returns,
// so the owner can serve reads from it meanwhile and redo the compression
// elsewhere (the CPU) if the first compressor fails, with nothing lost.
package stage

import (
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gzramd/gzramd/internal/memfd"
	"github.com/gzramd/gzramd/pkg/codec"
)

// Config sizes an area.
type Config struct {
	// Batches is the number of batch buffers (at least 2: one filling
	// while others compress).
	Batches int
	// BatchPages is the number of pages a buffer holds (1 to 65536).
	BatchPages int
	// Deadline is the longest the first page of a batch waits for the
	// batch to fill before it is sealed anyway.
	Deadline time.Duration
	// Workers is the number of batches flushed at once.
	Workers int
	// Limit is the batches' codec.Batch.Limit.
	Limit int
	// Wait is how long Take waits for a buffer when every one is busy
	// before it gives up and the writer compresses its pages itself (0:
	// not at all). Worth it where the accelerator is much cheaper than the
	// CPU's codec (zstd): a few milliseconds of a swap-out's latency for
	// tens of times the CPU.
	Wait time.Duration
}

func (c Config) validate() error {
	switch {
	case c.Batches < 2 || c.Batches > MaxBatches:
		return fmt.Errorf("stage: %d batches out of range [2, %d]", c.Batches, MaxBatches)
	case c.BatchPages < 1 || c.BatchPages > MaxBatchPages:
		return fmt.Errorf("stage: %d pages a batch out of range [1, %d]", c.BatchPages, MaxBatchPages)
	case c.Deadline <= 0:
		return fmt.Errorf("stage: deadline %v is not positive", c.Deadline)
	case c.Workers < 1 || c.Workers > c.Batches:
		return fmt.Errorf("stage: %d workers out of range [1, %d batches]", c.Workers, c.Batches)
	case c.Wait < 0:
		return fmt.Errorf("stage: wait %v is negative", c.Wait)
	}
	return nil
}

// The bounds of Config: a staged page is named by its batch and its index
// there in 32 bits (see Slot).
const (
	MaxBatches    = 1 << 16
	MaxBatchPages = 1 << 16
)

// Batch is one buffer of staged pages. Its codec.Batch holds the pages (N
// of them so far); outputs for their compressed forms are the flush
// function's to attach.
type Batch struct {
	*codec.Batch
	// ID names the buffer for Area.Page; it never changes.
	ID int
	// Owners and Words are the owner's, one each per staged page: the
	// writer sets them before Done, the flush function reads them.
	Owners []uint32
	Words  []uint64

	opened  time.Time    // when the first page was taken
	filling atomic.Int32 // writers between Take and Done
}

// Stats are an area's counters.
type Stats struct {
	Batches, BatchPages int    // the area's shape
	Busy                int    // buffers filling, sealed or being flushed
	Refused             uint64 // Takes that found every buffer busy (for Config.Wait)
	Waited              uint64 // Takes that waited for a buffer and got one
	SealedFull          uint64 // batches sealed because they were full
	SealedDeadline      uint64 // batches sealed by the deadline (or Close)
}

// Area is safe for concurrent use.
type Area struct {
	cfg     Config
	batches []*Batch
	flush   func(*Batch)

	mu     sync.Mutex
	open   *Batch   // taking pages; nil when none is
	free   []*Batch // empty buffers
	sealed []*Batch // waiting for a worker, oldest first
	closed bool
	work   sync.Cond // signalled when sealed grows or the area closes
	timer  *time.Timer

	workers sync.WaitGroup

	refused, waited, sealedFull, sealedDeadline atomic.Uint64
}

// New makes an area of cfg.Batches buffers from newPages (which returns
// memory for the given number of pages) and starts its workers, which call
// flush for each sealed batch. flush must commit or otherwise settle every
// page of the batch before it returns: the buffer is then reused.
func New(cfg Config, newPages func(pages int) ([]byte, error), flush func(*Batch)) (*Area, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	a := &Area{cfg: cfg, flush: flush}
	a.work.L = &a.mu
	owners := make([]uint32, cfg.Batches*cfg.BatchPages)
	words := make([]uint64, cfg.Batches*cfg.BatchPages)
	for id := range cfg.Batches {
		pages, err := newPages(cfg.BatchPages)
		if err != nil {
			return nil, fmt.Errorf("stage: allocating batch %d of %d pages: %w", id, cfg.BatchPages, err)
		}
		if len(pages) < cfg.BatchPages*codec.PageSize {
			return nil, fmt.Errorf("stage: allocator returned %d bytes for %d pages", len(pages), cfg.BatchPages)
		}
		cb := &codec.Batch{Pages: pages[:cfg.BatchPages*codec.PageSize], Limit: cfg.Limit}
		// Faulted in now: under mlockall(MCL_ONFAULT) a first touch is a
		// fault, and a writer copying a swapped-out page in must not
		// fault. In one system call, not a fault a page: under a
		// hypervisor each fault costs an exit, and a takeover waits for
		// these.
		memfd.Populate(cb.Pages)
		lo, hi := id*cfg.BatchPages, (id+1)*cfg.BatchPages
		b := &Batch{Batch: cb, ID: id, Owners: owners[lo:hi:hi], Words: words[lo:hi:hi]}
		a.batches = append(a.batches, b)
		a.free = append(a.free, b)
	}
	a.sealed = make([]*Batch, 0, cfg.Batches)
	a.timer = time.AfterFunc(time.Hour, a.expire)
	a.timer.Stop()
	for range cfg.Workers {
		a.workers.Add(1)
		go a.worker()
	}
	return a, nil
}

// Config returns the area's configuration.
func (a *Area) Config() Config { return a.cfg }

// Take reserves up to n slots of the open batch, opening one if need be,
// and returns the batch, the index of the first slot and how many it got
// (k <= n, fewer when the batch fills). The caller copies its pages into
// b.Pages at those slots, sets their Owners and Words, and calls Done(b).
// When every buffer is busy Take waits up to Config.Wait for one; it
// returns k == 0 when none came free (or the area is closed): the caller
// compresses its pages itself.
func (a *Area) Take(n int) (b *Batch, first, k int) {
	if n <= 0 {
		return nil, 0, 0
	}
	b, first, k, busy := a.take(n)
	if !busy || a.cfg.Wait <= 0 {
		return b, first, k
	}
	// Polled rather than signalled: a sleep allocates nothing, and a
	// flush takes about a millisecond.
	deadline := time.Now().Add(a.cfg.Wait)
	for busy && time.Now().Before(deadline) {
		time.Sleep(waitStep)
		b, first, k, busy = a.take(n)
	}
	if busy {
		a.refused.Add(1)
	} else if k > 0 {
		a.waited.Add(1)
	}
	return b, first, k
}

// waitStep is how often a waiting Take looks for a free buffer.
const waitStep = 50 * time.Microsecond

// take is Take without waiting; busy says every buffer was.
func (a *Area) take(n int) (b *Batch, first, k int, busy bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed {
		return nil, 0, 0, false
	}
	if a.open == nil {
		last := len(a.free) - 1
		if last < 0 {
			if a.cfg.Wait <= 0 {
				a.refused.Add(1)
			}
			return nil, 0, 0, true
		}
		a.open, a.free[last] = a.free[last], nil
		a.free = a.free[:last]
		a.open.N = 0
	}
	b = a.open
	first = b.N
	k = min(n, a.cfg.BatchPages-first)
	b.N += k
	b.filling.Add(1)
	if first == 0 {
		b.opened = time.Now()
		a.timer.Reset(a.cfg.Deadline)
	}
	if b.N == a.cfg.BatchPages {
		a.sealedFull.Add(1)
		a.sealLocked()
	}
	return b, first, k, false
}

// Done ends a writer's Take of b.
func (a *Area) Done(b *Batch) { b.filling.Add(-1) }

// Page returns page i of batch id, for reading a staged page. It is
// valid until that batch's flush returns.
func (a *Area) Page(id, i int) []byte {
	return a.batches[id].Pages[i*codec.PageSize : (i+1)*codec.PageSize]
}

// sealLocked moves the open batch to the workers. a.mu is held.
func (a *Area) sealLocked() {
	a.sealed = append(a.sealed, a.open)
	a.open = nil
	a.work.Signal()
}

// expire seals the open batch once its first page has waited the
// deadline (the timer may fire for a batch sealed since).
func (a *Area) expire() {
	a.mu.Lock()
	defer a.mu.Unlock()
	b := a.open
	if b == nil || b.N == 0 {
		return
	}
	if wait := a.cfg.Deadline - time.Since(b.opened); wait > 0 {
		a.timer.Reset(wait)
		return
	}
	a.sealedDeadline.Add(1)
	a.sealLocked()
}

func (a *Area) worker() {
	defer a.workers.Done()
	for {
		a.mu.Lock()
		for len(a.sealed) == 0 && !a.closed {
			a.work.Wait()
		}
		if len(a.sealed) == 0 {
			a.mu.Unlock()
			return
		}
		b := a.sealed[0]
		copy(a.sealed, a.sealed[1:])
		a.sealed[len(a.sealed)-1] = nil
		a.sealed = a.sealed[:len(a.sealed)-1]
		a.mu.Unlock()
		waitFilled(b)
		a.flush(b)
		a.mu.Lock()
		b.N = 0
		a.free = append(a.free, b)
		a.mu.Unlock()
	}
}

// waitFilled returns once no writer is copying pages into b: at once in
// the common case, after a few yields when a copy is under way, and
// sleeping when a writer receives its pages from a slow socket.
func waitFilled(b *Batch) {
	for spins := 0; b.filling.Load() != 0; spins++ {
		if spins < 64 {
			runtime.Gosched()
		} else {
			time.Sleep(20 * time.Microsecond)
		}
	}
}

// Stats returns the counters.
func (a *Area) Stats() Stats {
	a.mu.Lock()
	busy := len(a.batches) - len(a.free)
	a.mu.Unlock()
	return Stats{
		Batches: a.cfg.Batches, BatchPages: a.cfg.BatchPages, Busy: busy,
		Refused: a.refused.Load(), Waited: a.waited.Load(), SealedFull: a.sealedFull.Load(), SealedDeadline: a.sealedDeadline.Load(),
	}
}

// Close seals the open batch, waits until every sealed batch is flushed
// and stops the workers. Later Takes get nothing.
func (a *Area) Close() {
	a.mu.Lock()
	if a.closed {
		a.mu.Unlock()
		a.workers.Wait()
		return
	}
	a.closed = true
	if b := a.open; b != nil {
		if b.N > 0 {
			a.sealedDeadline.Add(1)
			a.sealLocked()
		} else {
			a.free = append(a.free, b)
			a.open = nil
		}
	}
	a.work.Broadcast()
	a.mu.Unlock()
	a.timer.Stop()
	a.workers.Wait()
}
