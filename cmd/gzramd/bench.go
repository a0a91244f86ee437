// `gzramd bench`: the codecs and the data path measured on a corpus of memory pages.

package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/sys/unix"

	"github.com/gzramd/gzramd/internal/corpus"
	"github.com/gzramd/gzramd/pkg/codec"
	"github.com/gzramd/gzramd/pkg/device"
	"github.com/gzramd/gzramd/pkg/gpu"
	"github.com/gzramd/gzramd/pkg/pipeline"
	"github.com/gzramd/gzramd/pkg/route"

	"github.com/gzramd/gzramd/pkg/serving"
)

type benchConfig struct {
	corpus      string
	generated   bool
	pages       int
	minTime     time.Duration
	batchPages  int
	inFlight    int
	backends    []string
	device      bool
	writers     int
	reqPages    int
	gpuDevice   int
	devBackend  string
	devAlg      string
	stagingWait time.Duration
}

func newBenchCmd() *cobra.Command {
	cfg := benchConfig{}
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "Measure the compression backends and the device on a corpus of memory pages",
		Long: `Measure each compression backend on a corpus of 4 KiB memory pages: compression
and decompression speed (GB/s, 10^9 bytes per second of uncompressed data),
compression ratio (uncompressed / compressed bytes, pages that do not shrink
counted whole) and CPU time per GB compressed (user+system seconds of the
whole process, so the GPU's driver threads count too).

Then write the whole corpus through a real device (page table, batcher, slab
store) from concurrent writers and report the ingest speed and the effective
ratio zram users know: orig_data_size / mem_used_total.

The corpus is --corpus FILE (raw pages, or .zst), else the shared corpus
(../shared/corpus/memory-pages.bin.zst, or $GZRAMD_CORPUS) when present,
else generated pages. A progress bar goes to stderr when it is a terminal.`,
		Example: `  gzramd bench
  gzramd bench --corpus /tmp/pages.bin --min-time 5s
  gzramd bench --generated --pages 65536 --backends cpu-lz4,gpu`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := bindEnv(cmd.Flags()); err != nil {
				return usageErr(err)
			}
			if err := cfg.validate(); err != nil {
				return usageErr(err)
			}
			return runBench(cmd.Context(), &cfg, cmd.OutOrStdout(), os.Stderr)
		},
	}
	f := cmd.Flags()
	f.StringVar(&cfg.corpus, "corpus", "", "file of 4 KiB pages (raw or .zst); default: the shared corpus when present, else generated pages")
	f.BoolVar(&cfg.generated, "generated", false, "use generated pages even when a corpus is present")
	f.IntVar(&cfg.pages, "pages", 0, "use at most this many pages (generated: how many; default 16384)")
	f.DurationVar(&cfg.minTime, "min-time", time.Second, "run each measurement at least this long, repeating the corpus")
	f.IntVar(&cfg.batchPages, "batch-pages", 256, "pages per batch")
	f.IntVar(&cfg.inFlight, "batch-inflight", 4, "batches compressing at once")
	f.StringSliceVar(&cfg.backends, "backends", []string{"cpu-lz4", "cpu-zstd", "gpu", "gpu-zstd"}, "backends to measure: cpu-lz4, cpu-zstd, gpu (LZ4), gpu-zstd")
	f.BoolVar(&cfg.device, "device", true, "also measure ingest through a real device")
	f.IntVar(&cfg.writers, "writers", 8, "concurrent writers for the device ingest")
	f.IntVar(&cfg.reqPages, "request-pages", 32, "pages per device write (32 = 128 KiB, the kernel's usual swap-out size)")
	f.IntVar(&cfg.gpuDevice, "gpu-device", 0, "CUDA device index")
	f.StringVar(&cfg.devBackend, "device-backend", "auto", "backend of the device ingest: auto (the GPU when usable), gpu or cpu")
	f.StringVar(&cfg.devAlg, "device-algorithm", "lz4", "algorithm of the device ingest: lz4 or zstd")
	f.DurationVar(&cfg.stagingWait, "staging-wait", 0, "device ingest: serve's --staging-wait (0: the algorithm's default, negative: never wait)")
	return cmd
}

