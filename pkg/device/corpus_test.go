package device

import (
	"bytes"
	"context"
	"math/rand/v2"
	"syscall"
	"testing"
	"time"

	"github.com/gzramd/gzramd/internal/testneeds"
	"github.com/gzramd/gzramd/pkg/codec"
	"github.com/gzramd/gzramd/pkg/dense"
	"github.com/gzramd/gzramd/pkg/pagestore"
)

// TestCorpusEffectiveRatio writes the shared corpus through the device and
// checks what zram users look at: orig_data_size / mem_used_total must be
// at least 0.95 of the codec's own ratio on the same pages, and the
// metadata per stored page at most 16 bytes.
func TestCorpusEffectiveRatio(t *testing.T) {
	data := testneeds.Corpus(t)
	f := newDevice(t, int64(len(data)), 0)
	ctx := context.Background()
	for off := 0; off < len(data); off += 64 * pageSize {
		end := min(off+64*pageSize, len(data))
		if err := f.dev.WriteAt(ctx, data[off:end], int64(off), false); err != nil {
			t.Fatal(err)
		}
	}
	f.settle(t) // staged pages count as raw until their batch is stored
	// The codec's own ratio over the pages the device stores as objects
	// (same-filled pages cost neither side anything), counting pages that
	// do not shrink as raw, as the device does.
	lz := codec.NewLZ4()
	dst := make([]byte, pageSize)
	var orig, comp int64
	for off := 0; off < len(data); off += pageSize {
		p := data[off : off+pageSize]
		if _, same := fillWord(p); same {
			continue
		}
		n := lz.Compress(dst[:pageSize-1], p)
		if n == 0 || n >= DefaultHugeThreshold {
			n = pageSize
		}
		orig += pageSize
		comp += int64(n)
	}
	st := f.dev.Stats()
	if st.OrigDataSize != orig {
		t.Fatalf("orig_data_size %d, want %d", st.OrigDataSize, orig)
	}
	codecRatio := float64(orig) / float64(comp)
	effRatio := float64(st.OrigDataSize) / float64(st.MemUsedTotal)
	meta := float64(int64(len(f.dev.table))*8+f.store.Stats().MetadataBytes) / float64(st.StoredPages)
	t.Logf("codec ratio %.3f, effective ratio %.3f (%.3f of the codec's), %d same pages, %d huge, %.1f metadata bytes per stored page; whole corpus / mem_used %.3f",
		codecRatio, effRatio, effRatio/codecRatio, st.SamePages, st.HugePages, meta, float64(len(data))/float64(st.MemUsedTotal))
	if effRatio < 0.95*codecRatio {
		t.Errorf("effective ratio %.3f below 0.95 × codec ratio %.3f", effRatio, codecRatio)
	}
	if meta > 16 {
		t.Errorf("%.1f metadata bytes per stored page, want at most 16", meta)
	}
	got := make([]byte, len(data))
	if err := f.dev.ReadAt(ctx, got, 0); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, data) {
		t.Fatal("corpus read back differs")
	}
}

func TestCompactorRunsWhenFragmented(t *testing.T) {
	const pages = 4096
	f := newDevice(t, pages*pageSize, 0)
	ctx := context.Background()
	p := make([]byte, pages*pageSize)
	for i := range p {
		p[i] = byte(i/61) ^ byte(i/pageSize*7)
	}
	if err := f.dev.WriteAt(ctx, p, 0, false); err != nil {
		t.Fatal(err)
	}
	for pg := 0; pg < pages; pg++ {
		if pg%8 != 0 {
			if err := f.dev.Trim(ctx, int64(pg)*pageSize, pageSize); err != nil {
				t.Fatal(err)
			}
		}
	}
	before := f.dev.Stats().MemUsedTotal
	cctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		f.dev.RunCompactor(cctx, CompactPolicy{Interval: time.Millisecond, MinWaste: 1})
		close(done)
	}()
	deadline := time.Now().Add(10 * time.Second)
	for f.dev.Stats().PagesCompacted == 0 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	cancel()
	<-done
	if st := f.dev.Stats(); st.PagesCompacted == 0 || st.MemUsedTotal >= before {
		t.Fatalf("compactor did not run: pages_compacted %d, mem_used %d -> %d", st.PagesCompacted, before, st.MemUsedTotal)
	}
}

// TestCorpusRatioByObjectPages writes the shared corpus on the CPU path in
// writes of 32 pages, as the kernel swaps clusters out, with each write's
// pages kept in objects of 1 to 16 pages, and reports what zram users look
// at: the whole corpus over mem_used_total. Objects of 4 pages must store
// at least 5% more than pages on their own; every page reads back.
func TestCorpusRatioByObjectPages(t *testing.T) {
	data := testneeds.Corpus(t)
	for _, alg := range []string{"lz4", "zstd"} {
		ratiosByObjectPages(t, data, alg)
	}
}

