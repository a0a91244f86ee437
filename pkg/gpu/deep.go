// The dense tier's high-effort frames: groups as frames of 4 pages, each parsed optimally by a warp.

package gpu

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"unsafe"

	"github.com/gzramd/gzramd/kernels"
	"github.com/gzramd/gzramd/pkg/codec"
)

const (
	// deepFramePages is ZD_FRAME_PAGES in kernels/zstd_deep.cu: the pages
	// of a frame.
	deepFramePages = 4
	// deepScratchBytes is ZD_SCRATCH: a frame's scratch on the GPU.
	deepScratchBytes = 320 << 10
	// deepMaxGroups is the most groups a launch takes: the dense tier's
	// batch, 128 frames, 40 MiB of scratch on the GPU.
	deepMaxGroups = 32
	// deepKernel is zstd_deep.cu's kernel.
	deepKernel = "gz_zstd_deep"
)

// DeepGroups compresses groups as the dense tier stores them on the CPU,
// frames of 4 pages of one block each, with an optimal parse
// (kernels/zstd_deep.cu) that comes within 2 % of libzstd level 19's
// ratio on the same frames: the effort the CPU cannot afford, on pages
// that have gone idle, while the GPU is otherwise idle. It shares the
// Backend's bays, LZ4 decoder and batches; its scratch is its own, for
// one launch at a time. The daemon's dense tier takes it where its kernel
// loads (bench/results/dense-deep-gpu-h100-2026-12-06.md).
type DeepGroups struct {
	g   *Backend
	mod module
	f   function
	// compiled is whether the kernel came compiled ahead
	// (Config.DeepImage), not from its PTX compiled here.
	compiled bool

	mu sync.Mutex // one launch at a time: the scratch is one
	// lost is set when a launch overran its deadline: its kernel may
	// still be writing the scratch, so no other may start.
	lost               bool
	dScratch, dEntries devicePtr
	dLens              devicePtr
	// host is pinned: the entries go up from it, and the frames'
	// offsets (written over the entries) and lengths come back to it.
	host            []byte
	hEntries, hLens []uint32
	frames          int
}

// DeepGroups returns the backend's high-effort group compressor, finding
// its kernel and allocating its scratch on the first call. Backend.Close
// frees it.
func (g *Backend) DeepGroups() (*DeepGroups, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.deep != nil {
		return g.deep, nil
	}
	d := &DeepGroups{g: g, frames: min(deepMaxGroups, g.cfg.MaxBatchPages/codec.GroupPages) * codec.GroupPages / deepFramePages}
	if d.frames == 0 {
		return nil, fmt.Errorf("gpu: batches of %d pages hold no group", g.cfg.MaxBatchPages)
	}
	if err := d.open(); err != nil {
		d.free()
		return nil, fmt.Errorf("gpu: the dense tier's kernel (gz_zstd_deep): %w", err)
	}
	g.deep = d
	return d, nil
}

func (d *DeepGroups) open() error {
	dr := d.g.dr
	var err error
	if d.mod, err = d.load(); err != nil {
		return err
	}
	if d.f, err = dr.function(d.mod, deepKernel); err != nil {
		return err
	}
	for _, a := range []struct {
		p *devicePtr
		n int
	}{{&d.dScratch, d.frames * deepScratchBytes}, {&d.dEntries, 4 * d.frames}, {&d.dLens, 4 * d.frames}} {
		if *a.p, err = dr.memAlloc(a.n); err != nil {
			return fmt.Errorf("%d bytes of device memory: %w", a.n, err)
		}
	}
	if d.host, err = dr.hostAlloc(2 * 4 * d.frames); err != nil {
		return err
	}
	words := unsafe.Slice((*uint32)(unsafe.Pointer(&d.host[0])), 2*d.frames)
	d.hEntries, d.hLens = words[:d.frames], words[d.frames:]
	return nil
}

// load loads the kernel's module: the image compiled ahead
// (Config.DeepImage) where the driver takes it, else the PTX, compiled
// here, which maps the driver's PTX compiler into this process (20 MiB
// locked, and 25-30 MiB more while it compiles: Compile).
func (d *DeepGroups) load() (module, error) {
	dr := d.g.dr
	if img := d.g.cfg.DeepImage; img != nil {
		m, err := dr.loadModule(img)
		if err == nil {
			d.compiled = true
			return m, nil
		}
		d.g.log.Warn("gpu: the GPU refused the dense tier's kernel compiled ahead; compiling it here", "err", err)
	}
	return dr.loadModule(kernels.ZstdDeep)
}

// free frees what open made; the backend's teardown calls it.
func (d *DeepGroups) free() error {
	dr := d.g.dr
	var errs []error
	for _, p := range []devicePtr{d.dScratch, d.dEntries, d.dLens} {
		if p != 0 {
			errs = append(errs, dr.memFree(p))
		}
	}
	if d.host != nil {
		errs = append(errs, dr.hostFree(d.host))
	}
	if d.mod != nil {
		errs = append(errs, dr.unloadModule(d.mod))
	}
	*d = DeepGroups{g: d.g}
	return errors.Join(errs...)
}