func (c *benchConfig) validate() error {
	switch {
	case c.pages < 0:
		return fmt.Errorf("invalid --pages %d: want 0 (all) or more", c.pages)
	case c.minTime < 0 || c.minTime > time.Hour:
		return fmt.Errorf("invalid --min-time %v: want 0 to 1h", c.minTime)
	case c.batchPages < 1 || c.batchPages > 65536:
		return fmt.Errorf("invalid --batch-pages %d: want 1 to 65536", c.batchPages)
	case c.inFlight < 1 || c.inFlight > 1024:
		return fmt.Errorf("invalid --batch-inflight %d: want 1 to 1024", c.inFlight)
	case c.writers < 1 || c.writers > 1024:
		return fmt.Errorf("invalid --writers %d: want 1 to 1024", c.writers)
	case c.reqPages < 1 || c.reqPages > 4096:
		return fmt.Errorf("invalid --request-pages %d: want 1 to 4096", c.reqPages)
	case c.devBackend != "auto" && c.devBackend != "gpu" && c.devBackend != "cpu":
		return fmt.Errorf("invalid --device-backend %q: want auto, gpu or cpu", c.devBackend)
	case c.devAlg != "lz4" && c.devAlg != "zstd":
		return fmt.Errorf("invalid --device-algorithm %q: want lz4 or zstd", c.devAlg)
	case c.corpus != "" && c.generated:
		return errors.New("invalid --generated with --corpus: choose one")
	}
	for _, b := range c.backends {
		if b != "cpu-lz4" && b != "cpu-zstd" && b != "gpu" && b != "gpu-zstd" {
			return fmt.Errorf("invalid --backends %q: want a list of cpu-lz4, cpu-zstd, gpu, gpu-zstd", b)
		}
	}
	return nil
}

// loadPages returns the pages to measure and a line describing them.
func loadPages(cfg *benchConfig) ([]byte, string, error) {
	if !cfg.generated {
		path := cfg.corpus
		if path == "" {
			p, err := corpus.Find()
			if err == nil {
				path = p
			}
		}
		if path != "" {
			data, err := corpus.Load(path)
			if err != nil {
				return nil, "", err
			}
			if cfg.pages > 0 && cfg.pages*codec.PageSize < len(data) {
				data = data[:cfg.pages*codec.PageSize]
			}
			return data, "corpus " + path, nil
		}
	}
	n := cfg.pages
	if n == 0 {
		n = 16384
	}
	return generatePages(n), "generated pages", nil
}

// generatePages makes pages that look a little like anonymous memory: a
// share of zero pages, small integers, pointers into a few regions, text,
// and some incompressible bytes. Deterministic.
func generatePages(n int) []byte {
	r := rand.New(rand.NewPCG(0x67a, 0x4d))
	words := strings.Fields("the quick brown fox jumps over the lazy dog swap page memory kernel compress batch device")
	buf := make([]byte, n*codec.PageSize)
	for i := range n {
		p := buf[i*codec.PageSize : (i+1)*codec.PageSize]
		switch k := r.IntN(10); {
		case k < 2: // zero page
		case k < 4: // small integers, 8-byte aligned
			for j := 0; j < len(p); j += 8 {
				v := r.Uint64N(1000)
				for b := range 8 {
					p[j+b] = byte(v >> (8 * b))
				}
			}
		case k < 6: // pointers into a few regions
			base := uint64(0x7f00_0000_0000) + r.Uint64N(4)<<32
			for j := 0; j < len(p); j += 8 {
				v := base + r.Uint64N(1<<16)*16
				for b := range 8 {
					p[j+b] = byte(v >> (8 * b))
				}
			}
		case k < 9: // text
			j := 0
			for j < len(p) {
				j += copy(p[j:], words[r.IntN(len(words))]+" ")
			}
		default: // incompressible
			for j := range p {
				p[j] = byte(r.Uint32())
			}
		}
	}
	return buf
}

type benchResult struct {
	name, algorithm        string
	compressGBps, decGBps  float64
	ratio, cpuSecondsPerGB float64
	err                    error
}

