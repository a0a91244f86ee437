package route

import (
	"bytes"
	"io"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gzramd/gzramd/internal/batchtest"
	"github.com/gzramd/gzramd/internal/lz4oracle"
	"github.com/gzramd/gzramd/pkg/codec"
	"github.com/gzramd/gzramd/pkg/route/routetest"
)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// verify is batchtest.Verify, which decodes the batch with liblz4 too
// where the oracle is built in, and says so where it is not.
func verify(t testing.TB, b *codec.Batch, want []byte) {
	t.Helper()
	lz4oracle.Check(t, "the batches not also decoded with liblz4")
	batchtest.Verify(t, b, want)
}

func newRouter(t *testing.T, a *routetest.Accelerator, cfg Config) *Router {
	t.Helper()
	cfg.Codec = codec.NewLZ4()
	cfg.Logger = quiet
	if a != nil {
		cfg.Accelerator = a
		if cfg.Workers == 0 {
			cfg.Workers, cfg.BatchPages = 4, 64
		}
	}
	r, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func TestUsesTheAccelerator(t *testing.T) {
	a := routetest.NewAccelerator()
	r := newRouter(t, a, Config{MinAcceleratorPages: 8})
	pages := batchtest.Pages(40, 1)
	b := batchtest.BatchOf(pages)
	batchtest.Poison(b)
	if !r.Stage(40) {
		t.Fatal("a healthy accelerator is not used for staged writes")
	}
	r.CompressBatch(b)
	verify(t, b, pages)
	if s := r.Stats(); s.AcceleratorBatches != 1 || s.AcceleratorPages != 40 || s.CPUBatches != 0 || s.Fallbacks != 0 {
		t.Errorf("stats %+v, want one accelerated batch of 40 pages", s)
	}
}

func TestWithoutAcceleratorEverythingIsCPU(t *testing.T) {
	r := newRouter(t, nil, Config{})
	if r.Stage(1) {
		t.Fatal("a router without an accelerator claims one")
	}
	pages := batchtest.Pages(40, 2)
	b := batchtest.BatchOf(pages)
	r.CompressBatch(b)
	verify(t, b, pages)
	b2 := batchtest.BatchOf(pages[:8*codec.PageSize])
	r.CompressInline(b2)
	verify(t, b2, pages)
	if s := r.Stats(); s.CPUPages != 48 || s.InlinePages != 8 || s.AcceleratorPages != 0 {
		t.Errorf("stats %+v", s)
	}
}

func TestFailureFallsBackThenBacksOffAndRetries(t *testing.T) {
	a := routetest.NewAccelerator()
	r := newRouter(t, a, Config{MinBackoff: 20 * time.Millisecond, MaxBackoff: time.Second, MinAcceleratorPages: 1})
	pages := batchtest.Pages(30, 2)

	a.Failing.Store(true)
	b := batchtest.BatchOf(pages)
	batchtest.Poison(b)
	r.CompressBatch(b)
	verify(t, b, pages)
	if s := r.Stats(); s.Fallbacks != 1 || s.CPUBatches != 1 || s.AcceleratorBatches != 0 {
		t.Fatalf("after a failure: stats %+v", s)
	}
	// Within the backoff the accelerator is not tried, and writes are
	// not staged for it.
	if r.Stage(30) {
		t.Fatal("writes still staged for an accelerator that just failed")
	}
	calls := a.Calls.Load()
	b2 := batchtest.BatchOf(pages)
	r.CompressBatch(b2)
	verify(t, b2, pages)
	if a.Calls.Load() != calls || r.Stats().Skipped != 1 {
		t.Fatalf("accelerator tried during backoff: calls %d→%d, stats %+v", calls, a.Calls.Load(), r.Stats())
	}
	// A second failure doubles the backoff; after it the accelerator is
	// retried and, once healthy, used again.
	time.Sleep(25 * time.Millisecond)
	b3 := batchtest.BatchOf(pages)
	r.CompressBatch(b3)
	verify(t, b3, pages)
	if s := r.Stats(); s.Fallbacks != 2 {
		t.Fatalf("stats %+v, want 2 fallbacks", s)
	}
	a.Failing.Store(false)
	time.Sleep(45 * time.Millisecond)
	if !r.Stage(30) {
		t.Fatal("the backoff did not end")
	}
	b4 := batchtest.BatchOf(pages)
	r.CompressBatch(b4)
	verify(t, b4, pages)
	if s := r.Stats(); s.AcceleratorBatches != 1 {
		t.Fatalf("accelerator not retried after backoff: stats %+v", s)
	}
}

func TestWatchdogQuarantinesLateWrites(t *testing.T) {
	a := routetest.NewAccelerator()
	r := newRouter(t, a, Config{Watchdog: 20 * time.Millisecond, MinBackoff: time.Millisecond, MinAcceleratorPages: 1})
	pages := batchtest.Pages(25, 3)
	a.HangFor.Store(int64(200 * time.Millisecond))
	b := batchtest.BatchOf(pages)
	batchtest.Poison(b)
	start := time.Now()
	r.CompressBatch(b)
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("watchdog did not fire: call took %v", d)
	}
	verify(t, b, pages)
	snapshot := append([]byte(nil), b.Out...)
	lens := append([]uint32(nil), b.Lens...)
	// The hung accelerator now finishes and writes its (shadow) outputs.
	a.HangFor.Store(0)
	for deadline := time.Now().Add(5 * time.Second); a.Returned.Load() < 1; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the released accelerator did not return")
		}
	}
	// Later batches work with the recycled shadows.
	time.Sleep(2 * time.Millisecond) // past the backoff
	for range 6 {
		b2 := batchtest.BatchOf(pages)
		batchtest.Poison(b2)
		r.CompressBatch(b2)
		verify(t, b2, pages)
	}
	time.Sleep(10 * time.Millisecond)
	if !bytes.Equal(snapshot, b.Out) || !slices.Equal(lens, b.Lens) {
		t.Fatal("a late write of the timed-out accelerator reached the caller's batch")
	}
	verify(t, b, pages)
	if s := r.Stats(); s.Timeouts != 1 || s.Fallbacks != 1 || s.AcceleratorBatches != 6 {
		t.Errorf("stats %+v, want one timeout and 6 accelerated batches", s)
	}
}

