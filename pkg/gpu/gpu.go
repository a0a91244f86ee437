// Package gpu compresses batches of pages with the LZ4 and zstd kernels of package
// kernels on an NVIDIA GPU, through the CUDA driver API.
//
// libcuda is opened at run time (dlopen), so gzramd builds without the CUDA
// toolkit and runs on hosts without a GPU: Open then fails with an error
// wrapping ErrUnavailable and the caller uses the CPU codec. cgo is confined
// to this package.
//
// A Backend owns a few bays, each with a stream, GPU memory and pinned host
// buffers allocated once at Open. Concurrent CompressBatch calls take
// different bays, so one batch's upload, another's kernel and a third's
// download overlap. The kernel packs the compressed pages on the GPU, so
// only their bytes and a small array of offsets and lengths come back.
//
// The Backend never decides between the GPU and the CPU: pkg/route does,
// and redoes on the CPU any batch the GPU fails or does not finish in time,
// with nothing lost.
package gpu

import (
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/gzramd/gzramd/kernels"
	"github.com/gzramd/gzramd/pkg/codec"
)

// ErrUnavailable is wrapped by every error of Open: no libcuda, no device,
// or a GPU that cannot be set up. The caller then runs on the CPU.
var ErrUnavailable = errors.New("gpu: unavailable")

// errClosed reports use of a closed Backend.
var errClosed = errors.New("gpu: backend closed")

// kernel is one compression kernel of a batch and its launch shape: a warp
// a page, pagesPerBlock pages a block.
type kernel struct {
	name          string
	f             function
	pagesPerBlock int
}

// An algorithm's embedded PTX, the kernels a batch runs, in order, and the
// scratch they need a page: lz4.cu's one kernel (C_WARPS pages a block),
// zstd.cu's two (ZW_PARSE_WARPS pages a block of gz_zstd_parse, one of
// gz_zstd_encode; ZW_SCRATCH_PAGE). Every backend also loads zstd.cu's
// kernels of groups (groupKernels).
var batchKernels = map[string]struct {
	ptx          []byte
	kernels      []kernel
	scratchPages int
}{
	"lz4":  {kernels.LZ4, []kernel{{name: "gz_lz4_compress", pagesPerBlock: 4}}, 1},
	"zstd": {kernels.Zstd, []kernel{{name: "gz_zstd_parse", pagesPerBlock: 4}, {name: "gz_zstd_encode", pagesPerBlock: 1}}, 2},
}

// groupKernels compress groups of codec.GroupPages pages, each as one zstd
// frame (CompressGroups): zstd.cu's, launched with a warp a group, a warp
// a page, and a warp a group; ZW_SCRATCH_PAGE a page.
var groupKernels = []kernel{{name: "gz_zstd_parse_groups"}, {name: "gz_zstd_encode_blocks"}, {name: "gz_zstd_pack_groups"}}

// zstdObjectKernels compress objects of several pages (codec.Batch.Objects)
// on a zstd backend, each as one frame of a block a page: zstd.cu's,
// each launched with a warp a page.
var zstdObjectKernels = []kernel{{name: "gz_zstd_parse_objects"}, {name: "gz_zstd_encode_blocks"}, {name: "gz_zstd_pack_objects"}}

// groupScratchPages is the scratch groupKernels need a page.
const groupScratchPages = 2

// lz4ObjectWarps is O_WARPS in kernels/lz4.cu: objects a block of
// gz_lz4_compress_objects.
const lz4ObjectWarps = 2

// pageDecoders decode the pages of groups given as stored
// (codec.Packed), by codec: lz4.cu's gz_lz4_decompress, D_WARPS pages a
// block, and zstd_dec.cu's gz_zstd_decompress, a warp a page.
var pageDecoders = map[string]kernel{
	"lz4":  {name: "gz_lz4_decompress", pagesPerBlock: 4},
	"zstd": {name: "gz_zstd_decompress", pagesPerBlock: 1},
}

