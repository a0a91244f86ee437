// Compressing groups of pages, each as one zstd frame, for the dense tier.

package gpu

import (
	"context"
	"fmt"

	"github.com/gzramd/gzramd/pkg/codec"
)

// MaxGroups implements codec.GroupCompressor: as many groups as a bay's
// scratch holds (ZW_SCRATCH_PAGE a page).
func (g *Backend) MaxGroups() int {
	scratch := g.cfg.MaxBatchPages * batchKernels[g.cfg.Algorithm].scratchPages
	return min(g.cfg.MaxBatchPages, scratch/groupScratchPages) / codec.GroupPages
}

// FramePages implements codec.GroupCompressor: a group is one frame, of
// a block a page (the page kernels' blocks).
func (g *Backend) FramePages() int { return codec.GroupPages }

// Decodes implements codec.GroupCompressor: LZ4 and zstd pages, whatever
// the backend's algorithm.
func (g *Backend) Decodes(c string) bool {
	_, ok := pageDecoders[c]
	return ok
}

// CompressGroups implements codec.GroupCompressor. The frames are packed
// at the start of b.Out (16-byte aligned offsets). When it returns an
// error the GPU may still be working on a quarantined bay, and may
// still write b.Out.
func (g *Backend) CompressGroups(ctx context.Context, b *codec.Batch, pp codec.Packed) error {
	packed, err := checkGroups(b, pp, g.MaxGroups())
	if err != nil || b.N == 0 {
		return err
	}
	n, groups := b.N, b.N/codec.GroupPages
	launch := g.launchGroups
	if packed > 0 {
		launch = func(s *bay, n int) error {
			if err := g.decodePages(s, b.Out[:packed], pp.Codec, pp.Offsets[:n], pp.Lens[:n]); err != nil {
				return err
			}
			return g.launchGroups(s, n)
		}
	}
	after := func(s *bay) {
		g.keepNotSmaller(s, groups, b.Offsets, b.Lens)
		// A group with a page that did not decode is not compressed.
		status := g.metaHost(s, metaStatus, n)
		for i, l := range pp.Lens[:min(len(pp.Lens), n)] {
			if l != 0 && status[i] != 0 {
				b.Offsets[i/codec.GroupPages], b.Lens[i/codec.GroupPages] = 0, 0
			}
		}
	}
	return g.run(ctx, b, groups, launch, codec.GroupPages*codec.PageSize, "group", after)
}

// checkGroups checks a batch of groups of at most maxGroups groups and its
// pages given as stored (a GroupCompressor's arguments), and returns the
// bytes of b.Out those take.
func checkGroups(b *codec.Batch, pp codec.Packed, maxGroups int) (packed int, err error) {
	if err := checkBatch(b); err != nil {
		return 0, err
	}
	n := b.N
	switch {
	case n%codec.GroupPages != 0 || n/codec.GroupPages > maxGroups:
		return 0, fmt.Errorf("gpu: %d pages are not whole groups of %d, or more than %d groups", n, codec.GroupPages, maxGroups)
	case pp.Lens != nil && (len(pp.Lens) < n || len(pp.Offsets) < n):
		return 0, fmt.Errorf("gpu: stored pages of %d pages given for %d pages", len(pp.Lens), n)
	case pp.Lens != nil && pageDecoders[pp.Codec].name == "":
		return 0, fmt.Errorf("gpu: pages of codec %q given as stored: it decodes lz4 and zstd", pp.Codec)
	}
	// The stored pages, checked as the kernels read them: within b.Out,
	// each shorter than a page.
	for i, l := range pp.Lens[:min(len(pp.Lens), n)] {
		if l == 0 {
			continue
		}
		end := uint64(pp.Offsets[i]) + uint64(l)
		if l >= codec.PageSize || end > uint64(len(b.Out)) {
			return 0, fmt.Errorf("gpu: page %d: a stored page of %d bytes at %d, outside the batch's %d bytes or not smaller than a page", i, l, pp.Offsets[i], len(b.Out))
		}
		packed = max(packed, int(end))
	}
	return packed, nil
}

// decodePages queues on s the decoding of the pages of codec c in packed
// (page i's at offsets[i], lens[i] bytes; none where 0) into their pages
// of the batch on the GPU, and the decoder's status of each page back to
// s.hMeta. The packed pages go up to the GPU's packed output, which the
// kernels of groups write only after.
func (g *Backend) decodePages(s *bay, packed []byte, c string, offsets, lens []uint32) error {
	dr, n := g.dr, len(lens)
	dOffs, dLens, dStatus := g.metaOn(s, metaOffsets), g.metaOn(s, metaLens), g.metaOn(s, metaStatus)
	if err := dr.htod(s.dPacked, packed, s.stream); err != nil {
		return err
	}
	// Offsets and lengths go up from the pinned meta buffer: an upload
	// from pageable memory would stall the stream.
	hOffs, hLens := g.metaHost(s, metaOffsets, n), g.metaHost(s, metaLens, n)
	copy(hOffs, offsets)
	copy(hLens, lens)
	if err := dr.htod(dOffs, bytesOf(hOffs), s.stream); err != nil {
		return err
	}
	if err := dr.htod(dLens, bytesOf(hLens), s.stream); err != nil {
		return err
	}
	k := g.decoders[c]
	grid := (n + k.pagesPerBlock - 1) / k.pagesPerBlock
	if err := dr.launchDecompress(k.f, grid, 32*k.pagesPerBlock, s.stream, s.dPacked, dOffs, dLens, n, s.dPages, dStatus); err != nil {
		return fmt.Errorf("%s: %w", k.name, err)
	}
	return dr.dtoh(bytesOf(g.metaHost(s, metaStatus, n)), dStatus, s.stream)
}

// launchGroups queues the kernels of groups on s for its n pages, already
// on the GPU: gz_zstd_encode_blocks a warp a page, the others a warp a
// group.
func (g *Backend) launchGroups(s *bay, n int) error {
	offs, lens := g.metaOn(s, metaOffsets), g.metaOn(s, metaLens)
	for i, k := range g.groups {
		grid := n / codec.GroupPages
		if i == 1 {
			grid = n
		}
		if err := g.dr.launchCompress(k.f, grid, 32, s.stream, s.dPages, n, s.dScratch, s.dPacked, s.dMeta, offs, lens); err != nil {
			return fmt.Errorf("%s: %w", k.name, err)
		}
	}
	return nil
}