func TestSmallBatchesGoToCPU(t *testing.T) {
	a := routetest.NewAccelerator()
	r := newRouter(t, a, Config{MinAcceleratorPages: 8})
	pages := batchtest.Pages(7, 4)
	b := batchtest.BatchOf(pages)
	r.CompressBatch(b)
	verify(t, b, pages)
	if s := r.Stats(); s.Small != 1 || a.Calls.Load() != 0 {
		t.Errorf("stats %+v, accelerator calls %d", s, a.Calls.Load())
	}
}

// TestNoShadowGoesToCPU: with every shadow held (a hung accelerator keeps
// its shadows until it returns), batches go to the CPU instead of waiting
// or allocating.
func TestNoShadowGoesToCPU(t *testing.T) {
	a := routetest.NewAccelerator()
	r := newRouter(t, a, Config{Workers: 1, BatchPages: 64, Watchdog: 10 * time.Millisecond, MinBackoff: time.Nanosecond, MinAcceleratorPages: 1})
	pages := batchtest.Pages(10, 6)
	a.HangFor.Store(int64(100 * time.Millisecond))
	b := batchtest.BatchOf(pages)
	r.CompressBatch(b) // times out; the one shadow stays with the hung call
	verify(t, b, pages)
	time.Sleep(time.Millisecond)
	b2 := batchtest.BatchOf(pages)
	r.CompressBatch(b2)
	verify(t, b2, pages)
	if s := r.Stats(); s.NoShadow != 1 {
		t.Fatalf("stats %+v, want one batch without a shadow", s)
	}
	a.HangFor.Store(0)
	// Too large for the shadows: to the CPU.
	big := batchtest.Pages(65, 7)
	b3 := batchtest.BatchOf(big)
	for deadline := time.Now().Add(5 * time.Second); a.Returned.Load() < 1; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the released accelerator did not return")
		}
	}
	r.CompressBatch(b3)
	verify(t, b3, big)
	if s := r.Stats(); s.NoShadow != 2 {
		t.Fatalf("stats %+v, want a second batch without a shadow (too large)", s)
	}
}

// TestConcurrent runs batches from many goroutines while the accelerator
// flips between healthy and failing; under -race it also proves that no
// output memory is shared between the accelerator and the caller.
func TestConcurrent(t *testing.T) {
	a := routetest.NewAccelerator()
	r := newRouter(t, a, Config{MinBackoff: time.Microsecond, MaxBackoff: time.Millisecond, Workers: 16, BatchPages: 20, MinAcceleratorPages: 1})
	workers, rounds := 8, 30
	if testing.Short() {
		rounds = 10
	}
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			pages := batchtest.Pages(20, uint64(w+10))
			b := codec.NewBatch(20)
			for i := range rounds {
				copy(b.Pages, pages)
				b.N = 20
				batchtest.Poison(b)
				a.Failing.Store(i%3 == 0)
				r.CompressBatch(b)
				verify(t, b, pages)
			}
		}()
	}
	wg.Wait()
	s := r.Stats()
	if s.AcceleratorBatches+s.CPUBatches != uint64(workers*rounds) {
		t.Errorf("stats %+v: %d batches accounted, want %d", s, s.AcceleratorBatches+s.CPUBatches, workers*rounds)
	}
}

