//go:build gpu

package gpu

import (
	"bytes"
	"context"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/gzramd/gzramd/internal/batchtest"
	"github.com/gzramd/gzramd/internal/testneeds"
	"github.com/gzramd/gzramd/pkg/codec"
)

// TestGPUDecodesZstdPages decodes zstd pages on the GPU
// (gz_zstd_decompress): the corpus's pages as libzstd writes them at
// levels from -7 to 19, and as the GPU's zstd kernels write them, each
// page decoded to its bytes, and the GPU's time and this process's CPU per
// GB reported.
func TestGPUDecodesZstdPages(t *testing.T) {
	pages := testneeds.CorpusOr(t, "")
	if pages == nil {
		pages = batchtest.Pages(4096, 7) // made-up pages where there is no corpus
	}
	g := openZstd(t, testConfig(t))
	per := g.MaxBatchPages()
	b, err := g.NewBatch(per)
	if err != nil {
		t.Fatal(err)
	}
	for _, level := range []int{-7, -1, 1, 3, 9, 19, 0} {
		var z *codec.Zstd
		name := "gpu"
		if level != 0 {
			if z, err = codec.NewZstd(level); err != nil {
				t.Fatal(err)
			}
			name = "libzstd level " + strconv.Itoa(level)
		}
		var decoded int
		var wall time.Duration
		cpu0 := cpuSeconds()
		for lo := 0; lo < len(pages)/codec.PageSize; lo += per {
			in := pages[lo*codec.PageSize : min(lo+per, len(pages)/codec.PageSize)*codec.PageSize]
			n := len(in) / codec.PageSize
			copy(b.Pages, in)
			b.N = n
			if z == nil {
				if err := g.CompressBatch(context.Background(), b); err != nil {
					t.Fatal(err)
				}
			} else {
				at := 0
				for i := range n {
					l := z.Compress(b.Out[at:at+codec.PageSize-1], in[i*codec.PageSize:(i+1)*codec.PageSize])
					b.Offsets[i], b.Lens[i] = uint32(at), uint32(l)
					at += l
				}
			}
			for i := range b.Pages[:n*codec.PageSize] {
				b.Pages[i] = 0x5A
			}
			start := time.Now()
			if err := g.DecompressBatch(context.Background(), b); err != nil {
				t.Fatalf("%s: pages %d..%d: %v", name, lo, lo+n, err)
			}
			wall += time.Since(start)
			for i := range n {
				if b.Lens[i] == 0 {
					continue
				}
				decoded++
				if !bytes.Equal(b.Page(i), in[i*codec.PageSize:(i+1)*codec.PageSize]) {
					t.Fatalf("%s: page %d decodes to other bytes", name, lo+i)
				}
			}
		}
		gb := float64(decoded) * codec.PageSize / 1e9
		t.Logf("%s: %d pages decoded on the GPU, %.0f MB/s (batches of %d, with the copies), %.2f CPU-s per GB of this process",
			name, decoded, gb*1e3/wall.Seconds(), per, (cpuSeconds()-cpu0)/gb)
	}
}

// TestGPUZstdDecodeRejectsCorrupt: zstd pages cut short or with a byte
// changed decode with status 1, never to a page (ErrCorrupt).
func TestGPUZstdDecodeRejectsCorrupt(t *testing.T) {
	g := openZstd(t, testConfig(t))
	pages := batchtest.Pages(64, 11)
	for _, damage := range []string{"cut", "flip"} {
		b := batchtest.BatchOf(pages)
		if err := g.CompressBatch(context.Background(), b); err != nil {
			t.Fatal(err)
		}
		for i := range b.N {
			switch l := b.Lens[i]; {
			case l <= 1:
			case damage == "cut":
				b.Lens[i]--
			default:
				b.Out[b.Offsets[i]+l/2] ^= 0x81
			}
		}
		err := g.DecompressBatch(context.Background(), b)
		if damage == "cut" && !errors.Is(err, codec.ErrCorrupt) {
			t.Fatalf("zstd pages cut short: %v, want ErrCorrupt", err)
		}
		// A changed byte may still make a frame of 4096 bytes (in its
		// literals, say): what must not happen is a fault or a hang.
		t.Logf("%s: %v", damage, err)
	}
}