// modules is the PTX a backend of algorithm loads: the algorithm's own (ptx
// in its place when not nil: a variant being measured), then the other's,
// for the kernels of groups (zstd.cu's) and the LZ4 page decoder (lz4.cu's),
// then the zstd page decoder. The dense tier's kernel is a module of its
// own (DeepGroups, CompileDeep).
func modules(algorithm string, ptx []byte) [][]byte {
	if ptx == nil {
		ptx = batchKernels[algorithm].ptx
	}
	if algorithm == "zstd" {
		return [][]byte{ptx, kernels.LZ4, kernels.ZstdDecode}
	}
	return [][]byte{ptx, kernels.Zstd, kernels.ZstdDecode}
}

// Config selects and sizes the GPU backend.
type Config struct {
	// Device is the GPU index, CUDA's device ordinal (--gpu-device).
	Device int
	// Bays is the number of batches in flight (default 8). A batch holds
	// its bay for about twice its kernel time (two round trips), so
	// throughput needs several bays and as many concurrent callers.
	Bays int
	// MaxBatchPages is the largest batch a bay holds (default 1024).
	MaxBatchPages int
	// Algorithm is the format the kernels write: "lz4" (the default: LZ4
	// blocks) or "zstd" (zstd frames); either decodes on the CPU.
	Algorithm string
	// Logger receives setup and quarantine messages (default slog.Default()).
	Logger *slog.Logger
	// Image is the kernels compiled for this GPU by Compile, loaded in
	// place of the embedded PTX, so that the driver's PTX compiler never
	// comes into the process. nil: the PTX, compiled here.
	Image []byte
	// DeepImage is the dense tier's kernel compiled for this GPU by
	// CompileDeep, for DeepGroups, as Image is for the rest. nil, or an
	// image the driver refuses: its PTX, compiled here.
	DeepImage []byte
	// WorkQueues is how many hardware work queues the CUDA context gets
	// (CUDA_DEVICE_MAX_CONNECTIONS, which wins when set): each costs the
	// host about 7 MiB of driver memory, mostly mapped from /dev/nvidiactl
	// (bench/gpu/ctxmem.c). 0 leaves the driver's default. It takes effect only for the first
	// GPU a process opens.
	WorkQueues int
}