// Compiled reports whether the kernel was compiled ahead
// (Config.DeepImage), not in this process.
func (d *DeepGroups) Compiled() bool { return d.compiled }

// NewBatch implements codec.BatchAllocator: the backend's pinned batches.
func (d *DeepGroups) NewBatch(pages int) (*codec.Batch, error) { return d.g.NewBatch(pages) }

// MaxGroups implements codec.GroupCompressor.
func (d *DeepGroups) MaxGroups() int { return d.frames * deepFramePages / codec.GroupPages }

// FramePages implements codec.GroupCompressor: frames of 4 pages, one
// block each, as the CPU's dense tier writes them.
func (d *DeepGroups) FramePages() int { return deepFramePages }

// Decodes implements codec.GroupCompressor: as the Backend.
func (d *DeepGroups) Decodes(c string) bool { return d.g.Decodes(c) }

// CompressGroups implements codec.GroupCompressor. The frames are packed
// at the start of b.Out (16-byte aligned offsets). When it returns an
// error the GPU may still be working, and may still write b.Out.
func (d *DeepGroups) CompressGroups(ctx context.Context, b *codec.Batch, pp codec.Packed) error {
	g := d.g
	packed, err := checkGroups(b, pp, d.MaxGroups())
	if err != nil || b.N == 0 {
		return err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.lost {
		return fmt.Errorf("gpu: an earlier batch of groups overran its deadline and may still use the scratch")
	}
	s, err := g.acquire(ctx)
	if err != nil {
		return err
	}
	defer g.release(s)
	dst := b.Out
	if !g.ownsPinned(b.Out) {
		if dst, err = g.bounce(s); err != nil {
			return err
		}
	}
	n, frames := b.N, b.N/deepFramePages
	total, err := d.launch(ctx, s, b, packed, pp, dst)
	if err != nil {
		return err
	}
	if &dst[0] != &b.Out[0] {
		copy(b.Out[:total], dst[:total])
	}
	offs := d.hEntries[:frames]
	for f, l := range d.hLens[:frames] {
		if o := offs[f]; l >= deepFramePages*codec.PageSize || (l > 0 && (o%16 != 0 || uint64(o)+uint64(l) > uint64(total))) {
			return fmt.Errorf("gpu: frame %d: device returned length %d at offset %d of %d packed bytes", f, l, o, total)
		}
	}
	for f, l := range d.hLens[:frames] {
		b.Offsets[f], b.Lens[f] = offs[f], l
		if l == 0 && offs[f] != codec.GroupNotSmaller {
			b.Offsets[f] = 0
		}
	}
	// A frame with a page that did not decode is not compressed.
	if packed > 0 {
		status := g.metaHost(s, metaStatus, n)
		for i, l := range pp.Lens[:n] {
			if l != 0 && status[i] != 0 {
				b.Offsets[i/deepFramePages], b.Lens[i/deepFramePages] = 0, 0
			}
		}
	}
	return nil
}

// launch queues on s the batch's pages going up, its pages given as
// stored decoded (packed bytes of b.Out), gz_zstd_deep a warp a frame, and
// the frames coming back into dst, and waits for them. It returns the
// frames' packed bytes.
func (d *DeepGroups) launch(ctx context.Context, s *bay, b *codec.Batch, packed int, pp codec.Packed, dst []byte) (int, error) {
	dr, n := d.g.dr, b.N
	frames := n / deepFramePages
	if err := dr.memset32(s.dMeta, 0, 1, s.stream); err != nil {
		return 0, err
	}
	if err := dr.htod(s.dPages, b.Pages[:n*codec.PageSize], s.stream); err != nil {
		return 0, err
	}
	if packed > 0 {
		if err := d.g.decodePages(s, b.Out[:packed], pp.Codec, pp.Offsets[:n], pp.Lens[:n]); err != nil {
			return 0, err
		}
	}
	for f := range frames {
		d.hEntries[f] = uint32(f*deepFramePages)<<8 | deepFramePages
	}
	if err := dr.htod(d.dEntries, bytesOf(d.hEntries[:frames]), s.stream); err != nil {
		return 0, err
	}
	if err := dr.launchCompress(d.f, frames, 32, s.stream, s.dPages, frames, d.dScratch, s.dPacked, s.dMeta, d.dEntries, d.dLens); err != nil {
		return 0, fmt.Errorf("gz_zstd_deep: %w", err)
	}
	for _, c := range []struct {
		dst []byte
		src devicePtr
	}{{s.hMetaBytes[:4], s.dMeta}, {bytesOf(d.hEntries[:frames]), d.dEntries}, {bytesOf(d.hLens[:frames]), d.dLens}, {dst[:n*codec.PageSize], s.dPacked}} {
		if err := dr.dtoh(c.dst, c.src, s.stream); err != nil {
			return 0, err
		}
	}
	if err := d.g.wait(ctx, s); err != nil {
		if s.pending != nil {
			d.lost = true
		}
		return 0, err
	}
	// The frames, each under 16 KiB and padded to 16 bytes, may pass
	// the batch's pages only where many barely compress.
	total := int(s.hMeta[0])
	if total > n*codec.PageSize {
		return 0, fmt.Errorf("gpu: device reported %d packed bytes for %d pages", total, n)
	}
	return total, nil
}
