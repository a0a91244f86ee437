//go:build gpu

package gpu

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gzramd/gzramd/internal/testneeds"
	"github.com/gzramd/gzramd/pkg/codec"
	"github.com/gzramd/gzramd/pkg/route"
	"golang.org/x/sys/unix"
)

// routed is a route.Router as a codec.BatchCompressor.
type routed struct{ r *route.Router }

func (routed) Name() string { return "routed" }

func (c routed) CompressBatch(_ context.Context, b *codec.Batch) error {
	c.r.CompressBatch(b)
	return nil
}

// TestBenchReport measures end-to-end throughput (pinned host pages in,
// packed compressed pages in host memory out, several batches in flight)
// and the batch size at which the GPU beats the CPU codec, and writes a
// markdown report to $GZRAMD_BENCH_OUT. It is skipped unless that is set.
func TestBenchReport(t *testing.T) {
	outPath := testneeds.Env(t, "GZRAMD_BENCH_OUT", "measures GPU throughput end to end and writes a markdown report to that file; bench/gpu/run.sh sets it")
	pages := testneeds.Corpus(t)
	total := len(pages) / codec.PageSize
	var rep strings.Builder
	fmt.Fprintf(&rep, "GOMAXPROCS %d, corpus %d pages.\n\n", runtime.GOMAXPROCS(0), total)

	// End to end, GPU compression.
	fmt.Fprintf(&rep, "### End to end: pinned host pages → packed compressed pages in host memory\n\n")
	fmt.Fprintf(&rep, "| path | bays | batch pages | goroutines | GB/s (input) | batches |\n|---|---|---|---|---|---|\n")
	type e2eCase struct {
		bays, batch, workers int
		fallback             bool
		decompress           bool
	}
	cases := []e2eCase{
		{4, 1024, 8, false, false},
		{8, 1024, 16, false, false},
		{8, 512, 16, false, false},
		{16, 1024, 32, false, false},
		{8, 256, 16, false, false},
		{8, 1024, 16, true, false},
		{8, 1024, 16, false, true},
	}
	for _, c := range cases {
		gbs, batches := e2e(t, pages, c.bays, c.batch, c.workers, c.fallback, c.decompress)
		path := "GPU compress (Backend)"
		if c.fallback {
			path = "GPU compress via the router (shadow outputs, watchdog)"
		}
		if c.decompress {
			path = "GPU decompress (DecompressBatch, output GB/s)"
		}
		fmt.Fprintf(&rep, "| %s | %d | %d | %d | %.1f | %d |\n", path, c.bays, c.batch, c.workers, gbs, batches)
	}
	cpuGBs := cpuThroughput(t, pages)
	fmt.Fprintf(&rep, "| CPU LZ4 (codec.CPUBatch, %d workers) | - | 1024 | %d | %.1f | - |\n\n",
		runtime.GOMAXPROCS(0), runtime.GOMAXPROCS(0), cpuGBs)

	// Crossover: single-batch latency, GPU vs CPU on all cores.
	fmt.Fprintf(&rep, "### Crossover: one batch at a time, latency (median of 31)\n\n")
	fmt.Fprintf(&rep, "| batch pages | GPU µs | CPU µs (%d workers) | faster |\n|---|---|---|---|\n", runtime.GOMAXPROCS(0))
	g := openGPU(t, testConfig(t))
	cpu := codec.NewCPUBatch(codec.NewLZ4(), 0)
	crossover := -1
	for _, n := range []int{1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024} {
		b, err := g.NewBatch(n)
		if err != nil {
			t.Fatal(err)
		}
		copy(b.Pages, pages[:n*codec.PageSize])
		b.N = n
		gl := medianLatency(31, func() {
			if err := g.CompressBatch(context.Background(), b); err != nil {
				t.Fatal(err)
			}
		})
		cl := medianLatency(31, func() { cpu.CompressBatch(context.Background(), b) })
		faster := "CPU"
		if gl < cl {
			faster = "GPU"
			if crossover < 0 {
				crossover = n
			}
		} else {
			crossover = -1
		}
		fmt.Fprintf(&rep, "| %d | %.0f | %.0f | %s |\n", n, us(gl), us(cl), faster)
	}
	fmt.Fprintf(&rep, "\nLatency crossover (smallest batch from which the GPU is faster at every larger size): **%d pages**.\n\n", crossover)

	// Staged batches wait for nobody: what decides between the GPU and
	// the CPU is the CPU time a batch costs (route.DefaultMinAcceleratorPages).
	fmt.Fprintf(&rep, "### CPU time per batch, one batch at a time (process CPU, 200 batches)\n\n")
	fmt.Fprintf(&rep, "| batch pages | GPU via the router µs CPU | CPU LZ4 µs CPU (1 goroutine) | cheaper |\n|---|---|---|---|\n")
	r, err := route.New(route.Config{Accelerator: g, Codec: codec.NewLZ4(), Logger: quiet,
		BatchPages: 1024, Workers: 2, MinAcceleratorPages: 1})
	if err != nil {
		t.Fatal(err)
	}
	one := codec.NewCPUBatch(codec.NewLZ4(), 1)
	for _, n := range []int{1, 2, 4, 8, 16, 32, 64, 128, 256, 1024} {
		b, err := g.NewBatch(n)
		if err != nil {
			t.Fatal(err)
		}
		copy(b.Pages, pages[:n*codec.PageSize])
		b.N = n
		gc := cpuPerCall(200, func() { r.CompressBatch(b) })
		cc := cpuPerCall(200, func() { one.CompressBatch(context.Background(), b) })
		cheaper := "CPU"
		if gc < cc {
			cheaper = "GPU"
		}
		fmt.Fprintf(&rep, "| %d | %.1f | %.1f | %s |\n", n, us(gc), us(cc), cheaper)
	}
	fmt.Fprintf(&rep, "\nroute.DefaultMinAcceleratorPages = %d.\n", route.DefaultMinAcceleratorPages)
	if err := os.WriteFile(outPath, []byte(rep.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Log("\n" + rep.String())
}

func us(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }

func medianLatency(runs int, f func()) time.Duration {
	f() // warm up
	ds := make([]time.Duration, runs)
	for i := range ds {
		start := time.Now()
		f()
		ds[i] = time.Since(start)
	}
	slices.Sort(ds)
	return ds[runs/2]
}

// cpuPerCall returns the process CPU time (user+system, every thread: the
// driver's too) per call of f over runs calls.
func cpuPerCall(runs int, f func()) time.Duration {
	cpu := func() time.Duration {
		var ru unix.Rusage
		unix.Getrusage(unix.RUSAGE_SELF, &ru)
		return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	f()
	start := cpu()
	for range runs {
		f()
	}
	return (cpu() - start) / time.Duration(runs)
}

// e2e runs workers goroutines, each cycling through 4 batches of
// pre-loaded pinned pages, for about 2 seconds; it returns GB/s of pages.
func e2e(t *testing.T, pages []byte, bays, batch, workers int, fallback, decompress bool) (float64, int64) {
	c := testConfig(t)
	c.Bays, c.MaxBatchPages = bays, batch
	g, err := open(c, testPTX(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	var comp codec.BatchCompressor = g
	if fallback {
		r, err := route.New(route.Config{Accelerator: g, Codec: codec.NewLZ4(), Logger: quiet,
			BatchPages: batch, Workers: 2 * workers, MinAcceleratorPages: 1})
		if err != nil {
			t.Fatal(err)
		}
		comp = routed{r}
	}
	total := len(pages) / codec.PageSize
	type worker struct{ bs []*codec.Batch }
	ws := make([]worker, workers)
	next := 0
	for w := range ws {
		for range 4 {
			b, err := g.NewBatch(batch)
			if err != nil {
				t.Fatal(err)
			}
			lo := next % (total - batch)
			next += batch
			copy(b.Pages, pages[lo*codec.PageSize:(lo+batch)*codec.PageSize])
			b.N = batch
			if decompress {
				if err := g.CompressBatch(context.Background(), b); err != nil {
					t.Fatal(err)
				}
			}
			ws[w].bs = append(ws[w].bs, b)
		}
	}
	var batches atomic.Int64
	var wg sync.WaitGroup
	stop := time.Now().Add(2 * time.Second)
	start := time.Now()
	for w := range ws {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; time.Now().Before(stop); i++ {
				b := ws[w].bs[i%4]
				var err error
				if decompress {
					err = g.DecompressBatch(context.Background(), b)
				} else {
					err = comp.CompressBatch(context.Background(), b)
				}
				if err != nil {
					t.Error(err)
					return
				}
				batches.Add(1)
			}
		}()
	}
	wg.Wait()
	el := time.Since(start)
	n := batches.Load()
	return float64(n) * float64(batch*codec.PageSize) / el.Seconds() / 1e9, n
}

func cpuThroughput(t *testing.T, pages []byte) float64 {
	cpu := codec.NewCPUBatch(codec.NewLZ4(), 0)
	total := len(pages) / codec.PageSize
	var bs []*codec.Batch
	for i := range 8 {
		b := codec.NewBatch(1024)
		lo := (i * 1024) % (total - 1024)
		copy(b.Pages, pages[lo*codec.PageSize:(lo+1024)*codec.PageSize])
		b.N = 1024
		bs = append(bs, b)
	}
	var done int
	start := time.Now()
	for i := 0; time.Since(start) < 2*time.Second; i++ {
		cpu.CompressBatch(context.Background(), bs[i%len(bs)])
		done += 1024
	}
	return float64(done*codec.PageSize) / time.Since(start).Seconds() / 1e9
}