func (c Config) withDefaults() Config {
	if c.Bays == 0 {
		c.Bays = 8
	}
	if c.MaxBatchPages == 0 {
		c.MaxBatchPages = 1024
	}
	if c.Algorithm == "" {
		c.Algorithm = "lz4"
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

func (c Config) validate() error {
	switch {
	case c.Device < 0:
		return fmt.Errorf("gpu: device index %d is negative", c.Device)
	case c.Bays < 1 || c.Bays > 64:
		return fmt.Errorf("gpu: bays %d out of range 1..64", c.Bays)
	case c.MaxBatchPages < 1 || c.MaxBatchPages > 1<<16:
		return fmt.Errorf("gpu: max batch pages %d out of range 1..65536", c.MaxBatchPages)
	case c.Algorithm != "lz4" && c.Algorithm != "zstd":
		return fmt.Errorf("gpu: unknown algorithm %q (want lz4 or zstd)", c.Algorithm)
	}
	return nil
}

// DeviceInfo describes the GPU a Backend runs on.
type DeviceInfo struct {
	Index           int
	Name            string
	Multiprocessors int
	ComputeMajor    int
	ComputeMinor    int
	MemoryBytes     uint64
	// BlockingSync reports that a thread waiting for the GPU sleeps
	// rather than spins (CU_CTX_SCHED_BLOCKING_SYNC).
	BlockingSync bool
	// WorkQueues is CUDA_DEVICE_MAX_CONNECTIONS as the driver found it
	// (0: unset, the driver's default).
	WorkQueues int
	// Compiled reports that the kernels came from Config.Image, not from
	// PTX compiled in this process.
	Compiled bool
}

const (
	metaHeaderWords = 4
)

func metaWords(maxPages int) int { return metaHeaderWords + 3*maxPages }

// A bay's meta, after its header: the offsets, the lengths and the decode
// status, MaxBatchPages words each.
const (
	metaOffsets = iota
	metaLens
	metaStatus
)

// metaOn is meta area k of bay s on the GPU.
func (g *Backend) metaOn(s *bay, k int) devicePtr {
	return s.dMeta + devicePtr(4*(metaHeaderWords+k*g.cfg.MaxBatchPages))
}

// metaHost is the first n words of meta area k of bay s, in pinned host
// memory.
func (g *Backend) metaHost(s *bay, k, n int) []uint32 {
	at := metaHeaderWords + k*g.cfg.MaxBatchPages
	return s.hMeta[at : at+n]
}

// Backend is the CUDA batch compressor. It implements codec.BatchCompressor
// and codec.BatchAllocator and is safe for concurrent use.
type Backend struct {
	dr      cuda
	info    DeviceInfo
	cfg     Config
	log     *slog.Logger
	mod     module
	kernels []kernel // a batch's, in order
	groups  []kernel // CompressGroups', in order
	// decoders are pageDecoders' kernels, which CompressGroups runs first
	// on the pages given as stored.
	decoders map[string]kernel
	// objects compress batches with objects of several pages
	// (codec.Batch.Objects): gz_lz4_compress_objects on an LZ4 backend
	// (lz4ObjectWarps a block), zstdObjectKernels on a zstd one (a warp
	// a block).
	objects []kernel
	bays    []*bay
	free    chan *bay
	closed  atomic.Bool
	done    chan struct{} // closed by Close

	pinnedMemory // NewBatch, NewOutputs, RegisterPages: the host memory the GPU reaches

	mu      sync.Mutex
	deep    *DeepGroups // made by DeepGroups, once
	bounced int64       // bytes of the bays' bounce buffers
}

// Open loads libcuda, picks cfg.Device, loads the kernels and allocates
// every buffer. Every error wraps ErrUnavailable.
func Open(cfg Config) (*Backend, error) {
	return open(cfg, nil, nil)
}

// open is Open with the kernels given as PTX (nil: the embedded ones for
// cfg.Algorithm), and the driver wrapped by wrap when it is not nil (the
// GPU tests: kernel variants, injected faults).
func open(cfg Config, ptx []byte, wrap func(cuda) cuda) (*Backend, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	dr, info, err := loadDriver(cfg.Device, cfg.WorkQueues)
	if err != nil {
		return nil, err
	}
	var api cuda = dr
	if wrap != nil {
		api = wrap(dr)
	}
	g := &Backend{dr: api, info: info, cfg: cfg, log: cfg.Logger, free: make(chan *bay, cfg.Bays), done: make(chan struct{})}
	g.pinnedMemory = pinnedMemory{dr: api, maxPages: cfg.MaxBatchPages, closed: &g.closed}
	if err := g.setup(ptx); err != nil {
		g.teardown()
		return nil, fmt.Errorf("%w: %s: %w", ErrUnavailable, info.Name, err)
	}
	kernels := "PTX compiled in this process"
	if g.info.Compiled {
		kernels = "compiled ahead"
	}
	g.log.Info("gpu: backend ready", "device", info.Name, "index", info.Index,
		"sms", info.Multiprocessors, "slots", cfg.Bays, "max_batch_pages", cfg.MaxBatchPages,
		"kernels", kernels, "work_queues", g.info.WorkQueues)
	return g, nil
}

func (g *Backend) setup(ptx []byte) error {
	batch := batchKernels[g.cfg.Algorithm]
	var img []byte
	var err error
	if ptx == nil && g.cfg.Image != nil {
		img, g.info.Compiled = g.cfg.Image, true
	} else if img, err = g.dr.link(modules(g.cfg.Algorithm, ptx)...); err != nil {
		return err
	}
	if g.mod, err = g.dr.loadModule(img); err != nil {
		return err
	}
	objects := []kernel{{name: "gz_lz4_compress_objects", pagesPerBlock: lz4ObjectWarps}}
	if g.cfg.Algorithm == "zstd" {
		objects = zstdObjectKernels
	}
	for _, ks := range []struct {
		from []kernel
		to   *[]kernel
	}{{batch.kernels, &g.kernels}, {groupKernels, &g.groups}, {objects, &g.objects}} {
		for _, k := range ks.from {
			if k.f, err = g.dr.function(g.mod, k.name); err != nil {
				return err
			}
			*ks.to = append(*ks.to, k)
		}
	}
	g.decoders = make(map[string]kernel, len(pageDecoders))
	for c, k := range pageDecoders {
		if k.f, err = g.dr.function(g.mod, k.name); err != nil {
			return err
		}
		g.decoders[c] = k
	}
	n := g.cfg.MaxBatchPages
	for range g.cfg.Bays {
		s := &bay{}
		g.bays = append(g.bays, s)
		if s.stream, err = g.dr.streamCreate(); err != nil {
			return err
		}
		for _, d := range []struct {
			p     *devicePtr
			pages int
		}{{&s.dPages, n}, {&s.dScratch, n * batch.scratchPages}, {&s.dPacked, n}} {
			if *d.p, err = g.dr.memAlloc(d.pages * codec.PageSize); err != nil {
				return err
			}
		}
		if s.dMeta, err = g.dr.memAlloc(4 * metaWords(n)); err != nil {
			return err
		}
		if s.hMetaBytes, err = g.dr.hostAlloc(4 * metaWords(n)); err != nil {
			return err
		}
		s.hMeta = unsafe.Slice((*uint32)(unsafe.Pointer(&s.hMetaBytes[0])), metaWords(n))
		g.free <- s
	}
	return nil
}

// teardown frees what setup and NewBatch made. Only call it when no work
// is on the GPU.
func (g *Backend) teardown() error {
	var errs []error
	for _, s := range g.bays {
		for _, d := range []devicePtr{s.dPages, s.dScratch, s.dPacked, s.dMeta} {
			if d != 0 {
				errs = append(errs, g.dr.memFree(d))
			}
		}
		for _, h := range [][]byte{s.hBounce, s.hMetaBytes} {
			errs = append(errs, g.dr.hostFree(h))
		}
		if s.stream != nil {
			errs = append(errs, g.dr.streamDestroy(s.stream))
		}
	}
	errs = append(errs, g.freePinned())
	g.mu.Lock()
	if g.deep != nil {
		errs = append(errs, g.deep.free())
		g.deep = nil
	}
	g.mu.Unlock()
	if g.mod != nil {
		errs = append(errs, g.dr.unloadModule(g.mod))
	}
	g.dr.close()
	return errors.Join(errs...)
}

// Close waits (up to 10s) for batches in flight, then frees every buffer.
// Batches made by NewBatch must not be used afterwards. If the GPU does
// not finish in time, nothing is freed: it might still write into any of
// the buffers.
func (g *Backend) Close() error {
	if g.closed.Swap(true) {
		return nil
	}
	close(g.done)
	deadline := time.After(10 * time.Second)
	for range g.bays {
		select {
		case <-g.free:
		case <-deadline:
			g.log.Warn("gpu: closing with a batch still on the device; its memory is left allocated")
			return errors.New("gpu: close: device did not finish a batch within 10s")
		}
	}
	if err := g.teardown(); err != nil {
		return fmt.Errorf("gpu: close: %w", err)
	}
	return nil
}

// Name implements codec.BatchCompressor.
func (*Backend) Name() string { return "gpu" }

// Info describes the GPU.
func (g *Backend) Info() DeviceInfo { return g.info }

// MaxBatchPages is the largest batch CompressBatch takes.
func (g *Backend) MaxBatchPages() int { return g.cfg.MaxBatchPages }
