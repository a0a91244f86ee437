package stage

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gzramd/gzramd/pkg/codec"
)

// recorder is a flush function that records the batches it sees.
type recorder struct {
	mu      sync.Mutex
	batches []int // pages of each flushed batch
	pages   map[uint32]bool
	block   chan struct{} // when not nil, flushes wait on it
	entered chan struct{}
}

func newRecorder() *recorder { return &recorder{pages: map[uint32]bool{}} }

func (r *recorder) flush(b *Batch) {
	if r.entered != nil {
		r.entered <- struct{}{}
	}
	if r.block != nil {
		<-r.block
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.batches = append(r.batches, b.N)
	for i := range b.N {
		if r.pages[b.Owners[i]] {
			panic("page flushed twice")
		}
		r.pages[b.Owners[i]] = true
		if b.Words[i] != uint64(b.Owners[i])*3 || b.Page(i)[0] != byte(b.Owners[i]) {
			panic("a staged page's data or words changed")
		}
	}
}

func (r *recorder) flushed() (batches, pages int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, n := range r.batches {
		pages += n
	}
	return len(r.batches), pages
}

func newPages(pages int) ([]byte, error) { return make([]byte, pages*codec.PageSize), nil }

func newArea(t *testing.T, cfg Config, r *recorder) *Area {
	t.Helper()
	a, err := New(cfg, newPages, r.flush)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(a.Close)
	return a
}

// stage takes up to n slots and fills them with pages next, next+1, ...
func stage(a *Area, n int, next *atomic.Uint32) int {
	b, first, k := a.Take(n)
	for i := first; i < first+k; i++ {
		o := next.Add(1)
		b.Owners[i], b.Words[i] = o, uint64(o)*3
		b.Page(i)[0] = byte(o)
	}
	if k > 0 {
		a.Done(b)
	}
	return k
}

func waitFlushed(t *testing.T, r *recorder, pages int) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(100 * time.Microsecond) {
		if _, p := r.flushed(); p >= pages {
			return
		}
		if time.Now().After(deadline) {
			_, p := r.flushed()
			t.Fatalf("%d of %d pages flushed", p, pages)
		}
	}
}

func TestFullBatchesAreSealedAtOnce(t *testing.T) {
	r := newRecorder()
	a := newArea(t, Config{Batches: 4, BatchPages: 8, Deadline: time.Hour, Workers: 2}, r)
	var next atomic.Uint32
	for staged := 0; staged < 24; {
		staged += stage(a, 5, &next) // takes split at batch ends
	}
	waitFlushed(t, r, 24)
	if n, _ := r.flushed(); n != 3 {
		t.Fatalf("%d batches for 24 pages of 8-page batches", n)
	}
	if s := a.Stats(); s.SealedFull != 3 || s.SealedDeadline != 0 {
		t.Fatalf("stats %+v", s)
	}
}

func TestDeadlineSealsAPartialBatch(t *testing.T) {
	r := newRecorder()
	a := newArea(t, Config{Batches: 2, BatchPages: 64, Deadline: 5 * time.Millisecond, Workers: 1}, r)
	var next atomic.Uint32
	start := time.Now()
	if k := stage(a, 3, &next); k != 3 {
		t.Fatalf("took %d of 3", k)
	}
	waitFlushed(t, r, 3)
	if d := time.Since(start); d < 5*time.Millisecond {
		t.Fatalf("sealed after %v, before the deadline", d)
	}
	if s := a.Stats(); s.SealedDeadline != 1 || s.Busy != 0 {
		t.Fatalf("stats %+v", s)
	}
}

// TestWorkerWaitsForWriters: a batch sealed while a writer still copies
// into it is flushed only once the writer is done.
func TestWorkerWaitsForWriters(t *testing.T) {
	r := newRecorder()
	a := newArea(t, Config{Batches: 2, BatchPages: 4, Deadline: time.Hour, Workers: 1}, r)
	b, first, k := a.Take(4) // fills the batch: sealed at once
	if k != 4 || first != 0 {
		t.Fatalf("Take(4) of an empty area: first %d, k %d", first, k)
	}
	time.Sleep(5 * time.Millisecond)
	if n, _ := r.flushed(); n != 0 {
		t.Fatal("a batch was flushed while its writer was still filling it")
	}
	for i := range 4 {
		b.Owners[i], b.Words[i] = uint32(100+i), uint64(100+i)*3
		b.Page(i)[0] = byte(100 + i)
	}
	a.Done(b)
	waitFlushed(t, r, 4)
}

