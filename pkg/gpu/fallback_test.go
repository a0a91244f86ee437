package gpu

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gzramd/gzramd/pkg/codec"
)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// testPages returns n pages mixing text-like, zero, patterned and random
// content.
func testPages(n int, seed uint64) []byte {
	r := rand.New(rand.NewPCG(seed, 1))
	words := []string{"page ", "swap ", "kernel ", "memory ", "gzramd ", "compress ", "0x7f3a ", "{\"id\": ", "null, "}
	out := make([]byte, 0, n*codec.PageSize)
	for i := range n {
		p := make([]byte, codec.PageSize)
		switch i % 5 {
		case 0:
			for j := 0; j < len(p); {
				j += copy(p[j:], words[r.IntN(len(words))])
			}
		case 1: // zeros
		case 2:
			for j := range p {
				p[j] = byte(j % 48)
			}
		case 3:
			for j := range p {
				p[j] = byte(r.Uint32())
			}
		case 4:
			p[r.IntN(len(p))] = byte(1 + r.IntN(255))
		}
		out = append(out, p...)
	}
	return out
}

// verifyBatch checks that every page of b decodes (or is raw) to want.
func verifyBatch(t *testing.T, b *codec.Batch, want []byte) {
	t.Helper()
	dec := codec.NewLZ4()
	page := make([]byte, codec.PageSize)
	for i := range b.N {
		orig := want[i*codec.PageSize : (i+1)*codec.PageSize]
		c := b.Compressed(i)
		if c == nil {
			if !bytes.Equal(b.Page(i), orig) {
				t.Fatalf("page %d: raw page differs from the original", i)
			}
			continue
		}
		if len(c) >= codec.PageSize {
			t.Fatalf("page %d: compressed length %d not below a page", i, len(c))
		}
		if err := dec.Decompress(page, c); err != nil {
			t.Fatalf("page %d: %v", i, err)
		}
		if !bytes.Equal(page, orig) {
			t.Fatalf("page %d: round trip differs", i)
		}
	}
}

func poison(b *codec.Batch) {
	for i := range b.Out {
		b.Out[i] = 0xA5
	}
	for i := range b.Lens {
		b.Lens[i], b.Offsets[i] = 0xEEEEEEEE, 0xEEEEEEEE
	}
}

// fakePrimary stands in for the GPU in CI. It compresses with the CPU codec
// (so results are real), and can fail or hang; a hung call, once released,
// scribbles over the outputs it was given, as a late GPU would.
type fakePrimary struct {
	cpu     *codec.CPUBatch
	failing atomic.Bool
	hang    atomic.Bool
	release chan struct{}
	calls   atomic.Int64
	done    atomic.Int64 // calls returned
}

func newFake() *fakePrimary {
	return &fakePrimary{cpu: codec.NewCPUBatch(codec.NewLZ4(), 1), release: make(chan struct{})}
}

func (*fakePrimary) Name() string { return "fake" }

func (f *fakePrimary) CompressBatch(ctx context.Context, b *codec.Batch) error {
	f.calls.Add(1)
	defer f.done.Add(1)
	scribble := func() {
		for i := range b.Out {
			b.Out[i] = 0xFF
		}
		for i := range b.Lens {
			b.Lens[i], b.Offsets[i] = 7, 9
		}
	}
	if f.hang.Load() {
		<-f.release // ignores ctx, like a driver call that does not return
		scribble()
		return errors.New("fake: late")
	}
	if f.failing.Load() {
		scribble()
		return errors.New("fake: device error")
	}
	return f.cpu.CompressBatch(ctx, b)
}

func newBatchWith(pages []byte) *codec.Batch {
	n := len(pages) / codec.PageSize
	b := codec.NewBatch(n)
	copy(b.Pages, pages)
	b.N = n
	return b
}

func TestFallbackUsesPrimary(t *testing.T) {
	fake := newFake()
	f := WithFallback(fake, codec.NewCPUBatch(codec.NewLZ4(), 1), FallbackOptions{Logger: quiet})
	pages := testPages(40, 1)
	b := newBatchWith(pages)
	poison(b)
	if err := f.CompressBatch(context.Background(), b); err != nil {
		t.Fatal(err)
	}
	verifyBatch(t, b, pages)
	if s := f.Stats(); s.Primary != 1 || s.CPU != 0 || s.Fallbacks != 0 {
		t.Errorf("stats %+v, want one primary batch", s)
	}
	if f.Name() != "fake" {
		t.Errorf("Name = %q", f.Name())
	}
}

