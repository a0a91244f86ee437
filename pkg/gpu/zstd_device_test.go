//go:build gpu

// The zstd kernel on a real GPU: every frame decodes with libzstd, matches
// the host build of the same encoder byte for byte, and what it costs.

package gpu

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gzramd/gzramd/internal/batchtest"
	"github.com/gzramd/gzramd/internal/testneeds"
	"github.com/gzramd/gzramd/internal/zstdpage"
	"github.com/gzramd/gzramd/kernels"
	"github.com/gzramd/gzramd/pkg/codec"
	"github.com/gzramd/gzramd/pkg/route"
)

// zstdPTX is $GZRAMD_ZSTD_PTX (a kernel being measured), or the embedded one.
func zstdPTX(t testing.TB) []byte { return ptxFrom(t, "GZRAMD_ZSTD_PTX", kernels.Zstd) }

func openZstd(t testing.TB, c Config) *Backend {
	t.Helper()
	c.Algorithm = "zstd"
	return openPTX(t, c, zstdPTX(t), nil)
}

// zstdRoundTrip compresses pages on the GPU and checks every page: its
// frame decodes with libzstd (codec.Zstd) to the page. It returns the
// bytes stored (frames, a page when raw).
func zstdRoundTrip(t *testing.T, g *Backend, pages []byte) (stored int) {
	t.Helper()
	dec := zstdCodec(t)
	total := len(pages) / codec.PageSize
	per := g.MaxBatchPages()
	b, err := g.NewBatch(per)
	if err != nil {
		t.Fatal(err)
	}
	for lo := 0; lo < total; lo += per {
		n := min(per, total-lo)
		copy(b.Pages, pages[lo*codec.PageSize:(lo+n)*codec.PageSize])
		b.N = n
		if err := g.CompressBatch(context.Background(), b); err != nil {
			t.Fatalf("pages %d..%d: %v", lo, lo+n, err)
		}
		batchtest.VerifyWith(t, b, pages[lo*codec.PageSize:(lo+n)*codec.PageSize], dec)
		for i := range n {
			if frame := b.Compressed(i); frame != nil {
				stored += len(frame)
			} else {
				stored += codec.PageSize
			}
		}
	}
	return stored
}

func TestGPUZstdEdgePages(t *testing.T) {
	g := openZstd(t, testConfig(t))
	zstdRoundTrip(t, g, edgePages(9*40))
}

// TestGPUZstdCorpus: every page of the corpus, and the ratio beside CPU
// zstd level 1 and the GPU's LZ4, stored the same way (a page when a
// frame would not be smaller).
func TestGPUZstdCorpus(t *testing.T) {
	pages := testneeds.Corpus(t)
	g := openZstd(t, testConfig(t))
	gz := zstdRoundTrip(t, g, pages)
	cpuZstd := storedBy(t, zstdCodec(t), pages)
	hostDst, hostLens := make([]byte, len(pages)), make([]int32, len(pages)/codec.PageSize)
	zstdpage.CompressPages(hostDst, pages, hostLens, zstdpage.Options{})
	host := 0
	for _, l := range hostLens {
		if l > 0 {
			host += int(l)
		} else {
			host += codec.PageSize
		}
	}
	lz := openGPU(t, testConfig(t))
	gl, _ := roundTrip(t, lz, pages)
	n := float64(len(pages))
	t.Logf("corpus %d pages: ratio GPU zstd %.3f, CPU zstd -1 %.3f, GPU LZ4 %.3f; zstd_page.h's own match finder (hash chains) on the host %.3f",
		len(pages)/codec.PageSize, n/float64(gz), n/float64(cpuZstd), n/float64(gl), n/float64(host))
}

func storedBy(t *testing.T, c codec.Codec, pages []byte) (stored int) {
	dst := make([]byte, codec.PageSize-1)
	for i := 0; i < len(pages); i += codec.PageSize {
		if l := c.Compress(dst, pages[i:i+codec.PageSize]); l > 0 {
			stored += l
		} else {
			stored += codec.PageSize
		}
	}
	return stored
}

