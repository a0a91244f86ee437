//go:build gpu

// Objects of several pages compressed as one LZ4 block or zstd frame each
// on a real GPU: every object decodes with the CPU's codec to its pages,
// an LZ4 page alone comes out as gz_lz4_compress makes it, and what
// objects store and cost beside pages alone and the CPU's objects of the
// same pages.

package gpu

import (
	"bytes"
	"context"
	"math/rand/v2"
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
func objectRoundTrip(t *testing.T, c codec.BatchCompressor, b *codec.Batch, pages []byte, objects []uint8, dec codec.Codec) (stored int, wall time.Duration) {
	t.Helper()
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
			if err := dec.Decompress(got[:len(want)], block); err != nil || !bytes.Equal(got[:len(want)], want) {
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
// pages, on an LZ4 and a zstd backend; LZ4 objects of one page are
// gz_lz4_compress's pages byte for byte; and a batch larger than a bay
// is split between objects.
func TestGPUObjects(t *testing.T) {
	data := testneeds.CorpusOr(t, "generated pages instead")
	if data == nil {
		data = edgePages(4096)
	}
	for _, alg := range []string{"lz4", "zstd"} {
		t.Run(alg, func(t *testing.T) { gpuObjects(t, data, alg) })
	}
}

func gpuObjects(t *testing.T, data []byte, alg string) {
	edge := edgePages(16 * 9)
	var g *Backend
	var c codec.Codec
	if alg == "zstd" {
		g = openZstd(t, testConfig(t))
		z, err := codec.NewZstd(1)
		if err != nil {
			t.Fatal(err)
		}
		if err := z.HoldObjects(codec.MaxObjectPages); err != nil {
			t.Fatal(err)
		}
		c = z
	} else {
		g, c = openGPU(t, testConfig(t)), codec.NewLZ4()
	}
	b, err := g.NewBatch(g.cfg.MaxBatchPages)
	if err != nil {
		t.Fatal(err)
	}
	cpu := codec.NewCPUBatch(c, 0)
	cb := codec.NewBatch(g.cfg.MaxBatchPages)
	n := len(data) / codec.PageSize
	pagesAlone, _ := objectRoundTrip(t, g, b, data, nil, c)
	for _, per := range []int{1, 4, 16, 0} {
		objs := objectsOf(n, per)
		objectRoundTrip(t, g, b, edge, objectsOf(len(edge)/codec.PageSize, per), c)
		stored, wall := objectRoundTrip(t, g, b, data, objs, c)
		cpuStored, cpuWall := objectRoundTrip(t, cpu, cb, data, objs, c)
		t.Logf("%s objects of %2d pages (0: mixed): ratio %.3f on the GPU (%.3f pages alone: %.3fx), %.3f on the CPU; %.2f GB/s on the GPU, %.2f on the CPU",
			alg, per, float64(len(data))/float64(stored), float64(len(data))/float64(pagesAlone), float64(pagesAlone)/float64(stored),
			float64(len(data))/float64(cpuStored), float64(len(data))/wall.Seconds()/1e9, float64(len(data))/cpuWall.Seconds()/1e9)
		if per == 1 && alg == "lz4" && stored != pagesAlone {
			t.Errorf("objects of one page stored %d bytes, pages alone %d", stored, pagesAlone)
		}
		if per == 16 && stored >= pagesAlone {
			t.Errorf("objects of 16 pages stored %d bytes, pages alone %d", stored, pagesAlone)
		}
	}
	// A batch of more pages than a bay takes, in parts that keep
	// objects whole.
	cfg := Config{Logger: quiet, MaxBatchPages: 40, Bays: 2}
	small := openGPU(t, cfg)
	if alg == "zstd" {
		small = openZstd(t, cfg)
	}
	objectRoundTrip(t, small, codec.NewBatch(300), data[:300*codec.PageSize], objectsOf(300, 0), c)
	if alg != "lz4" {
		return
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
}

// TestGPUObjectsRefused: a backend refuses objects that do not tile the
// batch.
func TestGPUObjectsRefused(t *testing.T) {
	pages := edgePages(32)
	b := codec.NewBatch(32)
	copy(b.Pages, pages)
	b.N = 32
	for _, g := range []*Backend{openGPU(t, testConfig(t)), openZstd(t, testConfig(t))} {
		for _, objs := range [][]uint8{
			append([]uint8{17}, make([]uint8, 31)...),                 // too large
			append([]uint8{4, 0, 0, 0, 2, 0, 0}, objectsOf(25, 1)...), // a 0 where one starts
			append(objectsOf(30, 1), 4, 0),                            // past the batch
		} {
			b.Objects = objs
			if err := g.CompressBatch(context.Background(), b); err == nil {
				t.Errorf("%s: objects %v: no error", g.cfg.Algorithm, objs[:8])
			}
		}
	}
}