func TestFallbackOnErrorThenBackoffAndRetry(t *testing.T) {
	fake := newFake()
	f := WithFallback(fake, codec.NewCPUBatch(codec.NewLZ4(), 1), FallbackOptions{
		Logger: quiet, MinBackoff: 20 * time.Millisecond, MaxBackoff: time.Second,
	})
	pages := testPages(30, 2)
	ctx := context.Background()

	fake.failing.Store(true)
	b := newBatchWith(pages)
	poison(b)
	if err := f.CompressBatch(ctx, b); err != nil {
		t.Fatalf("failure of the primary reached the caller: %v", err)
	}
	verifyBatch(t, b, pages)
	if s := f.Stats(); s.Fallbacks != 1 || s.CPU != 1 || s.Primary != 0 {
		t.Fatalf("after a failure: stats %+v", s)
	}

	// Within the backoff the primary is not tried.
	calls := fake.calls.Load()
	b2 := newBatchWith(pages)
	if err := f.CompressBatch(ctx, b2); err != nil {
		t.Fatal(err)
	}
	verifyBatch(t, b2, pages)
	if fake.calls.Load() != calls || f.Stats().Skipped != 1 {
		t.Fatalf("primary tried during backoff: calls %d→%d, stats %+v", calls, fake.calls.Load(), f.Stats())
	}

	// A second failure doubles the backoff; after it the primary is
	// retried and, once healthy, used again.
	time.Sleep(25 * time.Millisecond)
	b3 := newBatchWith(pages)
	if err := f.CompressBatch(ctx, b3); err != nil {
		t.Fatal(err)
	}
	verifyBatch(t, b3, pages)
	if s := f.Stats(); s.Fallbacks != 2 {
		t.Fatalf("stats %+v, want 2 fallbacks", s)
	}
	fake.failing.Store(false)
	time.Sleep(45 * time.Millisecond)
	b4 := newBatchWith(pages)
	if err := f.CompressBatch(ctx, b4); err != nil {
		t.Fatal(err)
	}
	verifyBatch(t, b4, pages)
	if s := f.Stats(); s.Primary != 1 {
		t.Fatalf("primary not retried after backoff: stats %+v", s)
	}
}

func TestFallbackWatchdogQuarantinesLateWrites(t *testing.T) {
	fake := newFake()
	f := WithFallback(fake, codec.NewCPUBatch(codec.NewLZ4(), 1), FallbackOptions{
		Logger: quiet, Timeout: 20 * time.Millisecond, MinBackoff: time.Millisecond,
	})
	pages := testPages(25, 3)
	fake.hang.Store(true)
	b := newBatchWith(pages)
	poison(b)
	start := time.Now()
	if err := f.CompressBatch(context.Background(), b); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("watchdog did not fire: call took %v", d)
	}
	verifyBatch(t, b, pages)
	snapshot := append([]byte(nil), b.Out...)
	lens := append([]uint32(nil), b.Lens...)
	// The hung primary now finishes and writes its (private) outputs.
	fake.hang.Store(false)
	close(fake.release)
	for deadline := time.Now().Add(5 * time.Second); fake.done.Load() < 1; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the released primary did not return")
		}
	}
	// A later batch works with the recycled outputs.
	b2 := newBatchWith(pages)
	poison(b2)
	time.Sleep(2 * time.Millisecond) // past the backoff
	if err := f.CompressBatch(context.Background(), b2); err != nil {
		t.Fatal(err)
	}
	verifyBatch(t, b2, pages)
	time.Sleep(10 * time.Millisecond)
	if !bytes.Equal(snapshot, b.Out) || !slices.Equal(lens, b.Lens) {
		t.Fatal("a late write of the timed-out primary reached the caller's batch")
	}
	verifyBatch(t, b, pages)
	if s := f.Stats(); s.Timeouts != 1 || s.Fallbacks != 1 {
		t.Errorf("stats %+v, want one timeout", s)
	}
}

