//go:build gpu

package device

import (
	"bytes"
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/gzramd/gzramd/internal/testneeds"
	"github.com/gzramd/gzramd/pkg/codec"
	"github.com/gzramd/gzramd/pkg/gpu"
	"github.com/gzramd/gzramd/pkg/pagestore"
	"github.com/gzramd/gzramd/pkg/route"
	"github.com/gzramd/gzramd/pkg/stage"
)

// TestCorpusAgingOnGPU ages the shared corpus on the CPU and on a GPU
// (its LZ4 backend) in one run, from LZ4 pages and from zstd pages (which
// the GPU decodes itself, as it does LZ4 pages): the ratio after aging,
// what the GPU's frames store beside the CPU's, and the CPU it costs per
// GB recompressed (issues 24 and 35: at most 1.0 CPU-s per GB on the
// GPU).
func TestCorpusAgingOnGPU(t *testing.T) {
	data := testneeds.Corpus(t)
	g, err := gpu.Open(gpu.Config{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	zstdPages, err := codec.NewZstd(1)
	if err != nil {
		t.Fatal(err)
	}
	cpu := ageCorpus(t, "CPU recompression", data, 1, nil, nil)
	onGPU := ageCorpus(t, "GPU recompression", data, 1, nil, func(d *Device) {
		if err := d.SetDenseGPU(g); err != nil {
			t.Fatal(err)
		}
	})
	deep, err := g.DeepGroups()
	if err != nil {
		t.Fatal(err)
	}
	setDeep := func(d *Device) {
		if err := d.SetDenseGPU(deep); err != nil {
			t.Fatal(err)
		}
	}
	onDeep := ageCorpus(t, "GPU recompression, frames of 4 pages (DeepGroups)", data, 1, nil, setDeep)
	cpuZstd := ageCorpus(t, "CPU recompression of zstd pages", data, 1, zstdPages, nil)
	onDeepZstd := ageCorpus(t, "GPU recompression of zstd pages, frames of 4 pages (DeepGroups)", data, 1, zstdPages, setDeep)
	gb := func(r aged) float64 { return float64(r.st.Dense.Pages) * pageSize / 1e9 }
	for _, r := range []struct {
		what   string
		a, cpu aged
	}{{"GPU, a frame a group", onGPU, cpu}, {"GPU, frames of 4 pages", onDeep, cpu}, {"GPU, frames of 4 pages, from zstd pages", onDeepZstd, cpuZstd}} {
		t.Logf("%s against CPU: ratio after aging %.3f against %.3f (%.3fx); process CPU %.2f against %.2f CPU-s per GB recompressed",
			r.what, r.a.after, r.cpu.after, r.a.after/r.cpu.after, r.a.cpu.Seconds()/gb(r.a), r.cpu.cpu.Seconds()/gb(r.cpu))
		if r.a.st.Dense.OnGPU == 0 {
			t.Fatalf("%s: no group was recompressed on the GPU", r.what)
		}
	}
}

// TestCorpusObjectsOnGPU writes the shared corpus in 128 KiB writes to
// devices whose staged writes a GPU compresses (LZ4, and zstd), with pages
// alone and in objects of 4 and 16 pages: what each stores, that the
// objects were the GPU's, and that every page reads back.
func TestCorpusObjectsOnGPU(t *testing.T) {
	data := testneeds.Corpus(t)
	for _, alg := range []string{"lz4", "zstd"} {
		g, err := gpu.Open(gpu.Config{Logger: slog.New(slog.DiscardHandler), Algorithm: alg})
		if err != nil {
			t.Fatal(err)
		}
		var alone float64
		for _, per := range []int{1, 4, 16} {
			ratio := corpusObjectsOnGPU(t, data, g, alg, per, alone)
			if per == 1 {
				alone = ratio
			}
		}
		g.Close()
	}
}

func corpusObjectsOnGPU(t *testing.T, data []byte, g *gpu.Backend, alg string, per int, alone float64) float64 {
	store, err := pagestore.New(pagestore.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	c, err := codec.New(alg)
	if err != nil {
		t.Fatal(err)
	}
	sc := stage.Config{Batches: 8, BatchPages: 1024, Deadline: time.Millisecond, Workers: 4}
	router, err := route.New(route.Config{Codec: c, CPUWorkers: 2, Logger: quiet,
		Accelerator: g, BatchPages: sc.BatchPages, Workers: sc.Workers, MinAcceleratorPages: 1,
		Watchdog: 10 * time.Second, MinBackoff: time.Millisecond, MaxBackoff: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	dev, err := New(Config{Size: int64(len(data)), Codec: c, Store: store, Staging: sc, Logger: quiet,
		Router: router, ObjectPages: per})
	if err != nil {
		t.Fatal(err)
	}
	defer dev.Close()
	ctx := context.Background()
	start := time.Now()
	for off := 0; off < len(data); off += 32 * pageSize {
		end := min(off+32*pageSize, len(data))
		if err := dev.WriteAt(ctx, data[off:end], int64(off), false); err != nil {
			t.Fatal(err)
		}
	}
	if err := dev.Drain(ctx); err != nil {
		t.Fatal(err)
	}
	wall := time.Since(start)
	st, rs := dev.Stats(), router.Stats()
	ratio := float64(len(data)) / float64(st.MemUsedTotal)
	if per == 1 {
		alone = ratio
	}
	t.Logf("%s objects of %2d pages: whole corpus / mem_used %.3f (%.3fx pages alone; %.3fx zram lzo-rle's 2.402); %d of %d stored pages in %d objects; %d pages on the GPU, %d on the CPU (%d inline); written in %v",
		alg, per, ratio, ratio/alone, ratio/2.402, st.PackedPages, st.StoredPages, st.PackedObjects,
		rs.AcceleratorPages, rs.CPUPages, rs.InlinePages, wall.Round(time.Millisecond))
	if per > 1 && (st.PackedObjects == 0 || rs.AcceleratorPages == 0 || rs.Fallbacks != 0) {
		t.Errorf("%s objects of %d pages: %d objects, %d pages on the GPU, %d fallbacks to the CPU", alg, per, st.PackedObjects, rs.AcceleratorPages, rs.Fallbacks)
	}
	got := make([]byte, len(data))
	if err := dev.ReadAt(ctx, got, 0); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, data) {
		t.Fatalf("%s objects of %d pages: the corpus reads back different", alg, per)
	}
	return ratio
}
