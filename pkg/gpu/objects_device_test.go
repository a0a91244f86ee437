//go:build gpu

// Objects of several pages compressed as one LZ4 block each on a real GPU:
// every block decodes with the CPU's LZ4 to its pages, a page alone comes
// out as gz_lz4_compress makes it, and what objects store and cost beside
// pages alone and the CPU's objects of the same pages.

package gpu

import (
	"bytes"
	"context"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/gzramd/gzramd/internal/testneeds"
	"github.com/gzramd/gzramd/pkg/codec"
)

// objectsOf returns objects of per pages over n pages, each starting at a
// multiple of per (per 0: sizes from 1 to 16 at random).
func objectsOf(n, per int) []uint8 {
	r := rand.New(rand.NewPCG(3, uint64(per)))
	objs := make([]uint8, n)
	for i := 0; i < n; {
		p := per
		if per == 0 {
			p = 1 + r.IntN(codec.MaxObjectPages)
		}
		p = min(p, n-i)
		objs[i] = uint8(p)
		i += p
	}
	return objs
}

// objectRoundTrip compresses pages in batches of up to batchPages with
// objects (nil: pages alone), checks that every object decodes to its
// pages, and returns the bytes stored (an object or page without a block
// counted whole) and the time the calls took.
func objectRoundTrip(t *testing.T, c codec.BatchCompressor, b *codec.Batch, pages []byte, objects []uint8) (stored int, wall time.Duration) {
	t.Helper()
	lz4 := codec.NewLZ4()
	n := len(pages) / codec.PageSize
	got := make([]byte, codec.MaxObjectPages*codec.PageSize)
	for lo := 0; lo < n; {
		hi := min(lo+b.Cap(), n)
		for objects != nil && hi < n && objects[hi] == 0 {
			hi--
		}
		in := pages[lo*codec.PageSize : hi*codec.PageSize]
		copy(b.Pages, in)
		b.N, b.Objects = hi-lo, nil
		if objects != nil {
			b.Objects = objects[lo:hi]
		}
		start := time.Now()
		if err := c.CompressBatch(context.Background(), b); err != nil {
			t.Fatalf("pages %d..%d: %v", lo, hi, err)
		}
		wall += time.Since(start)
		for i := 0; i < b.N; {
			p := 1
			if objects != nil {
				p = int(b.Objects[i])
				for j := i + 1; j < i+p; j++ {
					if b.Lens[j] != 0 {
						t.Fatalf("page %d, within an object, has a block of %d bytes", lo+j, b.Lens[j])
					}
				}
			}
			want := in[i*codec.PageSize : (i+p)*codec.PageSize]
			block := b.Compressed(i)
			if block == nil {
				stored += len(want)
				i += p
				continue
			}
			stored += len(block)
			if err := lz4.Decompress(got[:len(want)], block); err != nil || !bytes.Equal(got[:len(want)], want) {
				t.Fatalf("object of %d pages at page %d: its block of %d bytes does not decode to its pages (%v)", p, lo+i, len(block), err)
			}
			i += p
		}
		lo = hi
	}
	return stored, wall
}

// TestGPUObjects: objects of 1, 4 and 16 pages and of mixed sizes, of
// edge pages and of the corpus (or generated pages), decode to their
// pages; objects of one page are gz_lz4_compress's pages byte for byte;
// and a batch larger than a slot is split between objects.
func TestGPUObjects(t *testing.T) {
	data := testneeds.CorpusOr(t, "generated pages instead")
	if data == nil {
		data = edgePages(4096)
	}
	edge := edgePages(16 * 9)
	g := openGPU(t, testConfig(t))
	b, err := g.NewBatch(g.cfg.MaxBatchPages)
	if err != nil {
		t.Fatal(err)
	}
	cpu := codec.NewCPUBatch(codec.NewLZ4(), 0)
	cb := codec.NewBatch(g.cfg.MaxBatchPages)
	n := len(data) / codec.PageSize
	pagesAlone, _ := objectRoundTrip(t, g, b, data, nil)
	for _, per := range []int{1, 4, 16, 0} {
		objs := objectsOf(n, per)
		objectRoundTrip(t, g, b, edge, objectsOf(len(edge)/codec.PageSize, per))
		stored, wall := objectRoundTrip(t, g, b, data, objs)
		cpuStored, cpuWall := objectRoundTrip(t, cpu, cb, data, objs)
		t.Logf("objects of %2d pages (0: mixed): ratio %.3f on the GPU (%.3f pages alone: %.3fx), %.3f on the CPU; %.2f GB/s on the GPU, %.2f on the CPU",
			per, float64(len(data))/float64(stored), float64(len(data))/float64(pagesAlone), float64(pagesAlone)/float64(stored),
			float64(len(data))/float64(cpuStored), float64(len(data))/wall.Seconds()/1e9, float64(len(data))/cpuWall.Seconds()/1e9)
		if per == 1 && stored != pagesAlone {
			t.Errorf("objects of one page stored %d bytes, pages alone %d", stored, pagesAlone)
		}
		if per == 16 && stored >= pagesAlone {
			t.Errorf("objects of 16 pages stored %d bytes, pages alone %d", stored, pagesAlone)
		}
	}

	// Objects of one page are pages, byte for byte.
	m := min(n, b.Cap())
	copy(b.Pages, data[:m*codec.PageSize])
	b.N, b.Objects = m, nil
	if err := g.CompressBatch(context.Background(), b); err != nil {
		t.Fatal(err)
	}
	want := make([][]byte, m)
	for i := range m {
		want[i] = bytes.Clone(b.Compressed(i))
	}
	b.Objects = objectsOf(m, 1)
	if err := g.CompressBatch(context.Background(), b); err != nil {
		t.Fatal(err)
	}
	for i := range m {
		if !bytes.Equal(b.Compressed(i), want[i]) {
			t.Fatalf("page %d: %d bytes as an object of one page, %d alone", i, b.Lens[i], len(want[i]))
		}
	}

	// A batch of more pages than a slot takes, in parts that keep
	// objects whole.
	small := openGPU(t, Config{Logger: quiet, MaxBatchPages: 40, Slots: 2})
	big := codec.NewBatch(300)
	objectRoundTrip(t, small, big, data[:300*codec.PageSize], objectsOf(300, 0))
}

// TestGPUObjectsRefused: a zstd backend refuses objects (its objects would
// be LZ4 blocks), and so does any backend given objects that do not tile
// the batch.
func TestGPUObjectsRefused(t *testing.T) {
	pages := edgePages(32)
	z := openZstd(t, testConfig(t))
	b := codec.NewBatch(32)
	copy(b.Pages, pages)
	b.N, b.Objects = 32, objectsOf(32, 4)
	if err := z.CompressBatch(context.Background(), b); err == nil || !strings.Contains(err.Error(), "LZ4") {
		t.Errorf("zstd backend given objects: %v, want a refusal", err)
	}
	g := openGPU(t, testConfig(t))
	for _, objs := range [][]uint8{
		append([]uint8{17}, make([]uint8, 31)...),                 // too large
		append([]uint8{4, 0, 0, 0, 2, 0, 0}, objectsOf(25, 1)...), // a 0 where one starts
		append(objectsOf(30, 1), 4, 0),                            // past the batch
	} {
		b.Objects = objs
		if err := g.CompressBatch(context.Background(), b); err == nil {
			t.Errorf("objects %v: no error", objs[:8])
		}
	}
}
