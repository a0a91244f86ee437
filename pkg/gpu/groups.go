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

// CompressGroups implements codec.GroupCompressor. The frames are packed
// at the start of b.Out (16-byte aligned offsets). When it returns an
// error the GPU may still be working on a quarantined bay, and may
// still write b.Out.
func (g *Backend) CompressGroups(ctx context.Context, b *codec.Batch, lz4Offsets, lz4Lens []uint32) error {
	packed, err := checkGroups(b, lz4Offsets, lz4Lens, g.MaxGroups())
	if err != nil || b.N == 0 {
		return err
	}
	n, groups := b.N, b.N/codec.GroupPages
	launch := g.launchGroups
	if packed > 0 {
		launch = func(s *bay, n int) error {
			if err := g.decodeLZ4(s, b.Out[:packed], lz4Offsets[:n], lz4Lens[:n]); err != nil {
				return err
			}
			return g.launchGroups(s, n)
		}
	}
	after := func(s *bay) {
		g.keepNotSmaller(s, groups, b.Offsets, b.Lens)
		// A group with a page that did not decode is not compressed.
		status := g.metaHost(s, metaStatus, n)
		for i, l := range lz4Lens[:min(len(lz4Lens), n)] {
			if l != 0 && status[i] != 0 {
				b.Offsets[i/codec.GroupPages], b.Lens[i/codec.GroupPages] = 0, 0
			}
		}
	}
	return g.run(ctx, b, groups, launch, codec.GroupPages*codec.PageSize, "group", after)
}

// checkGroups checks a batch of groups of at most maxGroups groups and its LZ4
// blocks (a GroupCompressor's arguments), and returns the bytes of b.Out
// the blocks take.
func checkGroups(b *codec.Batch, lz4Offsets, lz4Lens []uint32, maxGroups int) (packed int, err error) {
	if err := checkBatch(b); err != nil {
		return 0, err
	}
	n := b.N
	switch {
	case n%codec.GroupPages != 0 || n/codec.GroupPages > maxGroups:
		return 0, fmt.Errorf("gpu: %d pages are not whole groups of %d, or more than %d groups", n, codec.GroupPages, maxGroups)
	case lz4Lens != nil && (len(lz4Lens) < n || len(lz4Offsets) < n):
		return 0, fmt.Errorf("gpu: LZ4 blocks of %d pages given for %d pages", len(lz4Lens), n)
	}
	// The LZ4 blocks, checked as the kernel reads them: within b.Out,
	// each shorter than a page.
	for i, l := range lz4Lens[:min(len(lz4Lens), n)] {
		if l == 0 {
			continue
		}
		end := uint64(lz4Offsets[i]) + uint64(l)
		if l >= codec.PageSize || end > uint64(len(b.Out)) {
			return 0, fmt.Errorf("gpu: page %d: an LZ4 block of %d bytes at %d, outside the batch's %d bytes", i, l, lz4Offsets[i], len(b.Out))
		}
		packed = max(packed, int(end))
	}
	return packed, nil
}

// decodeLZ4 queues on s the decoding of the LZ4 blocks in packed (page i's
// at offsets[i], lens[i] bytes; none where 0) into their pages of the
// batch on the GPU, and the decoder's status of each page back to
// s.hMeta. The packed blocks go up to the GPU's packed output, which
// the kernels of groups write only after.
func (g *Backend) decodeLZ4(s *bay, packed []byte, offsets, lens []uint32) error {
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
	grid := (n + lz4DecodeWarps - 1) / lz4DecodeWarps
	if err := dr.launchDecompress(g.lz4Decode, grid, 32*lz4DecodeWarps, s.stream, s.dPacked, dOffs, dLens, n, s.dPages, dStatus); err != nil {
		return fmt.Errorf("gz_lz4_decompress: %w", err)
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
