//go:build gpu

// Tests that need an NVIDIA GPU: go test -tags gpu,liblz4 ./pkg/gpu/ (or a
// binary built with go test -c -tags gpu,liblz4, run on the GPU machine by
// bench/gpu/run.sh; liblz4 builds in the liblz4 oracle, which needs
// liblz4-dev on the build host only). GZRAMD_CORPUS names the corpus (.zst)
// and GZRAMD_PTX a freshly built lz4.ptx to use instead of the embedded one.

package gpu

import (
	"bytes"
	"context"
	"errors"
	"math/rand/v2"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/gzramd/gzramd/internal/batchtest"
	"github.com/gzramd/gzramd/internal/lz4oracle"
	"github.com/gzramd/gzramd/internal/testneeds"
	"github.com/gzramd/gzramd/kernels"
	"github.com/gzramd/gzramd/pkg/codec"
	"github.com/gzramd/gzramd/pkg/route"
)

func testConfig(t testing.TB) Config {
	return Config{Logger: quiet}
}

// testPTX is $GZRAMD_PTX (an LZ4 kernel variant being measured), or the
// embedded kernels.
func testPTX(t testing.TB) []byte { return ptxFrom(t, "GZRAMD_PTX", kernels.LZ4) }

// ptxFrom is the PTX file the environment variable env names, or embedded.
func ptxFrom(t testing.TB, env string, embedded []byte) []byte {
	t.Helper()
	p := os.Getenv(env)
	if p == "" {
		return embedded
	}
	ptx, err := os.ReadFile(p)
	if err != nil {
		t.Fatalf("%s: %v", env, err)
	}
	return ptx
}

func openGPU(t testing.TB, c Config) *Backend {
	t.Helper()
	return openWrapped(t, c, nil)
}

// openWrapped opens a Backend on the test kernels whose driver calls go
// through wrap (see wrapFaults).
func openWrapped(t testing.TB, c Config, wrap func(cuda) cuda) *Backend {
	t.Helper()
	return openPTX(t, c, testPTX(t), wrap)
}