// ratiosByObjectPages writes data in writes of 32 pages to devices of
// codec alg (zstd at level 1) with objects of 1 to 16 pages, reads it
// back page by page, and logs what each stored and how fast it went.
func ratiosByObjectPages(t *testing.T, data []byte, alg string) {
	ctx := context.Background()
	ratios := map[int]float64{}
	for _, per := range []int{1, 4, 8, 16} {
		f := newDeviceWith(t, int64(len(data)), pagestore.Config{}, pathInline, func(c *Config) {
			c.ObjectPages = per
			if alg == "zstd" {
				z, err := codec.NewZstd(1)
				if err != nil {
					t.Fatal(err)
				}
				c.Codec = z
			}
		})
		start := time.Now()
		for off := 0; off < len(data); off += 32 * pageSize {
			end := min(off+32*pageSize, len(data))
			if err := f.dev.WriteAt(ctx, data[off:end], int64(off), false); err != nil {
				t.Fatal(err)
			}
		}
		took := time.Since(start)
		st := f.dev.Stats()
		ratios[per] = float64(len(data)) / float64(st.MemUsedTotal)
		got := make([]byte, len(data))
		start = time.Now()
		for off := 0; off < len(data); off += pageSize {
			if err := f.dev.ReadAt(ctx, got[off:off+pageSize], int64(off)); err != nil {
				t.Fatal(err)
			}
		}
		readPages := time.Since(start)
		if !bytes.Equal(got, data) {
			t.Fatalf("objects of %d pages: corpus read back differs", per)
		}
		t.Logf("%s, objects of up to %2d pages: whole corpus / mem_used %.3f (%.3f of single pages'); %d of %d stored pages in %d objects; writes %.0f MB/s, 4 KiB reads %.0f MB/s",
			alg, per, ratios[per], ratios[per]/ratios[1], st.PackedPages, st.StoredPages, st.PackedObjects,
			float64(len(data))/took.Seconds()/1e6, float64(len(data))/readPages.Seconds()/1e6)
		f.dev.Close()
		f.store.Close()
	}
	if ratios[4] < 1.05*ratios[1] {
		t.Errorf("%s: objects of 4 pages store %.3f, pages alone %.3f: want 5%% more", alg, ratios[4], ratios[1])
	}
}

// TestCorpusRatioAfterAging writes the shared corpus on the CPU path in
// writes of 32 pages, lets every group age into the dense tier, compacts
// the store, and reports the whole corpus over mem_used_total before and
// after, what the recompression cost, and random 4 KiB reads from the
// dense tier. After aging the device must store at least 1.35 times what
// it stored with LZ4 pages alone before (the CPU target is 1.3
// times zram's lzo-rle, which stores about as much as those: 2.402 and
// 2.359 on this corpus); every page reads back.
func TestCorpusRatioAfterAging(t *testing.T) {
	data := testneeds.Corpus(t)
	for _, tc := range []struct {
		name        string
		objectPages int
	}{{"lz4 pages alone", 1}, {"lz4 objects of 4", 4}} {
		r := ageCorpus(t, tc.name, data, tc.objectPages, nil, nil)
		if r.after < 1.35*r.before && tc.objectPages == 1 {
			t.Errorf("%s: %.3f after aging, %.3f before: want 1.35 times", tc.name, r.after, r.before)
		}
	}
}

// TestCorpusRatioAfterAgingOnAGroupCompressor ages the corpus through the
// GPU's path (Tier.flushGPU) with a group compressor on the CPU standing in
// for the GPU, frames of 4 pages. The groups it finds not smaller are kept
// in long-lived slabs, as the CPU's path keeps them, so that the ratio
// before compacting is within 1 % of after (ageCorpus checks it).
func TestCorpusRatioAfterAgingOnAGroupCompressor(t *testing.T) {
	data := testneeds.Corpus(t)
	r := ageCorpus(t, "lz4 pages on a group compressor", data, 1, nil, func(d *Device) {
		gc := newCPUGroups(t, 32)
		gc.framePages = dense.FramePages
		if err := d.SetDenseGPU(gc); err != nil {
			t.Fatal(err)
		}
	})
	if r.st.Dense.OnGPU == 0 || r.st.Dense.Kept == 0 {
		t.Fatalf("%d groups through the group compressor, %d kept: the test needs both", r.st.Dense.OnGPU, r.st.Dense.Kept)
	}
}

// aged is what ageCorpus measured: the ratio before and after aging, the
// process's CPU time while the tier worked, and the device's stats after.
type aged struct {
	before, after float64
	uncompacted   float64 // after aging, before Compact
	moved         int     // allocations Compact moved
	cpu           time.Duration
	st            Stats
	cachedFrames  uint64 // frames readahead windows took from the cache
}