func TestFallbackSmallBatchesGoToCPU(t *testing.T) {
	fake := newFake()
	f := WithFallback(fake, codec.NewCPUBatch(codec.NewLZ4(), 1), FallbackOptions{Logger: quiet, MinPages: 8})
	pages := testPages(7, 4)
	b := newBatchWith(pages)
	if err := f.CompressBatch(context.Background(), b); err != nil {
		t.Fatal(err)
	}
	verifyBatch(t, b, pages)
	if s := f.Stats(); s.Small != 1 || fake.calls.Load() != 0 {
		t.Errorf("stats %+v, primary calls %d", s, fake.calls.Load())
	}
}

// TestFallbackConcurrent runs batches from many goroutines while the fake
// primary flips between healthy and failing; under -race it also proves
// that no output memory is shared between the primary and the caller.
func TestFallbackConcurrent(t *testing.T) {
	fake := newFake()
	f := WithFallback(fake, codec.NewCPUBatch(codec.NewLZ4(), 2), FallbackOptions{
		Logger: quiet, MinBackoff: time.Microsecond, MaxBackoff: time.Millisecond,
	})
	workers, rounds := 8, 30
	if testing.Short() {
		rounds = 10
	}
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			pages := testPages(20, uint64(w+10))
			b := codec.NewBatch(20)
			for r := range rounds {
				copy(b.Pages, pages)
				b.N = 20
				poison(b)
				fake.failing.Store(r%3 == 0)
				if err := f.CompressBatch(context.Background(), b); err != nil {
					errs <- err
					return
				}
				verifyBatch(t, b, pages)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	s := f.Stats()
	if s.Primary+s.CPU != uint64(workers*rounds) {
		t.Errorf("stats %+v: %d batches accounted, want %d", s, s.Primary+s.CPU, workers*rounds)
	}
}

func TestOpenReportsUnavailable(t *testing.T) {
	g, err := Open(Config{Device: 1 << 20, Logger: quiet})
	if err == nil {
		g.Close()
		t.Fatal("Open succeeded for a device index that cannot exist")
	}
	if !errors.Is(err, ErrUnavailable) {
		t.Fatalf("Open error %v does not wrap ErrUnavailable", err)
	}
	g, err = Open(Config{Logger: quiet})
	if err == nil {
		g.Close()
		t.Skip("a GPU is present; the no-GPU path is covered where there is none")
	}
	if !errors.Is(err, ErrUnavailable) {
		t.Fatalf("Open error %v does not wrap ErrUnavailable", err)
	}
	t.Logf("Open without a GPU: %v", err)
}

func TestOpenRejectsBadConfig(t *testing.T) {
	for _, c := range []Config{{Device: -1}, {Slots: -1}, {MaxBatchPages: 1 << 20}} {
		c.Logger = quiet
		if _, err := Open(c); err == nil || !errors.Is(err, ErrUnavailable) {
			t.Errorf("Open(%+v) = %v, want an ErrUnavailable error", c, err)
		}
	}
}

func TestAutoWithoutGPUUsesCPU(t *testing.T) {
	cpu := codec.NewCPUBatch(codec.NewLZ4(), 1)
	c, closeFn, err := Auto(Config{Device: 1 << 20}, cpu, FallbackOptions{Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	defer closeFn()
	if c != codec.BatchCompressor(cpu) {
		t.Fatalf("Auto without a usable GPU returned %s, want the CPU compressor", c.Name())
	}
	pages := testPages(10, 5)
	b := newBatchWith(pages)
	if err := c.CompressBatch(context.Background(), b); err != nil {
		t.Fatal(err)
	}
	verifyBatch(t, b, pages)
}

func TestMonitorUnavailable(t *testing.T) {
	m, err := OpenMonitor(1 << 20)
	if err == nil {
		m.Close()
		t.Fatal("OpenMonitor succeeded for a device index that cannot exist")
	}
	if !errors.Is(err, ErrUnavailable) {
		t.Fatalf("OpenMonitor error %v does not wrap ErrUnavailable", err)
	}
}

func TestFaultPlan(t *testing.T) {
	p := NewFaultPlan(map[FaultPoint][]int{FaultUpload: {2, 4}})
	var got []bool
	for range 5 {
		got = append(got, p.Fault(FaultUpload) != nil)
	}
	want := []bool{false, true, false, true, false}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("fault pattern %v, want %v", got, want)
		}
	}
	if p.Fault(FaultKernel) != nil || p.Count(FaultUpload) != 5 || p.Count(FaultKernel) != 1 {
		t.Fatal("FaultPlan counts wrong")
	}
}
