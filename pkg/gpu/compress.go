// Compressing a batch on the GPU: upload, kernel, the packed result back.

package gpu

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"unsafe"

	"github.com/gzramd/gzramd/pkg/codec"
)

func bytesOf(u []uint32) []byte {
	if len(u) == 0 {
		return nil
	}
	return unsafe.Slice((*byte)(unsafe.Pointer(&u[0])), 4*len(u))
}

// checkBatch checks that b's buffers hold its pages, before any of them
// goes to the GPU.
func checkBatch(b *codec.Batch) error {
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
// read. A batch larger than MaxBatchPages is split into bay-sized parts
// that run concurrently, each packed at the start of its part of b.Out.
// When it returns an error the GPU may still be working on a
// quarantined bay; see NewBatch for what that means for b.Out.
//
// Objects of several pages (b.Objects) are compressed as one LZ4 block
// or one zstd frame (of a block a page) each, as the backend's pages are;
// a zstd object no smaller than its pages gets offset
// codec.GroupNotSmaller.
func (g *Backend) CompressBatch(ctx context.Context, b *codec.Batch) error {
	if err := checkBatch(b); err != nil {
		return err
	}
	if err := b.CheckObjects(); err != nil {
		return fmt.Errorf("gpu: %w", err)
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

// split calls f on b whole when it fits a bay, else on views of b of up
// to MaxBatchPages pages (Out sliced alike), concurrently, none cutting
// an object; first is the index of a part's first page in b.
func (g *Backend) split(b *codec.Batch, f func(part *codec.Batch, first int) error) error {
	n, m := b.N, g.cfg.MaxBatchPages
	if n <= m {
		return f(b, 0)
	}
	var wg sync.WaitGroup
	var errs []error
	var mu sync.Mutex
	for lo := 0; lo < n; {
		hi := min(lo+m, n)
		for hi < n && b.Objects != nil && b.Objects[hi] == 0 && hi > lo+1 {
			hi-- // the object that starts before hi goes to the next part
		}
		part := &codec.Batch{
			Pages:   b.Pages[lo*codec.PageSize : hi*codec.PageSize],
			N:       hi - lo,
			Out:     b.Out[lo*codec.PageSize : hi*codec.PageSize],
			Offsets: b.Offsets[lo:hi],
			Lens:    b.Lens[lo:hi],
			Limit:   b.Limit,
		}
		if b.Objects != nil {
			part.Objects = b.Objects[lo:hi]
		}
		wg.Add(1)
		go func(first int) {
			defer wg.Done()
			if err := f(part, first); err != nil {
				mu.Lock()
				errs = append(errs, err)
				mu.Unlock()
			}
		}(lo)
		lo = hi
	}
	wg.Wait()
	return errors.Join(errs...)
}

// compressPart compresses a batch of at most MaxBatchPages pages.
func (g *Backend) compressPart(ctx context.Context, b *codec.Batch) error {
	if b.N == 0 {
		return nil
	}
	if b.Objects == nil {
		return g.run(ctx, b, b.N, g.launch, codec.PageSize, "page", nil)
	}
	launch := func(s *bay, n int) error { return g.launchObjects(s, b.Objects[:n]) }
	notSmaller := func(s *bay) { g.keepNotSmaller(s, b.N, b.Offsets, b.Lens) }
	if err := g.run(ctx, b, b.N, launch, codec.MaxObjectPages*codec.PageSize, "object", notSmaller); err != nil {
		return err
	}
	// Trust nothing the GPU returned until it is checked: an object
	// within its pages' outputs, nothing for pages within an object.
	for i, p := range b.Objects[:b.N] {
		if l := b.Lens[i]; (p == 0 && l != 0) || (p > 0 && l >= uint32(p)*codec.PageSize) {
			return fmt.Errorf("gpu: object of %d pages at page %d: device returned length %d", p, i, l)
		}
	}
	return nil
}

// keepNotSmaller gives each of the first n results of bay s that has no
// length the offset codec.GroupNotSmaller where the GPU reported that
// (results drops offsets of length 0).
func (g *Backend) keepNotSmaller(s *bay, n int, offsets, lens []uint32) {
	for i, o := range g.metaHost(s, metaOffsets, n) {
		if lens[i] == 0 && o == codec.GroupNotSmaller {
			offsets[i] = o
		}
	}
}

// launchObjects queues on s the compression of the objects of its n pages
// (objects[i] pages from page i on, 0 within one), already on the GPU:
// their sizes go up in the offsets, where the kernels read them before
// the last writes its results.
func (g *Backend) launchObjects(s *bay, objects []uint8) error {
	n := len(objects)
	dOffs, dLens := g.metaOn(s, metaOffsets), g.metaOn(s, metaLens)
	hOffs := g.metaHost(s, metaOffsets, n)
	for i, p := range objects {
		hOffs[i] = uint32(p)
	}
	if err := g.dr.htod(dOffs, bytesOf(hOffs), s.stream); err != nil {
		return err
	}
	for _, k := range g.objects {
		per := max(k.pagesPerBlock, 1)
		if err := g.dr.launchCompress(k.f, (n+per-1)/per, 32*per, s.stream, s.dPages, n,
			s.dScratch, s.dPacked, s.dMeta, dOffs, dLens); err != nil {
			return fmt.Errorf("%s: %w", k.name, err)
		}
	}
	return nil
}

// run compresses b's pages on a bay with the kernels launch queues, and
// gives b its results first ones: pages or groups, each shorter than
// limit; then after, when not nil, runs with the bay still held.
func (g *Backend) run(ctx context.Context, b *codec.Batch, results int, launch func(*bay, int) error, limit int, what string,
	after func(*bay)) error {
	s, err := g.acquire(ctx)
	if err != nil {
		return err
	}
	defer g.release(s)
	direct := g.ownsPinned(b.Out)
	dst := b.Out
	if !direct {
		if dst, err = g.bounce(s); err != nil {
			return err
		}
	}
	total, err := g.compress(ctx, s, b.Pages[:b.N*codec.PageSize], b.N, results, launch, dst)
	if err != nil {
		return err
	}
	if !direct {
		copy(b.Out[:total], dst[:total])
	}
	if err := g.results(s, results, limit, total, what, b.Offsets, b.Lens); err != nil {
		return err
	}
	if after != nil {
		after(s)
	}
	return nil
}

// compress runs one batch on bay s: n pages up, the kernels launch
// queues, and the packed bytes back into dst (pinned memory), with the
// offsets and lengths of the first results pages or groups in s.hMeta. It
// returns the packed size.
func (g *Backend) compress(ctx context.Context, s *bay, pages []byte, n, results int, launch func(*bay, int) error, dst []byte) (int, error) {
	dr := g.dr
	if err := dr.memset32(s.dMeta, 0, 1, s.stream); err != nil {
		return 0, err
	}
	if err := dr.htod(s.dPages, pages, s.stream); err != nil {
		return 0, err
	}
	if err := launch(s, n); err != nil {
		return 0, err
	}
	// The header and offsets, then the lengths: one copy each.
	if err := dr.dtoh(s.hMetaBytes[:4*(metaHeaderWords+results)], s.dMeta, s.stream); err != nil {
		return 0, err
	}
	if err := dr.dtoh(bytesOf(g.metaHost(s, metaLens, results)), g.metaOn(s, metaLens), s.stream); err != nil {
		return 0, err
	}
	// The packed bytes come down whole, as many as the pages were, not
	// just the packed size: that is known only once the kernel is done,
	// and a second wait for it costs a waiting thread's wake-up (some
	// hundred microseconds of latency and CPU), where the extra bytes
	// cost the copy engine a few microseconds and the CPU nothing.
	if err := dr.dtoh(dst[:n*codec.PageSize], s.dPacked, s.stream); err != nil {
		return 0, err
	}
	if err := g.wait(ctx, s); err != nil {
		return 0, err
	}
	total := int(s.hMeta[0])
	if total > n*codec.PageSize {
		return 0, fmt.Errorf("gpu: device reported %d packed bytes for %d pages", total, n)
	}
	return total, nil
}

// results checks the offsets and lengths of the first n results of bay
// s, each shorter than limit, against the packed size total, and copies
// them to offsets and lens (offset 0 where the length is).
func (g *Backend) results(s *bay, n, limit, total int, what string, offsets, lens []uint32) error {
	offs, ls := g.metaHost(s, metaOffsets, n), g.metaHost(s, metaLens, n)
	// Trust nothing the GPU returned until it is checked.
	for i := range n {
		l, o := ls[i], offs[i]
		if l >= uint32(limit) || (l > 0 && (o%16 != 0 || uint64(o)+uint64(l) > uint64(total))) {
			return fmt.Errorf("gpu: %s %d: device returned length %d at offset %d of %d packed bytes", what, i, l, o, total)
		}
	}
	for i := range n {
		lens[i] = ls[i]
		if ls[i] == 0 {
			offsets[i] = 0
		} else {
			offsets[i] = offs[i]
		}
	}
	return nil
}

// launch queues the batch's kernels on s for its n pages, already on the
// device.
func (g *Backend) launch(s *bay, n int) error {
	offs, lens := g.metaOn(s, metaOffsets), g.metaOn(s, metaLens)
	for _, k := range g.kernels {
		grid := (n + k.pagesPerBlock - 1) / k.pagesPerBlock
		if err := g.dr.launchCompress(k.f, grid, 32*k.pagesPerBlock, s.stream, s.dPages, n,
			s.dScratch, s.dPacked, s.dMeta, offs, lens); err != nil {
			return fmt.Errorf("%s: %w", k.name, err)
		}
	}
	return nil
}