// TestStageFollowsTheWriteRate: writes are staged while each window sees
// enough pages to fill a batch worth the accelerator, and compress inline
// while fewer come.
func TestStageFollowsTheWriteRate(t *testing.T) {
	a := routetest.NewAccelerator()
	const window = 20 * time.Millisecond
	r := newRouter(t, a, Config{MinAcceleratorPages: 16, Window: window})
	write := func(pages int) bool {
		r.Count(pages)
		return r.Stage(pages)
	}
	if !write(1) {
		t.Fatal("the first write is not staged: staging starts on")
	}
	// A trickle: one page a window.
	for range 3 {
		time.Sleep(window)
		write(1)
	}
	if write(1) {
		t.Fatal("a trickle of single pages is still staged")
	}
	// Asking is not writing: a write declined and asked about again
	// counts once.
	for range 100 {
		r.Stage(1)
	}
	time.Sleep(window)
	if write(1) {
		t.Fatal("questions alone turned staging on")
	}
	if !write(16) {
		t.Fatal("a write of a batch's worth of pages is not staged")
	}
	// A flood: many pages within one window, then the next write decides.
	time.Sleep(window)
	write(1)
	for range 40 {
		write(1)
	}
	time.Sleep(window)
	if !write(1) {
		t.Fatal("a window of 40 pages did not turn staging back on")
	}
}

// lateAccel is an accelerator that becomes ready after the router is
// made (Readier).
type lateAccel struct {
	*routetest.Accelerator
	ready atomic.Bool
}

func (l *lateAccel) Ready() bool { return l.ready.Load() }

// Before a Readier is ready, the router works as with no accelerator:
// writes inline, batches on the CPU, and no failure or back-off; once it
// is ready, staged batches go to it.
func TestAcceleratorReadyLater(t *testing.T) {
	a := &lateAccel{Accelerator: routetest.NewAccelerator()}
	r, err := New(Config{Codec: codec.NewLZ4(), Logger: quiet, Accelerator: a,
		Workers: 4, BatchPages: 64, MinAcceleratorPages: 8})
	if err != nil {
		t.Fatal(err)
	}
	if r.Stage(40) {
		t.Error("writes are staged for an accelerator not ready yet")
	}
	pages := batchtest.Pages(40, 3)
	b := batchtest.BatchOf(pages)
	r.CompressBatch(b)
	verify(t, b, pages)
	if s := r.Stats(); s.CPUBatches != 1 || s.NotReady != 1 || s.Fallbacks != 0 || a.Calls.Load() != 0 {
		t.Errorf("before ready: stats %+v, %d accelerator calls; want one CPU batch, not ready, no fallback", s, a.Calls.Load())
	}
	a.ready.Store(true)
	if !r.Stage(40) {
		t.Error("writes are not staged for the accelerator once ready")
	}
	b = batchtest.BatchOf(pages)
	batchtest.Poison(b)
	r.CompressBatch(b)
	verify(t, b, pages)
	if s := r.Stats(); s.AcceleratorBatches != 1 || s.Fallbacks != 0 {
		t.Errorf("once ready: stats %+v, want one accelerated batch", s)
	}
}

// TestStagedBatchesShareTheSets: batches without outputs of their own (the
// staging area's) take a set as they are compressed and give it back
// with ReleaseOutputs. With Workers+1 sets, the batches of a hung
// accelerator are still redone on the CPU, one set left over between them,
// and every set comes back once it returns.
func TestStagedBatchesShareTheSets(t *testing.T) {
	const workers = 2
	a := routetest.NewAccelerator()
	r := newRouter(t, a, Config{Workers: workers, BatchPages: 64, Watchdog: 20 * time.Millisecond,
		MinBackoff: time.Nanosecond, MaxBackoff: time.Nanosecond, MinAcceleratorPages: 1})
	if got := len(r.sets); got != workers+1 {
		t.Fatalf("%d sets, want %d", got, workers+1)
	}
	staged := func(pages []byte) *codec.Batch {
		return &codec.Batch{Pages: slices.Clone(pages), N: len(pages) / codec.PageSize}
	}
	pages := batchtest.Pages(30, 21)

	b := staged(pages)
	r.CompressBatch(b)
	verify(t, b, pages)
	r.ReleaseOutputs(b)
	if b.Out != nil || len(r.sets) != workers+1 {
		t.Fatalf("after a batch on the accelerator: outputs %v kept, %d sets free", b.Out != nil, len(r.sets))
	}

	// Every batch hangs on the accelerator: each is redone on the CPU
	// with the one set the hung calls leave.
	a.HangFor.Store(int64(300 * time.Millisecond))
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			b := staged(pages)
			r.CompressBatch(b)
			verify(t, b, pages)
			time.Sleep(5 * time.Millisecond) // committing, holding the set
			r.ReleaseOutputs(b)
		})
	}
	wg.Wait()
	if s := r.Stats(); s.Timeouts != workers || s.CPUBatches != workers {
		t.Fatalf("stats %+v, want %d batches timed out and redone on the CPU", s, workers)
	}
	// While the calls hang, the accelerator gets no more batches.
	b = staged(pages)
	r.CompressBatch(b)
	verify(t, b, pages)
	r.ReleaseOutputs(b)
	if s := r.Stats(); s.NoShadow != 1 {
		t.Fatalf("stats %+v, want one batch refused the accelerator while its calls hang", s)
	}
	a.HangFor.Store(0)
	for deadline := time.Now().Add(5 * time.Second); len(r.sets) != workers+1; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d sets free once the accelerator returned, want %d", len(r.sets), workers+1)
		}
	}
}