// ageCorpus writes data to a device of LZ4 pages, or of pageCodec's where it is not
// nil (objects of objectPages),
// given to setup first when it is not nil, ages it into the dense tier,
// compacts it, reads every page back in random order and then in
// readahead windows, and logs and
// returns what it measured.
func ageCorpus(t *testing.T, name string, data []byte, objectPages int, pageCodec codec.Codec, setup func(*Device)) aged {
	t.Helper()
	ctx := context.Background()
	f := newDeviceWith(t, int64(len(data)), pagestore.Config{}, pathInline, func(c *Config) {
		c.ObjectPages = objectPages
		c.Dense = DenseConfig{After: time.Millisecond, CPU: 1}
		if pageCodec != nil {
			c.Codec = pageCodec
		}
	})
	defer f.store.Close()
	defer f.dev.Close()
	if setup != nil {
		setup(f.dev)
	}
	for off := 0; off < len(data); off += 32 * pageSize {
		end := min(off+32*pageSize, len(data))
		if err := f.dev.WriteAt(ctx, data[off:end], int64(off), false); err != nil {
			t.Fatal(err)
		}
	}
	r := aged{before: float64(len(data)) / float64(f.dev.Stats().MemUsedTotal)}
	dctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	start, cpu0 := time.Now(), processCPU(t)
	go func() {
		f.dev.RunDense(dctx)
		close(done)
	}()
	for !f.dev.dense.Settled() {
		if time.Since(start) > time.Minute {
			t.Fatal("the dense tier has not settled every group in a minute")
		}
		time.Sleep(10 * time.Millisecond)
	}
	r.cpu = processCPU(t) - cpu0
	settled := time.Since(start)
	cancel()
	<-done
	r.uncompacted = float64(len(data)) / float64(f.dev.Stats().MemUsedTotal)
	for n := f.dev.Compact(); n > 0; n = f.dev.Compact() {
		r.moved += n
	}
	r.st = f.dev.Stats()
	r.after = float64(len(data)) / float64(r.st.MemUsedTotal)
	// What a pass leaves goes back with the pass, not with the
	// compactor's next look (issue 35: within 1 %).
	if r.uncompacted < 0.99*r.after {
		t.Errorf("%s: %.3f after aging, %.3f once compacted: want within 1 %%", name, r.uncompacted, r.after)
	}
	got := make([]byte, len(data))
	pages := len(data) / pageSize
	order := rand.New(rand.NewPCG(1, 2)).Perm(pages)
	start = time.Now()
	for _, pg := range order {
		off := pg * pageSize
		if err := f.dev.ReadAt(ctx, got[off:off+pageSize], int64(off)); err != nil {
			t.Fatal(err)
		}
	}
	read := time.Since(start)
	if !bytes.Equal(got, data) {
		t.Fatalf("%s: corpus read back differs after aging", name)
	}
	// Again in the kernel's readahead windows, 8 pages from every 8th
	// page but the first three: frames from the cache of decoded ones.
	clear(got)
	const window = 8 * pageSize
	for off := 3 * pageSize; off+window <= len(data); off += window {
		if err := f.dev.ReadAt(ctx, got[off:off+window], int64(off)); err != nil {
			t.Fatal(err)
		}
	}
	if end := 3*pageSize + (len(data)-3*pageSize)/window*window; !bytes.Equal(got[3*pageSize:end], data[3*pageSize:end]) {
		t.Fatalf("%s: corpus read back in readahead windows differs after aging", name)
	}
	// (A GPU that writes a frame a group leaves nothing to cache.)
	r.cachedFrames = f.dev.Stats().DenseFramesCached
	st, ds := r.st, r.st.Dense
	gb := float64(ds.Pages) * pageSize / 1e9
	t.Logf("%s: whole corpus / mem_used %.3f before aging, %.3f after (%.3f before compacting, which moved %d allocations: %.1f %% less; %.3fx; %.3fx zram lzo-rle's 2.402); %d of %d stored pages dense in %d objects (%d bytes); recompressed %d groups (%d kept as they were, %d on a GPU, %d it declined), %.2f CPU-s per GB recompressed (the recompressor's own; the process's %.2f), settled in %.1f s; random 4 KiB reads %.1f µs each; %d frames from the cache in readahead windows",
		name, r.before, r.after, r.uncompacted, r.moved, 100*(1-r.uncompacted/r.after), r.after/r.before, r.after/2.402, st.DensePages, st.StoredPages, st.DenseObjects, st.DenseBytes,
		ds.Groups, ds.Kept, ds.OnGPU, ds.Declined, ds.Busy.Seconds()/gb, r.cpu.Seconds()/gb, settled.Seconds(), float64(read.Microseconds())/float64(pages), r.cachedFrames)
	return r
}

// processCPU is the process's user and system time.
func processCPU(t *testing.T) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		t.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