func runBench(ctx context.Context, cfg *benchConfig, out, errOut io.Writer) error {
	data, what, err := loadPages(cfg)
	if err != nil {
		return err
	}
	pages := len(data) / codec.PageSize
	zero := 0
	for i := range pages {
		if isZero(data[i*codec.PageSize : (i+1)*codec.PageSize]) {
			zero++
		}
	}
	fmt.Fprintf(out, "%s: %d pages (%s), %.1f%% zero-filled; %d CPUs, batches of %d pages, %d in flight\n\n",
		what, pages, humanBytes(int64(len(data))), 100*float64(zero)/float64(pages), runtime.GOMAXPROCS(0), cfg.batchPages, cfg.inFlight)
	bar := newProgress(errOut)
	defer bar.done()

	var results []benchResult
	for _, name := range cfg.backends {
		results = append(results, benchBackend(ctx, cfg, name, data, bar))
	}
	bar.done()
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "BACKEND\tALGORITHM\tCOMPRESS GB/s\tDECOMPRESS GB/s\tRATIO\tCPU-s/GB")
	var unavailable []benchResult
	for _, r := range results {
		if r.err != nil {
			unavailable = append(unavailable, r)
			continue
		}
		dec := "-"
		if r.decGBps > 0 {
			dec = fmt.Sprintf("%.2f", r.decGBps)
		}
		fmt.Fprintf(tw, "%s\t%s\t%.2f\t%s\t%.3f\t%.2f\n", r.name, r.algorithm, r.compressGBps, dec, r.ratio, r.cpuSecondsPerGB)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, r := range unavailable {
		fmt.Fprintf(out, "%s %s: not measured: %v\n", r.name, r.algorithm, r.err)
	}
	if !cfg.device {
		return nil
	}
	ing, err := benchDevice(ctx, cfg, data, bar)
	bar.done()
	if err != nil {
		return fmt.Errorf("device ingest: %w", err)
	}
	fmt.Fprintf(out, "\ndevice ingest (%s backend, %s, %d writers x %s requests): %.2f GB/s, %.2f CPU-s/GB\n",
		ing.backend, cfg.devAlg, cfg.writers, humanBytes(int64(cfg.reqPages*codec.PageSize)), ing.gbps, ing.cpuSecondsPerGB)
	fmt.Fprintf(out, "effective ratio %.3f (orig_data_size %s / mem_used_total %s); compr_data_size %s; %d same-filled and %d huge pages of %d\n",
		ing.ratio(), humanBytes(ing.stats.OrigDataSize), humanBytes(ing.stats.MemUsedTotal),
		humanBytes(ing.stats.ComprDataSize), ing.stats.SamePages, ing.stats.HugePages, pages)
	return nil
}

func isZero(p []byte) bool {
	for _, b := range p {
		if b != 0 {
			return false
		}
	}
	return true
}