// TestZstdBenchReport measures the zstd kernel (data on the GPU, median of
// 10 launches over 1024-page batches), end to end (pinned pages in, packed
// frames out, 8 bays, 16 goroutines) and CPU zstd -1 on every core, and
// appends a markdown table to $GZRAMD_BENCH_OUT.
func TestZstdBenchReport(t *testing.T) {
	outPath := testneeds.Env(t, "GZRAMD_BENCH_OUT", "measures the zstd kernel against CPU zstd and appends a markdown table to that file; bench/gpu/zstd.sh sets it")
	pages := testneeds.Corpus(t)
	c := testConfig(t)
	c.Bays, c.MaxBatchPages = 8, 1024
	g := openZstd(t, c)
	kernel := kernelGBs(t, g, pages)
	e2eGBs := zstdEndToEnd(t, g, pages, 16)
	cpuGBs := cpuCodecGBs(t, zstdCodec(t), pages)
	lzKernel := kernelGBs(t, openGPU(t, c), pages)
	f, err := os.OpenFile(outPath, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	fmt.Fprintf(f, "\n### zstd on the GPU (corpus, 1024-page batches)\n\n| path | GB/s (input) |\n|---|---|\n")
	fmt.Fprintf(f, "| zstd kernel, data on the GPU (median of 10) | %.1f |\n", kernel)
	fmt.Fprintf(f, "| zstd end to end: pinned pages → packed frames (8 bays, 16 goroutines) | %.1f |\n", e2eGBs)
	fmt.Fprintf(f, "| CPU zstd -1, %d goroutines | %.2f |\n", runtime.GOMAXPROCS(0), cpuGBs)
	fmt.Fprintf(f, "| LZ4 kernel, data on the GPU (median of 10) | %.1f |\n", lzKernel)
	t.Logf("zstd kernel %.1f GB/s, end to end %.1f GB/s, CPU zstd -1 %.2f GB/s; LZ4 kernel %.1f GB/s", kernel, e2eGBs, cpuGBs, lzKernel)
}

// kernelGBs times the compression kernel alone on a batch already on the
// device: launch, wait, 10 times; the median.
func kernelGBs(t *testing.T, g *Backend, pages []byte) float64 {
	t.Helper()
	s, err := g.acquire(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer g.release(s)
	n := g.cfg.MaxBatchPages
	dr := g.dr
	if err := dr.htod(s.dPages, pages[:n*codec.PageSize], s.stream); err != nil {
		t.Fatal(err)
	}
	var times []time.Duration
	for range 11 {
		if err := dr.memset32(s.dMeta, 0, 1, s.stream); err != nil {
			t.Fatal(err)
		}
		if err := dr.streamSync(s.stream); err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		if err := g.launch(s, n); err != nil {
			t.Fatal(err)
		}
		if err := dr.streamSync(s.stream); err != nil {
			t.Fatal(err)
		}
		times = append(times, time.Since(start))
	}
	slices.Sort(times[1:]) // the first run loads the module's code
	return float64(n*codec.PageSize) / times[1+len(times[1:])/2].Seconds() / 1e9
}

func zstdEndToEnd(t *testing.T, g *Backend, pages []byte, workers int) float64 {
	t.Helper()
	total, batch := len(pages)/codec.PageSize, g.cfg.MaxBatchPages
	var bytesDone atomic.Int64
	var wg sync.WaitGroup
	stop := time.Now().Add(2 * time.Second)
	start := time.Now()
	for w := range workers {
		b, err := g.NewBatch(batch)
		if err != nil {
			t.Fatal(err)
		}
		lo := (w * batch) % (total - batch)
		copy(b.Pages, pages[lo*codec.PageSize:(lo+batch)*codec.PageSize])
		b.N = batch
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Now().Before(stop) {
				if err := g.CompressBatch(context.Background(), b); err != nil {
					t.Error(err)
					return
				}
				bytesDone.Add(int64(batch * codec.PageSize))
			}
		}()
	}
	wg.Wait()
	return float64(bytesDone.Load()) / time.Since(start).Seconds() / 1e9
}

func cpuCodecGBs(t *testing.T, c codec.Codec, pages []byte) float64 {
	t.Helper()
	cpu := codec.NewCPUBatch(c, 0)
	b := codec.NewBatch(1024)
	copy(b.Pages, pages[:1024*codec.PageSize])
	b.N = 1024
	start, n := time.Now(), 0
	for time.Since(start) < 2*time.Second {
		if err := cpu.CompressBatch(context.Background(), b); err != nil {
			t.Fatal(err)
		}
		n++
	}
	return float64(n*1024*codec.PageSize) / time.Since(start).Seconds() / 1e9
}

// TestGPUZstdFaultInjection fails each step of a zstd batch once, mid-run:
// the router redoes that batch with CPU zstd, and every page of every
// batch decodes with libzstd.
func TestGPUZstdFaultInjection(t *testing.T) {
	pages := batchtest.Pages(300, 14)
	dec := zstdCodec(t)
	for _, p := range []FaultPoint{FaultUpload, FaultKernel, FaultDownload, FaultSync} {
		t.Run(string(p), func(t *testing.T) {
			c := testConfig(t)
			c.Bays, c.Algorithm = 2, "zstd"
			g := openPTX(t, c, zstdPTX(t), wrapFaults(NewFaultPlan(map[FaultPoint][]int{p: {2}}), 0))
			r, err := route.New(route.Config{Accelerator: g, Codec: dec, Logger: quiet, MinBackoff: time.Millisecond,
				BatchPages: 300, Workers: 8, MinAcceleratorPages: 1})
			if err != nil {
				t.Fatal(err)
			}
			runOneFault(t, g, r, pages, func(b *codec.Batch) { batchtest.VerifyWith(t, b, pages, dec) })
		})
	}
}

// zstdCodec is the CPU zstd codec, the decoder of the GPU's frames.
func zstdCodec(t testing.TB) *codec.Zstd {
	t.Helper()
	z, err := codec.NewZstd(1)
	if err != nil {
		t.Fatal(err)
	}
	return z
}