// openPTX opens a Backend on ptx, closed when the test ends.
func openPTX(t testing.TB, c Config, ptx []byte, wrap func(cuda) cuda) *Backend {
	t.Helper()
	g, err := open(c, ptx, wrap)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() {
		if err := g.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return g
}

// verify is batchtest.Verify, which decodes the batch with liblz4 too
// where the oracle is built in, and says so where it is not.
func verify(t testing.TB, b *codec.Batch, want []byte) {
	t.Helper()
	lz4oracle.Check(t, "the batches not also decoded with liblz4")
	batchtest.Verify(t, b, want)
}

// edgePages returns n pages of the kinds that break compressors.
func edgePages(n int) []byte {
	r := rand.New(rand.NewPCG(42, 7))
	out := make([]byte, n*codec.PageSize)
	for i := range n {
		p := out[i*codec.PageSize : (i+1)*codec.PageSize]
		switch i % 9 {
		case 0: // zeros
		case 1:
			for j := range p {
				p[j] = 0xFF
			}
		case 2, 3:
			for j := range p {
				p[j] = byte(r.Uint32())
			}
		case 4:
			p[r.IntN(len(p))] = byte(1 + r.IntN(255))
		case 5:
			p[len(p)-1] = 1
		case 6:
			for j := range p {
				p[j] = byte(j % (1 + i%13))
			}
		case 7: // random, with a repeat near the end
			for j := range p {
				p[j] = byte(r.Uint32())
			}
			copy(p[len(p)-40:], p[100:140])
		case 8:
			for j := range p {
				p[j] = byte(r.IntN(3))
			}
		}
	}
	return out
}

// roundTrip compresses pages (any count) on the GPU in batches of up to
// the bay size and checks each page both ways: GPU → CPU decoder and GPU
// decoder of the GPU output and of the CPU codec's output. It returns the stored
// bytes (compressed, or a page when raw) of the GPU and of the CPU codec.
func roundTrip(t *testing.T, g *Backend, pages []byte) (gpuStored, cpuStored int) {
	t.Helper()
	ctx := context.Background()
	cpu := codec.NewCPUBatch(codec.NewLZ4(), 0)
	total := len(pages) / codec.PageSize
	per := g.MaxBatchPages()
	b, err := g.NewBatch(per)
	if err != nil {
		t.Fatal(err)
	}
	cb := codec.NewBatch(per)
	for lo := 0; lo < total; lo += per {
		n := min(per, total-lo)
		want := pages[lo*codec.PageSize : (lo+n)*codec.PageSize]
		copy(b.Pages, want)
		b.N = n
		batchtest.Poison(b)
		if err := g.CompressBatch(ctx, b); err != nil {
			t.Fatalf("pages %d..%d: %v", lo, lo+n, err)
		}
		verify(t, b, want)
		for i := range n {
			if l := int(b.Lens[i]); l > 0 {
				gpuStored += l
			} else {
				gpuStored += codec.PageSize
			}
		}
		// GPU decoder on GPU output.
		for i := range b.Pages[:n*codec.PageSize] {
			b.Pages[i] = 0x3C
		}
		if err := g.DecompressBatch(ctx, b); err != nil {
			t.Fatalf("pages %d..%d: GPU decode of GPU output: %v", lo, lo+n, err)
		}
		for i := range n {
			if b.Lens[i] != 0 && !bytes.Equal(b.Page(i), want[i*codec.PageSize:(i+1)*codec.PageSize]) {
				t.Fatalf("page %d: GPU decode of GPU output differs", lo+i)
			}
		}
		// GPU decoder on the CPU codec's output.
		copy(cb.Pages, want)
		cb.N = n
		if err := cpu.CompressBatch(ctx, cb); err != nil {
			t.Fatal(err)
		}
		for i := range n {
			if l := int(cb.Lens[i]); l > 0 {
				cpuStored += l
			} else {
				cpuStored += codec.PageSize
			}
		}
		for i := range cb.Pages[:n*codec.PageSize] {
			cb.Pages[i] = 0xC3
		}
		if err := g.DecompressBatch(ctx, cb); err != nil {
			t.Fatalf("pages %d..%d: GPU decode of CPU LZ4 output: %v", lo, lo+n, err)
		}
		for i := range n {
			if cb.Lens[i] != 0 && !bytes.Equal(cb.Page(i), want[i*codec.PageSize:(i+1)*codec.PageSize]) {
				t.Fatalf("page %d: GPU decode of CPU LZ4 output differs", lo+i)
			}
		}
	}
	return gpuStored, cpuStored
}

func TestGPUDeviceAndTelemetry(t *testing.T) {
	g := openGPU(t, testConfig(t))
	info := g.Info()
	if info.Name == "" || info.Multiprocessors == 0 || info.MemoryBytes == 0 {
		t.Fatalf("device info incomplete: %+v", info)
	}
	if !info.BlockingSync {
		t.Error("the primary context was not made to block while waiting (CU_CTX_SCHED_BLOCKING_SYNC)")
	}
	t.Logf("device: %+v", info)
	m, err := OpenMonitor(info.Index)
	if err != nil {
		t.Fatalf("OpenMonitor: %v", err)
	}
	defer m.Close()
	tel, err := m.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	if tel.Name == "" || tel.MemoryTotalBytes == 0 || tel.MemoryUsedBytes > tel.MemoryTotalBytes {
		t.Fatalf("telemetry implausible: %+v", tel)
	}
	t.Logf("telemetry: %+v", tel)
}

func TestGPURoundTripCorpus(t *testing.T) {
	pages := testneeds.Corpus(t)
	g := openGPU(t, testConfig(t))
	gs, cs := roundTrip(t, g, pages)
	gr := float64(len(pages)) / float64(gs)
	cr := float64(len(pages)) / float64(cs)
	t.Logf("corpus %d pages: GPU ratio %.4f, CPU LZ4 ratio %.4f", len(pages)/codec.PageSize, gr, cr)
	if gr < cr {
		t.Errorf("GPU ratio %.4f below the CPU LZ4 codec's %.4f on the same pages", gr, cr)
	}
}

func TestGPUEdgePages(t *testing.T) {
	g := openGPU(t, testConfig(t))
	for _, n := range []int{1, 3, 5, 31, 1000, 1024} {
		pages := edgePages(n)
		roundTrip(t, g, pages)
	}
	// Zero and 0xFF pages must compress to a few bytes, random ones be raw.
	pages := edgePages(9)
	b, _ := g.NewBatch(9)
	copy(b.Pages, pages)
	b.N = 9
	if err := g.CompressBatch(context.Background(), b); err != nil {
		t.Fatal(err)
	}
	if b.Lens[0] == 0 || b.Lens[0] > 32 || b.Lens[1] == 0 || b.Lens[1] > 32 {
		t.Errorf("zero/0xFF pages compressed to %d/%d bytes", b.Lens[0], b.Lens[1])
	}
	if b.Lens[2] != 0 || b.Lens[3] != 0 {
		t.Errorf("random pages not stored raw: lengths %d, %d", b.Lens[2], b.Lens[3])
	}
}

// TestGPUDecodesLiblz4 decodes liblz4's blocks of generated and edge
// pages on the GPU (the other way, GPU pages through liblz4, is
// verifyBatch's).
func TestGPUDecodesLiblz4(t *testing.T) {
	lz4oracle.Require(t)
	g := openGPU(t, testConfig(t))
	pages := append(batchtest.Pages(700, 21), edgePages(300)...)
	total, per := len(pages)/codec.PageSize, g.MaxBatchPages()
	for lo := 0; lo < total; lo += per {
		n := min(per, total-lo)
		want := pages[lo*codec.PageSize : (lo+n)*codec.PageSize]
		b := batchtest.BatchOf(want)
		compressed := 0
		for i := range n {
			off := i * codec.PageSize
			l := lz4oracle.Compress(b.Out[off:off+codec.PageSize-1], b.Page(i))
			b.Offsets[i], b.Lens[i] = uint32(off), uint32(l)
			if l > 0 {
				compressed++
				for j := range b.Page(i) {
					b.Page(i)[j] = 0x3C
				}
			}
		}
		if compressed == 0 {
			t.Fatalf("pages %d..%d: liblz4 compressed none", lo, lo+n)
		}
		if err := g.DecompressBatch(context.Background(), b); err != nil {
			t.Fatalf("pages %d..%d: GPU decode of liblz4 output: %v", lo, lo+n, err)
		}
		for i := range n {
			if !bytes.Equal(b.Page(i), want[i*codec.PageSize:(i+1)*codec.PageSize]) {
				t.Fatalf("page %d: GPU decode of liblz4 output differs", lo+i)
			}
		}
	}
}

func TestGPUHeapBatches(t *testing.T) {
	// Batches not made by NewBatch (Go heap) work too.
	g := openGPU(t, testConfig(t))
	pages := batchtest.Pages(100, 9)
	b := batchtest.BatchOf(pages)
	batchtest.Poison(b)
	if err := g.CompressBatch(context.Background(), b); err != nil {
		t.Fatal(err)
	}
	verify(t, b, pages)
}

func TestGPUConcurrent(t *testing.T) {
	pages := testneeds.Corpus(t)
	g := openGPU(t, testConfig(t))
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	for w := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			b, err := g.NewBatch(512)
			if err != nil {
				errs <- err
				return
			}
			for r := range 4 {
				lo := ((w*4 + r) * 512) % (len(pages)/codec.PageSize - 512)
				want := pages[lo*codec.PageSize : (lo+512)*codec.PageSize]
				copy(b.Pages, want)
				b.N = 512
				batchtest.Poison(b)
				if err := g.CompressBatch(context.Background(), b); err != nil {
					errs <- err
					return
				}
				verify(t, b, want)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}

func TestGPUDecompressRejectsCorrupt(t *testing.T) {
	g := openGPU(t, testConfig(t))
	pages := batchtest.Pages(64, 11)
	b := batchtest.BatchOf(pages)
	if err := g.CompressBatch(context.Background(), b); err != nil {
		t.Fatal(err)
	}
	for i := range b.N {
		if b.Lens[i] > 1 {
			b.Lens[i]-- // truncate every compressed page
		}
	}
	if err := g.DecompressBatch(context.Background(), b); !errors.Is(err, codec.ErrCorrupt) {
		t.Fatalf("DecompressBatch of truncated pages: %v, want ErrCorrupt", err)
	}
}

// TestGPUFaultInjection fails each step of the GPU path once, mid-run, and
// checks that every batch still comes back complete through the fallback.
func TestGPUFaultInjection(t *testing.T) {
	pages := batchtest.Pages(300, 12)
	for _, p := range []FaultPoint{FaultUpload, FaultKernel, FaultDownload, FaultSync} {
		t.Run(string(p), func(t *testing.T) {
			plan := NewFaultPlan(map[FaultPoint][]int{p: {2}})
			c := testConfig(t)
			c.Bays = 2
			g := openWrapped(t, c, wrapFaults(plan, 0))
			r := newRouter(t, g, route.Config{MinBackoff: time.Millisecond})
			runOneFault(t, g, r, pages, func(b *codec.Batch) { verify(t, b, pages) })
		})
	}
	t.Run("alloc", func(t *testing.T) {
		plan := NewFaultPlan(map[FaultPoint][]int{FaultAlloc: {1}})
		if _, err := open(testConfig(t), testPTX(t), wrapFaults(plan, 0)); !errors.Is(err, ErrUnavailable) || !errors.Is(err, ErrInjected) {
			t.Fatalf("Open with an allocation fault: %v", err)
		}
	})
}

// TestGPUHangQuarantine keeps a bay's stream really busy past the
// watchdog: the batch is redone on the CPU, the bay stays out of use until
// the GPU finishes, and later batches run on the GPU again.
func TestGPUHangQuarantine(t *testing.T) {
	pages := batchtest.Pages(256, 13)
	c := testConfig(t)
	c.Bays = 2
	g := openWrapped(t, c, wrapFaults(NewFaultPlan(map[FaultPoint][]int{FaultHang: {1}}), 400*time.Millisecond))
	r := newRouter(t, g, route.Config{Watchdog: 50 * time.Millisecond, MinBackoff: time.Millisecond})
	b, _ := g.NewBatch(256)
	copy(b.Pages, pages)
	b.N = 256
	batchtest.Poison(b)
	start := time.Now()
	r.CompressBatch(b)
	if d := time.Since(start); d > 300*time.Millisecond {
		t.Errorf("watchdog fired after %v", d)
	}
	verify(t, b, pages)
	snapshot := append([]byte(nil), b.Out...)
	// While the hung bay is quarantined the other one serves batches.
	time.Sleep(2 * time.Millisecond)
	b2, _ := g.NewBatch(256)
	copy(b2.Pages, pages)
	b2.N = 256
	r.CompressBatch(b2)
	verify(t, b2, pages)
	// After the hang, both bays work again and the first batch's results
	// were never overwritten.
	time.Sleep(600 * time.Millisecond)
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			bb, _ := g.NewBatch(256)
			copy(bb.Pages, pages)
			bb.N = 256
			r.CompressBatch(bb)
			verify(t, bb, pages)
		}()
	}
	wg.Wait()
	if !bytes.Equal(snapshot, b.Out) {
		t.Fatal("the hung batch's late output reached the caller's batch")
	}
	s := r.Stats()
	if s.Timeouts != 1 || s.AcceleratorBatches < 5 {
		t.Errorf("stats %+v, want 1 timeout and the GPU used afterwards", s)
	}
}