// cpuTime is the process's user+system time so far.
func cpuTime() time.Duration {
	var ru unix.Rusage
	if err := unix.Getrusage(unix.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func openBenchBackend(cfg *benchConfig, name string) (codec.BatchCompressor, codec.Codec, func(), error) {
	switch name {
	case "cpu-lz4", "cpu-zstd":
		c, err := codec.New(strings.TrimPrefix(name, "cpu-"))
		if err != nil {
			return nil, nil, nil, err
		}
		return codec.NewCPUBatch(c, 0), c, func() {}, nil
	case "gpu", "gpu-zstd":
		algorithm := "lz4"
		if name == "gpu-zstd" {
			algorithm = "zstd"
		}
		g, err := gpu.Open(gpu.Config{Device: cfg.gpuDevice, Bays: cfg.inFlight, MaxBatchPages: cfg.batchPages,
			Algorithm: algorithm, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
		if err != nil {
			return nil, nil, nil, err
		}
		dec, err := codec.New(algorithm)
		if err != nil {
			g.Close()
			return nil, nil, nil, err
		}
		return g, dec, func() { g.Close() }, nil
	}
	return nil, nil, nil, fmt.Errorf("unknown backend %q", name)
}

// benchBackend compresses the pages in batches, inFlight at once, until
// minTime has passed (at least one pass), then decodes the first pass's
// output on the CPU the same way.
func benchBackend(ctx context.Context, cfg *benchConfig, name string, data []byte, bar *progress) benchResult {
	res := benchResult{name: strings.SplitN(name, "-", 2)[0], algorithm: "lz4"}
	if strings.HasSuffix(name, "zstd") {
		res.algorithm = "zstd"
	}
	bc, dec, closeFn, err := openBenchBackend(cfg, name)
	if err != nil {
		res.err = err
		return res
	}
	defer closeFn()
	r := &benchRun{cfg: cfg, name: name, data: data, pages: len(data) / codec.PageSize, bar: bar}
	comp, st, err := r.compress(ctx, bc)
	if err != nil {
		res.err = err
		return res
	}
	bytes := float64(st.pages) * codec.PageSize
	res.compressGBps = bytes / st.elapsed.Seconds() / 1e9
	res.cpuSecondsPerGB = st.cpu.Seconds() / (bytes / 1e9)
	res.ratio = float64(len(data)) / float64(storedBytes(comp))
	res.decGBps, res.err = r.decode(dec, comp)
	return res
}

// benchRun is one backend's run over the pages in data, shown on bar
// under name.
type benchRun struct {
	cfg   *benchConfig
	name  string
	data  []byte
	pages int
	bar   *progress
}

// compressStats is what the compress passes took: pages compressed, wall
// and CPU time.
type compressStats struct {
	pages        int64
	elapsed, cpu time.Duration
}

// compress runs the compress passes on bc: batches of batchPages, inFlight
// at once, until minTime has passed (at least one pass). It returns the
// first pass's output (nil for a page stored raw), kept for the ratio and
// the decode.
func (r *benchRun) compress(ctx context.Context, bc codec.BatchCompressor) ([][]byte, compressStats, error) {
	cfg, pages := r.cfg, r.pages
	chunks := (pages + cfg.batchPages - 1) / cfg.batchPages
	// The first pass keeps its output for the ratio and the decode.
	comp := make([][]byte, pages)

	var next atomic.Int64 // chunk counter across passes
	var processed atomic.Int64
	stop := atomic.Bool{}
	var firstErr error
	var errOnce sync.Once
	start, cpu0 := time.Now(), cpuTime()
	var wg sync.WaitGroup
	for range cfg.inFlight {
		var b *codec.Batch
		if a, ok := bc.(codec.BatchAllocator); ok {
			var err error
			if b, err = a.NewBatch(cfg.batchPages); err != nil {
				return nil, compressStats{}, err
			}
		} else {
			b = codec.NewBatch(cfg.batchPages)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			for !stop.Load() {
				k := int(next.Add(1) - 1)
				pass, c := k/chunks, k%chunks
				if pass > 0 && time.Since(start) >= cfg.minTime {
					return
				}
				lo := c * cfg.batchPages
				hi := min(lo+cfg.batchPages, pages)
				b.N = hi - lo
				copy(b.Pages, r.data[lo*codec.PageSize:hi*codec.PageSize])
				if err := bc.CompressBatch(ctx, b); err != nil {
					errOnce.Do(func() { firstErr = err })
					stop.Store(true)
					return
				}
				if pass == 0 {
					for i := range b.N {
						if cb := b.Compressed(i); cb != nil {
							comp[lo+i] = append([]byte(nil), cb...)
						}
					}
				}
				n := processed.Add(int64(b.N))
				r.bar.set(r.name+" compress", progressFrac(start, cfg.minTime, n, int64(pages)))
			}
		}()
	}
	wg.Wait()
	st := compressStats{elapsed: time.Since(start), cpu: cpuTime() - cpu0}
	if firstErr != nil {
		return nil, st, firstErr
	}
	st.pages = processed.Load()
	return comp, st, nil
}

// storedBytes is what the compressed pages in comp take, a page stored raw
// (nil) counting whole.
func storedBytes(comp [][]byte) int64 {
	var compBytes int64
	for _, c := range comp {
		if c == nil {
			compBytes += codec.PageSize
		} else {
			compBytes += int64(len(c))
		}
	}
	return compBytes
}

// decode decodes comp on the CPU, a worker per GOMAXPROCS, pass after pass
// until minTime has passed (at least one pass), and returns its GB/s.
// Reads always decode on the CPU.
func (r *benchRun) decode(dec codec.Codec, comp [][]byte) (float64, error) {
	decoded, dstart := int64(0), time.Now()
	workers := runtime.GOMAXPROCS(0)
	for decoded == 0 || time.Since(dstart) < r.cfg.minTime {
		if bad := decodeOnce(dec, comp, workers); bad > 0 {
			return 0, fmt.Errorf("%d pages did not decode: %w", bad, codec.ErrCorrupt)
		}
		decoded += int64(r.pages)
		r.bar.set(r.name+" decompress", progressFrac(dstart, r.cfg.minTime, decoded, int64(r.pages)))
	}
	return float64(decoded) * codec.PageSize / time.Since(dstart).Seconds() / 1e9, nil
}

// decodeOnce decodes every page of comp once, from workers goroutines,
// and returns how many did not decode.
func decodeOnce(dec codec.Codec, comp [][]byte, workers int) int64 {
	var wg sync.WaitGroup
	var bad atomic.Int64
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			dst := make([]byte, codec.PageSize)
			for i := w; i < len(comp); i += workers {
				if comp[i] == nil {
					continue
				}
				if err := dec.Decompress(dst, comp[i]); err != nil {
					bad.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	return bad.Load()
}

func progressFrac(start time.Time, minTime time.Duration, done, onePass int64) float64 {
	f := float64(done) / float64(onePass)
	if minTime > 0 {
		f = max(min(f, 1)*0.01, time.Since(start).Seconds()/minTime.Seconds())
	}
	return min(f, 1)
}

type ingestResult struct {
	backend         string
	gbps            float64
	cpuSecondsPerGB float64
	stats           device.Stats
}

func (r ingestResult) ratio() float64 {
	if r.stats.MemUsedTotal == 0 {
		return 0
	}
	return float64(r.stats.OrigDataSize) / float64(r.stats.MemUsedTotal)
}

// benchDevice writes the pages through a device on the daemon's default
// backend (the GPU when there is one), repeating until minTime, and reads
// the device's statistics at the end.
func benchDevice(ctx context.Context, cfg *benchConfig, data []byte, bar *progress) (ingestResult, error) {
	var res ingestResult
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	accel, err := devAccelerator(cfg, quiet)
	if err != nil {
		return res, err
	}
	res.backend = "cpu"
	var routeAccel route.Accelerator
	if accel != nil {
		defer accel.Close()
		res.backend, routeAccel = "gpu", accel
	}
	p, err := pipeline.New(pipeline.Config{
		Size: int64(len(data)), Algorithm: cfg.devAlg, Accelerator: routeAccel,
		StagingBytes: pipeline.DefaultStagingBytes, StagingWait: cfg.stagingWait, BatchPages: cfg.batchPages, BatchWorkers: cfg.inFlight,
		Logger: quiet,
	})
	if err != nil {
		return res, err
	}
	defer p.Close()
	dev := p.Device
	req := cfg.reqPages * codec.PageSize
	reqs := (len(data) + req - 1) / req
	var next, written atomic.Int64
	var firstErr error
	var errOnce sync.Once
	start, cpu0 := time.Now(), cpuTime()
	var wg sync.WaitGroup
	for range cfg.writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				k := int(next.Add(1) - 1)
				pass, r := k/reqs, k%reqs
				if pass > 0 && time.Since(start) >= cfg.minTime {
					return
				}
				lo := r * req
				hi := min(lo+req, len(data))
				if err := dev.WriteAt(ctx, data[lo:hi], int64(lo), false); err != nil {
					errOnce.Do(func() { firstErr = err })
					return
				}
				n := written.Add(int64(hi - lo))
				bar.set("device ingest", progressFrac(start, cfg.minTime, n, int64(len(data))))
			}
		}()
	}
	wg.Wait()
	// Staged pages count once they are compressed and stored.
	if err := dev.Drain(ctx); err != nil && firstErr == nil {
		firstErr = err
	}
	elapsed, cpu := time.Since(start), cpuTime()-cpu0
	if firstErr != nil {
		return res, firstErr
	}
	res.gbps = float64(written.Load()) / elapsed.Seconds() / 1e9
	res.cpuSecondsPerGB = cpu.Seconds() / (float64(written.Load()) / 1e9)
	res.stats = dev.Stats()
	return res, nil
}

// progress draws a one-line bar on a terminal, at most ten times a second;
// elsewhere it does nothing.
type progress struct {
	w     io.Writer
	tty   bool
	mu    sync.Mutex
	last  time.Time
	shown bool
}

func newProgress(w io.Writer) *progress {
	p := &progress{w: w}
	if f, ok := w.(*os.File); ok {
		_, err := unix.IoctlGetTermios(int(f.Fd()), unix.TCGETS)
		p.tty = err == nil
	}
	return p
}

func (p *progress) set(label string, frac float64) {
	if !p.tty {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if time.Since(p.last) < 100*time.Millisecond {
		return
	}
	p.last = time.Now()
	const width = 30
	n := int(frac * width)
	fmt.Fprintf(p.w, "\r\x1b[K%-22s [%s%s] %3d%%", label, strings.Repeat("#", n), strings.Repeat(".", width-n), int(frac*100))
	p.shown = true
}

func (p *progress) done() {
	if !p.tty {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.shown {
		fmt.Fprint(p.w, "\r\x1b[K")
		p.shown = false
	}
}

// devAccelerator opens the GPU for benchDevice as the daemon does
// (serving.Config.ResolveBackend): required with --device-backend gpu, where
// one is usable with auto, never with cpu; nil for none.
func devAccelerator(cfg *benchConfig, log *slog.Logger) (*gpu.Backend, error) {
	g, _, err := serving.OpenBackend("--device-backend", cfg.devBackend, func() (*gpu.Backend, error) {
		return gpu.Open(gpu.Config{Device: cfg.gpuDevice, Bays: cfg.inFlight, MaxBatchPages: cfg.batchPages,
			Algorithm: cfg.devAlg, WorkQueues: serving.GPUWorkQueues(cfg.devAlg), Logger: log})
	})
	return g, err
}