// TestFullAreaRefuses: with every buffer busy, Take gives nothing (the
// writer compresses inline) and counts it.
func TestFullAreaRefuses(t *testing.T) {
	r := newRecorder()
	r.block = make(chan struct{})
	r.entered = make(chan struct{}, 8)
	a := newArea(t, Config{Batches: 2, BatchPages: 4, Deadline: time.Hour, Workers: 2}, r)
	var next atomic.Uint32
	for range 2 {
		if k := stage(a, 4, &next); k != 4 {
			t.Fatalf("took %d of 4", k)
		}
		<-r.entered
	}
	if k := stage(a, 1, &next); k != 0 {
		t.Fatalf("a full area gave %d slots", k)
	}
	if s := a.Stats(); s.Refused != 1 || s.Busy != 2 {
		t.Fatalf("stats %+v", s)
	}
	close(r.block)
	waitFlushed(t, r, 8)
	if k := stage(a, 1, &next); k != 1 {
		t.Fatal("buffers not reused after their flush")
	}
}

// TestFullAreaWaits: with Config.Wait, a Take that finds every buffer
// busy gets one that comes free within the wait, and gives up (counted
// as refused) when none does.
func TestFullAreaWaits(t *testing.T) {
	r := newRecorder()
	r.block = make(chan struct{})
	r.entered = make(chan struct{}, 8)
	// A wait long beside the 5 ms after which a buffer comes free below:
	// with 20 ms, a loaded 2-core machine let the wait end first.
	const wait = 200 * time.Millisecond
	a := newArea(t, Config{Batches: 2, BatchPages: 4, Deadline: time.Hour, Workers: 2, Wait: wait}, r)
	var next atomic.Uint32
	for range 2 {
		if k := stage(a, 4, &next); k != 4 {
			t.Fatalf("took %d of 4", k)
		}
		<-r.entered
	}
	start := time.Now()
	if k := stage(a, 1, &next); k != 0 {
		t.Fatalf("a full area gave %d slots", k)
	}
	if d := time.Since(start); d < wait {
		t.Fatalf("gave up after %v, before its wait", d)
	}
	if s := a.Stats(); s.Refused != 1 || s.Waited != 0 {
		t.Fatalf("stats %+v, want 1 refused", s)
	}
	go func() {
		time.Sleep(5 * time.Millisecond)
		close(r.block)
	}()
	if k := stage(a, 1, &next); k != 1 {
		t.Fatalf("a Take waiting while a buffer came free got %d slots", k)
	}
	if s := a.Stats(); s.Refused != 1 || s.Waited != 1 {
		t.Fatalf("stats %+v, want 1 refused and 1 waited", s)
	}
}

// TestCloseFlushesEverything: Close seals the open batch and returns once
// every staged page is flushed; later Takes get nothing.
func TestCloseFlushesEverything(t *testing.T) {
	r := newRecorder()
	a, err := New(Config{Batches: 4, BatchPages: 16, Deadline: time.Hour, Workers: 2}, newPages, r.flush)
	if err != nil {
		t.Fatal(err)
	}
	var next atomic.Uint32
	staged := 0
	for range 5 {
		staged += stage(a, 7, &next)
	}
	a.Close()
	if _, p := r.flushed(); p != staged {
		t.Fatalf("Close returned with %d of %d pages flushed", p, staged)
	}
	if k := stage(a, 1, &next); k != 0 {
		t.Fatal("Take after Close gave slots")
	}
	a.Close() // twice is fine
}

// TestConcurrentWriters stages from many goroutines (run with -race):
// every page is flushed exactly once, with its data and words.
func TestConcurrentWriters(t *testing.T) {
	r := newRecorder()
	a := newArea(t, Config{Batches: 6, BatchPages: 16, Deadline: 200 * time.Microsecond, Workers: 3}, r)
	var next atomic.Uint32
	var staged atomic.Int64
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 300 {
				staged.Add(int64(stage(a, 1+(w+i)%9, &next)))
			}
		}()
	}
	wg.Wait()
	waitFlushed(t, r, int(staged.Load()))
	if _, p := r.flushed(); int64(p) != staged.Load() {
		t.Fatalf("%d pages flushed for %d staged", p, staged.Load())
	}
}

func TestBadConfig(t *testing.T) {
	alloc := newPages
	for _, c := range []Config{
		{Batches: 1, BatchPages: 4, Deadline: time.Millisecond, Workers: 1},
		{Batches: 4, BatchPages: 0, Deadline: time.Millisecond, Workers: 1},
		{Batches: 4, BatchPages: 4, Deadline: 0, Workers: 1},
		{Batches: 4, BatchPages: 4, Deadline: time.Millisecond, Workers: 1, Wait: -time.Millisecond},
		{Batches: 4, BatchPages: 4, Deadline: time.Millisecond, Workers: 5},
	} {
		if a, err := New(c, alloc, func(*Batch) {}); err == nil {
			a.Close()
			t.Errorf("New(%+v) accepted", c)
		}
	}
	small := func(int) ([]byte, error) { return make([]byte, 2*codec.PageSize), nil }
	if a, err := New(Config{Batches: 2, BatchPages: 4, Deadline: time.Millisecond, Workers: 1}, small, func(*Batch) {}); err == nil {
		a.Close()
		t.Error("New accepted batches smaller than BatchPages")
	}
}
