//go:build gpu

// Decoding a batch on the GPU: the tests' round trip against liblz4 and
// libzstd (the daemon decodes on the GPU only the pages of groups it
// recompresses).

package gpu

import (
	"context"
	"fmt"

	"github.com/gzramd/gzramd/pkg/codec"
)

// DecompressBatch decodes the compressed pages of b, in the backend's
// algorithm (b.Out at b.Offsets,
// b.Lens; as CompressBatch or the CPU codec left them) into b.Pages. Pages
// with length 0 (stored raw) are left untouched. Malformed pages make it
// return an error wrapping codec.ErrCorrupt; the other pages are decoded,
// and the content of the malformed ones is undefined. A batch larger than
// MaxBatchPages is decoded in bay-sized parts, concurrently; each part's
// compressed bytes must span at most MaxBatchPages pages of b.Out (as they
// do when CompressBatch or the CPU codec wrote them).
func (g *Backend) DecompressBatch(ctx context.Context, b *codec.Batch) error {
	if err := checkBatch(b); err != nil {
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
		return fmt.Errorf("gpu: compressed pages span %d bytes, more than a bay holds", hi-lo)
	}
	s, err := g.acquire(ctx)
	if err != nil {
		return err
	}
	defer g.release(s)
	// Decoded pages come down by DMA straight into b.Pages when it is
	// pinned and every page is compressed (the GPU has no copy of a
	// raw page to write back); otherwise through the bay's buffer.
	direct := g.ownsPinned(b.Pages)
	for i := 0; i < n && direct; i++ {
		direct = b.Lens[i] != 0
	}
	dst := b.Pages
	if !direct {
		if dst, err = g.bounce(s); err != nil {
			return err
		}
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
				copy(b.Page(i), dst[i*codec.PageSize:(i+1)*codec.PageSize])
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

// decompress runs one decode batch on s (decodePages, the offsets made
// relative to packed, which starts at base): the decoded pages land in dst
// (pinned memory), and the returned per-page status in s.hMeta.
func (g *Backend) decompress(ctx context.Context, s *bay, packed []byte, base uint32, offsets, lens []uint32, dst []byte) ([]uint32, error) {
	n := len(lens)
	rel := make([]uint32, n)
	for i, o := range offsets {
		if lens[i] != 0 {
			rel[i] = o - base
		}
	}
	if err := g.decodePages(s, packed, g.cfg.Algorithm, rel, lens); err != nil {
		return nil, err
	}
	if err := g.dr.dtoh(dst[:n*codec.PageSize], s.dPages, s.stream); err != nil {
		return nil, err
	}
	if err := g.wait(ctx, s); err != nil {
		return nil, err
	}
	return g.metaHost(s, metaStatus, n), nil
}