// runOneFault compresses pages five times through r, checking each batch
// with verify, and expects the one injected fault to have sent exactly one
// batch to the CPU.
func runOneFault(t *testing.T, g *Backend, r *route.Router, pages []byte, verify func(*codec.Batch)) {
	t.Helper()
	n := len(pages) / codec.PageSize
	b, err := g.NewBatch(n)
	if err != nil {
		t.Fatal(err)
	}
	for range 5 {
		copy(b.Pages, pages)
		b.N = n
		batchtest.Poison(b)
		r.CompressBatch(b)
		verify(b)
		time.Sleep(3 * time.Millisecond)
	}
	if s := r.Stats(); s.Fallbacks != 1 || s.AcceleratorBatches != 4 {
		t.Errorf("stats %+v, want 1 fallback and 4 GPU batches", s)
	}
}

// newRouter routes batches of up to 300 pages between g and the CPU, as
// the daemon does.
func newRouter(t *testing.T, g *Backend, c route.Config) *route.Router {
	t.Helper()
	c.Accelerator, c.Codec, c.Logger = g, codec.NewLZ4(), quiet
	c.BatchPages, c.Workers, c.MinAcceleratorPages = 300, 8, 1
	r, err := route.New(c)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// TestGPUOversizeBatch gives the backend batches larger than a bay: they
// are split into bay-sized parts, compressed and decoded concurrently.
func TestGPUOversizeBatch(t *testing.T) {
	c := testConfig(t)
	c.MaxBatchPages = 100
	c.Bays = 3
	g := openGPU(t, c)
	pages := append(batchtest.Pages(300, 14), edgePages(50)...)
	b := batchtest.BatchOf(pages)
	batchtest.Poison(b)
	if err := g.CompressBatch(context.Background(), b); err != nil {
		t.Fatal(err)
	}
	verify(t, b, pages)
	for i := range b.Pages {
		b.Pages[i] = 0x5A
	}
	if err := g.DecompressBatch(context.Background(), b); err != nil {
		t.Fatal(err)
	}
	for i := range b.N {
		want := pages[i*codec.PageSize : (i+1)*codec.PageSize]
		if b.Lens[i] != 0 && !bytes.Equal(b.Page(i), want) {
			t.Fatalf("page %d: GPU decode of an oversize batch differs", i)
		}
	}
	// CPU LZ4 output, one page per PageSize of Out, decoded in parts too.
	cb := batchtest.BatchOf(pages)
	if err := codec.NewCPUBatch(codec.NewLZ4(), 0).CompressBatch(context.Background(), cb); err != nil {
		t.Fatal(err)
	}
	for i := range cb.Pages {
		cb.Pages[i] = 0xA5
	}
	if err := g.DecompressBatch(context.Background(), cb); err != nil {
		t.Fatal(err)
	}
	for i := range cb.N {
		want := pages[i*codec.PageSize : (i+1)*codec.PageSize]
		if cb.Lens[i] != 0 && !bytes.Equal(cb.Page(i), want) {
			t.Fatalf("page %d: GPU decode of CPU LZ4 output in parts differs", i)
		}
	}
}

// TestGPUCloseReleasesWaiters checks that a caller waiting for a bay is
// released by Close instead of blocking forever.
func TestGPUCloseReleasesWaiters(t *testing.T) {
	c := testConfig(t)
	c.Bays = 1
	g, err := open(c, testPTX(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	s, err := g.acquire(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan error, 1)
	go func() {
		_, err := g.acquire(context.Background())
		got <- err
	}()
	closed := make(chan error, 1)
	go func() { closed <- g.Close() }()
	select {
	case err := <-got:
		if !errors.Is(err, errClosed) {
			t.Fatalf("waiter got %v, want errClosed", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("a waiter for a bay was not released by Close")
	}
	g.release(s)
	if err := <-closed; err != nil {
		t.Fatalf("Close: %v", err)
	}
}
