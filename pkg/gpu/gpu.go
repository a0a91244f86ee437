// Package gpu compresses batches of pages with the LZ4 kernels of package
// kernels on an NVIDIA GPU, through the CUDA driver API.
//
// libcuda is opened at run time (dlopen), so gzramd builds without the CUDA
// toolkit and runs on hosts without a GPU: Open then fails with an error
// wrapping ErrUnavailable and the caller uses the CPU codec. cgo is confined
// to this package.
//
// A Backend owns a few slots, each with a stream and device and pinned host
// buffers allocated once at Open. Concurrent CompressBatch calls take
// different slots, so one batch's upload, another's kernel and a third's
// download overlap. The kernel packs the compressed pages on the device, so
// only their bytes and a small array of offsets and lengths come back.
//
// The Backend never decides between the GPU and the CPU: pkg/route does,
// and redoes on the CPU any batch the GPU fails or does not finish in time,
// with nothing lost.
package gpu

import (
	"context"
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
// or a device that cannot be set up. The caller then runs on the CPU.
var ErrUnavailable = errors.New("gpu: unavailable")

// errClosed reports use of a closed Backend.
var errClosed = errors.New("gpu: backend closed")

// Launch geometry of the kernels in kernels/lz4.cu (C_WARPS, D_WARPS):
// one warp per page.
const (
	compressWarps   = 4
	decompressWarps = 4
)

// Config selects and sizes the GPU backend.
type Config struct {
	// Device is the CUDA device index (--gpu-device).
	Device int
	// Slots is the number of batches in flight (default 8). A batch holds
	// its slot for about twice its kernel time (two round trips), so
	// throughput needs several slots and as many concurrent callers.
	Slots int
	// MaxBatchPages is the largest batch a slot holds (default 1024).
	MaxBatchPages int
	// PTX overrides the embedded kernels (tests).
	PTX []byte
	// Faults, if set, makes the backend fail at chosen points (tests).
	Faults FaultInjector
	// HangFor is how long an injected FaultHang keeps the stream busy
	// (default 2s).
	HangFor time.Duration
	// Logger receives setup and quarantine messages (default slog.Default()).
	Logger *slog.Logger
}

func (c Config) withDefaults() Config {
	if c.Slots == 0 {
		c.Slots = 8
	}
	if c.MaxBatchPages == 0 {
		c.MaxBatchPages = 1024
	}
	if c.PTX == nil {
		c.PTX = kernels.LZ4
	}
	if c.HangFor == 0 {
		c.HangFor = 2 * time.Second
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
	case c.Slots < 1 || c.Slots > 64:
		return fmt.Errorf("gpu: slots %d out of range 1..64", c.Slots)
	case c.MaxBatchPages < 1 || c.MaxBatchPages > 1<<16:
		return fmt.Errorf("gpu: max batch pages %d out of range 1..65536", c.MaxBatchPages)
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
}

// slot is one batch in flight: a stream and its buffers.
type slot struct {
	stream stream
	// Device buffers: input pages (also the decompressed output), the
	// per-page encoding scratch, the packed output, and meta: the packed
	// size (word 0, padded to 16 bytes), then offsets, lengths and
	// decode status, maxPages words each.
	dPages, dScratch, dPacked, dMeta devicePtr
	// Pinned host buffers: packed bytes, decoded pages, meta.
	hPacked, hPages []byte
	hMeta           []uint32
	hMetaBytes      []byte
	// pending, when set, delivers the result of a stream synchronization
	// that a caller stopped waiting for.
	pending chan error
}

const (
	metaHeaderWords = 4
)

func metaWords(maxPages int) int { return metaHeaderWords + 3*maxPages }

// Backend is the CUDA batch compressor. It implements codec.BatchCompressor
// and codec.BatchAllocator and is safe for concurrent use.
type Backend struct {
	dr     *driver
	info   DeviceInfo
	cfg    Config
	log    *slog.Logger
	mod    module
	fComp  function
	fDec   function
	fSpin  function
	slots  []*slot
	free   chan *slot
	closed atomic.Bool
	done   chan struct{} // closed by Close

	mu     sync.Mutex
	pinned [][]byte // memory of batches made by NewBatch and NewOutputs
}

// Open loads libcuda, picks cfg.Device, loads the kernels and allocates
// every buffer. Every error wraps ErrUnavailable.
func Open(cfg Config) (*Backend, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	dr, info, err := loadDriver(cfg.Device)
	if err != nil {
		return nil, err
	}
	g := &Backend{dr: dr, info: info, cfg: cfg, log: cfg.Logger, free: make(chan *slot, cfg.Slots), done: make(chan struct{})}
	if err := g.setup(); err != nil {
		g.teardown()
		return nil, fmt.Errorf("%w: %s: %w", ErrUnavailable, info.Name, err)
	}
	g.log.Info("gpu: backend ready", "device", info.Name, "index", info.Index,
		"sms", info.Multiprocessors, "slots", cfg.Slots, "max_batch_pages", cfg.MaxBatchPages)
	return g, nil
}

func (g *Backend) setup() error {
	var err error
	if g.mod, err = g.dr.loadModule(g.cfg.PTX); err != nil {
		return err
	}
	if g.fComp, err = g.dr.function(g.mod, "gz_lz4_compress"); err != nil {
		return err
	}
	if g.fDec, err = g.dr.function(g.mod, "gz_lz4_decompress"); err != nil {
		return err
	}
	if g.fSpin, err = g.dr.function(g.mod, "gz_spin"); err != nil {
		return err
	}
	if err := g.fault(FaultAlloc); err != nil {
		return err
	}
	n := g.cfg.MaxBatchPages
	for range g.cfg.Slots {
		s := &slot{}
		g.slots = append(g.slots, s)
		if s.stream, err = g.dr.streamCreate(); err != nil {
			return err
		}
		for _, d := range []*devicePtr{&s.dPages, &s.dScratch, &s.dPacked} {
			if *d, err = g.dr.memAlloc(n * codec.PageSize); err != nil {
				return err
			}
		}
		if s.dMeta, err = g.dr.memAlloc(4 * metaWords(n)); err != nil {
			return err
		}
		if s.hPacked, err = g.dr.hostAlloc(n * codec.PageSize); err != nil {
			return err
		}
		if s.hPages, err = g.dr.hostAlloc(n * codec.PageSize); err != nil {
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
// is on the device.
func (g *Backend) teardown() error {
	var errs []error
	for _, s := range g.slots {
		for _, d := range []devicePtr{s.dPages, s.dScratch, s.dPacked, s.dMeta} {
			if d != 0 {
				errs = append(errs, g.dr.memFree(d))
			}
		}
		for _, h := range [][]byte{s.hPacked, s.hPages, s.hMetaBytes} {
			errs = append(errs, g.dr.hostFree(h))
		}
		if s.stream != nil {
			errs = append(errs, g.dr.streamDestroy(s.stream))
		}
	}
	g.mu.Lock()
	for _, p := range g.pinned {
		errs = append(errs, g.dr.hostFree(p))
	}
	g.pinned = nil
	g.mu.Unlock()
	if g.mod != nil {
		errs = append(errs, g.dr.unloadModule(g.mod))
	}
	g.dr.close()
	return errors.Join(errs...)
}

// Close waits (up to 10s) for batches in flight, then frees every buffer.
// Batches made by NewBatch must not be used afterwards. If the device does
// not finish in time, nothing is freed: it might still write into any of
// the buffers.
func (g *Backend) Close() error {
	if g.closed.Swap(true) {
		return nil
	}
	close(g.done)
	deadline := time.After(10 * time.Second)
	for range g.slots {
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

// Info describes the device.
func (g *Backend) Info() DeviceInfo { return g.info }

// MaxBatchPages is the largest batch CompressBatch and DecompressBatch take.
func (g *Backend) MaxBatchPages() int { return g.cfg.MaxBatchPages }

// NewBatch implements codec.BatchAllocator. The whole batch (pages,
// output, offsets, lengths) lives in pinned host memory, so pages go up and
// compressed bytes come down by DMA with no staging copy.
//
// Because CompressBatch then writes b.Out by DMA, a batch that fails with
// a deadline error may still have b.Out written by the device until its
// slot is released; pkg/route gives the device shadow outputs (NewOutputs)
// for that reason.
func (g *Backend) NewBatch(capacity int) (*codec.Batch, error) {
	b, err := g.newPinned(capacity, true)
	if err != nil {
		return nil, err
	}
	return b, nil
}

// NewOutputs returns a batch with pinned outputs and no pages: the shadow
// outputs pkg/route gives the device, so that a late write by a batch it
// gave up on reaches no memory in use.
func (g *Backend) NewOutputs(capacity int) (*codec.Batch, error) {
	return g.newPinned(capacity, false)
}

func (g *Backend) newPinned(capacity int, withPages bool) (*codec.Batch, error) {
	if capacity < 1 || capacity > g.cfg.MaxBatchPages {
		return nil, fmt.Errorf("gpu: batch capacity %d out of range 1..%d", capacity, g.cfg.MaxBatchPages)
	}
	if g.closed.Load() {
		return nil, errClosed
	}
	if err := g.fault(FaultAlloc); err != nil {
		return nil, err
	}
	pageBytes := 0
	if withPages {
		pageBytes = capacity * codec.PageSize
	}
	size := pageBytes + capacity*codec.PageSize + 8*capacity
	mem, err := g.dr.hostAlloc(size)
	if err != nil {
		return nil, fmt.Errorf("gpu: pinned batch of %d pages: %w", capacity, err)
	}
	g.mu.Lock()
	g.pinned = append(g.pinned, mem)
	g.mu.Unlock()
	out := mem[pageBytes : pageBytes+capacity*codec.PageSize]
	meta := mem[pageBytes+capacity*codec.PageSize:]
	b := &codec.Batch{
		Out:     out,
		Offsets: unsafe.Slice((*uint32)(unsafe.Pointer(&meta[0])), capacity),
		Lens:    unsafe.Slice((*uint32)(unsafe.Pointer(&meta[4*capacity])), capacity),
	}
	if withPages {
		b.Pages = mem[:pageBytes]
	}
	return b, nil
}

// ownsPinned reports whether p lies in pinned memory made by NewBatch.
func (g *Backend) ownsPinned(p []byte) bool {
	if len(p) == 0 {
		return false
	}
	lo := uintptr(unsafe.Pointer(&p[0]))
	hi := lo + uintptr(len(p))
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, m := range g.pinned {
		start := uintptr(unsafe.Pointer(&m[0]))
		if lo >= start && hi <= start+uintptr(len(m)) {
			return true
		}
	}
	return false
}

func (g *Backend) fault(p FaultPoint) error {
	if g.cfg.Faults == nil {
		return nil
	}
	if err := g.cfg.Faults.Fault(p); err != nil {
		return fmt.Errorf("gpu: injected fault at %s: %w", p, err)
	}
	return nil
}

func (g *Backend) acquire(ctx context.Context) (*slot, error) {
	if g.closed.Load() {
		return nil, errClosed
	}
	select {
	case s := <-g.free:
		return s, nil
	case <-g.done:
		return nil, errClosed
	case <-ctx.Done():
		return nil, fmt.Errorf("gpu: waiting for a free slot: %w", ctx.Err())
	}
}

// release returns a slot to the pool once its stream has no work left. A
// slot whose batch was abandoned (deadline, error) stays quarantined until
// the device is done with it, so nothing the device still writes can reach
// memory that a later batch or the CPU fallback uses.
func (g *Backend) release(s *slot) {
	if s.pending == nil && g.dr.streamQuery(s.stream) == nil {
		g.free <- s
		return
	}
	go func() {
		start := time.Now()
		if s.pending != nil {
			<-s.pending
			s.pending = nil
		}
		err := g.dr.streamSync(s.stream)
		g.log.Warn("gpu: quarantined slot released", "held", time.Since(start), "stream_error", err)
		g.free <- s
	}()
}

// wait blocks until the slot's stream finishes or ctx ends. In the latter
// case the synchronization goes on in the background (s.pending) and the
// slot must be released, which quarantines it.
func (g *Backend) wait(ctx context.Context, s *slot) error {
	if err := g.fault(FaultSync); err != nil {
		return err
	}
	if ctx.Done() == nil {
		return g.dr.streamSync(s.stream)
	}
	done := make(chan error, 1)
	go func() { done <- g.dr.streamSync(s.stream) }()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		s.pending = done
		return fmt.Errorf("gpu: batch overran its deadline: %w", ctx.Err())
	}
}

func bytesOf(u []uint32) []byte {
	if len(u) == 0 {
		return nil
	}
	return unsafe.Slice((*byte)(unsafe.Pointer(&u[0])), 4*len(u))
}

func (g *Backend) checkBatch(b *codec.Batch) error {
	n := b.N
	switch {
	case n < 0 || n > b.Cap():
		return fmt.Errorf("gpu: batch has %d pages, capacity %d", n, b.Cap())
	case len(b.Pages) < n*codec.PageSize || len(b.Out) < n*codec.PageSize || len(b.Lens) < n:
		return fmt.Errorf("gpu: batch buffers too short for %d pages", n)
	}
	return nil
}

// CompressBatch implements codec.BatchCompressor. The compressed pages are
// packed at the start of b.Out (16-byte aligned offsets); b.Pages is only
// read. A batch larger than MaxBatchPages is split into slot-sized parts
// that run concurrently, each packed at the start of its part of b.Out.
// When it returns an error the device may still be working on a
// quarantined slot; see NewBatch for what that means for b.Out.
func (g *Backend) CompressBatch(ctx context.Context, b *codec.Batch) error {
	if err := g.checkBatch(b); err != nil {
		return err
	}
	return g.split(b, func(part *codec.Batch, first int) error {
		if err := g.compressPart(ctx, part); err != nil {
			return err
		}
		for i := range part.N {
			if part.Lens[i] != 0 {
				part.Offsets[i] += uint32(first * codec.PageSize)
			}
		}
		return nil
	})
}

// split calls f on b whole when it fits a slot, else on views of b of up
// to MaxBatchPages pages (Out sliced alike), concurrently; first is the
// index of a part's first page in b.
func (g *Backend) split(b *codec.Batch, f func(part *codec.Batch, first int) error) error {
	n, m := b.N, g.cfg.MaxBatchPages
	if n <= m {
		return f(b, 0)
	}
	var wg sync.WaitGroup
	errs := make([]error, (n+m-1)/m)
	for k, lo := 0, 0; lo < n; k, lo = k+1, lo+m {
		hi := min(lo+m, n)
		part := &codec.Batch{
			Pages:   b.Pages[lo*codec.PageSize : hi*codec.PageSize],
			N:       hi - lo,
			Out:     b.Out[lo*codec.PageSize : hi*codec.PageSize],
			Offsets: b.Offsets[lo:hi],
			Lens:    b.Lens[lo:hi],
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[k] = f(part, lo)
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// compressPart compresses a batch of at most MaxBatchPages pages.
func (g *Backend) compressPart(ctx context.Context, b *codec.Batch) error {
	n := b.N
	if n == 0 {
		return nil
	}
	s, err := g.acquire(ctx)
	if err != nil {
		return err
	}
	defer g.release(s)
	direct := g.ownsPinned(b.Out)
	dst := s.hPacked
	if direct {
		dst = b.Out
	}
	total, err := g.compress(ctx, s, b.Pages[:n*codec.PageSize], n, dst)
	if err != nil {
		return err
	}
	offs := s.hMeta[metaHeaderWords : metaHeaderWords+n]
	lens := s.hMeta[metaHeaderWords+g.cfg.MaxBatchPages : metaHeaderWords+g.cfg.MaxBatchPages+n]
	// Trust nothing the device returned until it is checked.
	for i := range n {
		l, o := lens[i], offs[i]
		if l >= codec.PageSize || (l > 0 && (o%16 != 0 || uint64(o)+uint64(l) > uint64(total))) {
			return fmt.Errorf("gpu: page %d: device returned length %d at offset %d of %d packed bytes", i, l, o, total)
		}
	}
	if !direct {
		copy(b.Out[:total], s.hPacked[:total])
	}
	for i := range n {
		b.Lens[i] = lens[i]
		if lens[i] == 0 {
			b.Offsets[i] = 0
		} else {
			b.Offsets[i] = offs[i]
		}
	}
	return nil
}

// compress runs one batch on slot s and leaves the packed bytes in dst
// (pinned memory) and the offsets and lengths in s.hMeta. It returns the
// packed size.
func (g *Backend) compress(ctx context.Context, s *slot, pages []byte, n int, dst []byte) (int, error) {
	dr, m := g.dr, g.cfg.MaxBatchPages
	if err := dr.memset32(s.dMeta, 0, 1, s.stream); err != nil {
		return 0, err
	}
	if err := g.fault(FaultUpload); err != nil {
		return 0, err
	}
	if err := dr.htod(s.dPages, pages, s.stream); err != nil {
		return 0, err
	}
	if g.cfg.Faults != nil && g.cfg.Faults.Fault(FaultHang) != nil {
		if err := dr.launchSpin(g.fSpin, s.stream, uint64(g.cfg.HangFor)); err != nil {
			return 0, err
		}
	}
	if err := g.fault(FaultKernel); err != nil {
		return 0, err
	}
	offs, lens := s.dMeta+devicePtr(4*metaHeaderWords), s.dMeta+devicePtr(4*(metaHeaderWords+m))
	grid := (n + compressWarps - 1) / compressWarps
	if err := dr.launchCompress(g.fComp, grid, 32*compressWarps, s.stream, s.dPages, n,
		s.dScratch, s.dPacked, s.dMeta, offs, lens); err != nil {
		return 0, err
	}
	if err := g.fault(FaultDownload); err != nil {
		return 0, err
	}
	// The header and offsets, then the lengths: one copy each.
	if err := dr.dtoh(s.hMetaBytes[:4*(metaHeaderWords+n)], s.dMeta, s.stream); err != nil {
		return 0, err
	}
	if err := dr.dtoh(s.hMetaBytes[4*(metaHeaderWords+m):4*(metaHeaderWords+m+n)], lens, s.stream); err != nil {
		return 0, err
	}
	if err := g.wait(ctx, s); err != nil {
		return 0, err
	}
	total := int(s.hMeta[0])
	if total > n*codec.PageSize {
		return 0, fmt.Errorf("gpu: device reported %d packed bytes for %d pages", total, n)
	}
	if err := dr.dtoh(dst[:total], s.dPacked, s.stream); err != nil {
		return 0, err
	}
	if err := g.wait(ctx, s); err != nil {
		return 0, err
	}
	return total, nil
}

// DecompressBatch decodes the compressed pages of b (b.Out at b.Offsets,
// b.Lens; as CompressBatch or the CPU codec left them) into b.Pages. Pages
// with length 0 (stored raw) are left untouched. Malformed pages make it
// return an error wrapping codec.ErrCorrupt; the other pages are decoded,
// and the content of the malformed ones is undefined. A batch larger than
// MaxBatchPages is decoded in slot-sized parts, concurrently; each part's
// compressed bytes must span at most MaxBatchPages pages of b.Out (as they
// do when CompressBatch or the CPU codec wrote them).
func (g *Backend) DecompressBatch(ctx context.Context, b *codec.Batch) error {
	if err := g.checkBatch(b); err != nil {
		return err
	}
	if len(b.Offsets) < b.N {
		return fmt.Errorf("gpu: batch offsets too short for %d pages", b.N)
	}
	return g.split(b, func(part *codec.Batch, _ int) error {
		part.Out = b.Out // offsets are relative to the whole of b.Out
		return g.decompressPart(ctx, part)
	})
}

// decompressPart decodes a batch of at most MaxBatchPages pages.
func (g *Backend) decompressPart(ctx context.Context, b *codec.Batch) error {
	n := b.N
	if n == 0 {
		return nil
	}
	// Upload only the span the pages' compressed bytes cover, and the
	// offsets relative to it.
	lo, hi := len(b.Out), 0
	for i := range n {
		l, o := b.Lens[i], b.Offsets[i]
		if l == 0 {
			continue
		}
		if l >= codec.PageSize || uint64(o)+uint64(l) > uint64(len(b.Out)) {
			return fmt.Errorf("gpu: page %d: length %d at offset %d outside %d bytes: %w", i, l, o, len(b.Out), codec.ErrCorrupt)
		}
		lo, hi = min(lo, int(o)), max(hi, int(o+l))
	}
	if hi == 0 {
		return nil // every page is raw
	}
	if hi-lo > g.cfg.MaxBatchPages*codec.PageSize {
		return fmt.Errorf("gpu: compressed pages span %d bytes, more than a slot holds", hi-lo)
	}
	s, err := g.acquire(ctx)
	if err != nil {
		return err
	}
	defer g.release(s)
	// Decoded pages come down by DMA straight into b.Pages when it is
	// pinned and every page is compressed (the device has no copy of a
	// raw page to write back); otherwise through the slot's buffer.
	direct := g.ownsPinned(b.Pages)
	for i := 0; i < n && direct; i++ {
		direct = b.Lens[i] != 0
	}
	dst := s.hPages
	if direct {
		dst = b.Pages
	}
	status, err := g.decompress(ctx, s, b.Out[lo:hi], uint32(lo), b.Offsets[:n], b.Lens[:n], dst)
	if err != nil {
		return err
	}
	bad := 0
	for i := range n {
		switch status[i] {
		case 0:
			if !direct {
				copy(b.Page(i), s.hPages[i*codec.PageSize:(i+1)*codec.PageSize])
			}
		case 1:
			bad++
		case 2:
			if b.Lens[i] != 0 {
				return fmt.Errorf("gpu: page %d: device skipped a compressed page", i)
			}
		default:
			return fmt.Errorf("gpu: page %d: device returned status %d", i, status[i])
		}
	}
	if bad > 0 {
		return fmt.Errorf("gpu: %d of %d pages: %w", bad, n, codec.ErrCorrupt)
	}
	return nil
}

// decompress runs one decode batch on s: the decoded pages land in dst
// (pinned memory), and the returned per-page status in s.hMeta.
func (g *Backend) decompress(ctx context.Context, s *slot, packed []byte, base uint32, offsets, lens []uint32, dst []byte) ([]uint32, error) {
	dr, m, n := g.dr, g.cfg.MaxBatchPages, len(lens)
	dOffs := s.dMeta + devicePtr(4*metaHeaderWords)
	dLens := s.dMeta + devicePtr(4*(metaHeaderWords+m))
	dStatus := s.dMeta + devicePtr(4*(metaHeaderWords+2*m))
	if err := g.fault(FaultUpload); err != nil {
		return nil, err
	}
	if err := dr.htod(s.dPacked, packed, s.stream); err != nil {
		return nil, err
	}
	// Offsets and lengths go up from the pinned meta buffer: an upload
	// from pageable memory would stall the stream.
	hOffs := s.hMeta[metaHeaderWords : metaHeaderWords+n]
	hLens := s.hMeta[metaHeaderWords+m : metaHeaderWords+m+n]
	for i, o := range offsets {
		if lens[i] != 0 {
			hOffs[i] = o - base
		} else {
			hOffs[i] = 0
		}
	}
	copy(hLens, lens)
	if err := dr.htod(dOffs, bytesOf(hOffs), s.stream); err != nil {
		return nil, err
	}
	if err := dr.htod(dLens, bytesOf(hLens), s.stream); err != nil {
		return nil, err
	}
	if err := g.fault(FaultKernel); err != nil {
		return nil, err
	}
	grid := (n + decompressWarps - 1) / decompressWarps
	if err := dr.launchDecompress(g.fDec, grid, 32*decompressWarps, s.stream, s.dPacked, dOffs, dLens, n,
		s.dPages, dStatus); err != nil {
		return nil, err
	}
	if err := g.fault(FaultDownload); err != nil {
		return nil, err
	}
	st := s.hMeta[metaHeaderWords+2*m : metaHeaderWords+2*m+n]
	if err := dr.dtoh(bytesOf(st), dStatus, s.stream); err != nil {
		return nil, err
	}
	if err := dr.dtoh(dst[:n*codec.PageSize], s.dPages, s.stream); err != nil {
		return nil, err
	}
	if err := g.wait(ctx, s); err != nil {
		return nil, err
	}
	return st, nil
}
