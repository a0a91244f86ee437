package zstdpage

import (
	"bytes"
	"fmt"
	"runtime"
	"sync"
	"testing"

	"github.com/DataDog/zstd"

	"github.com/gzramd/gzramd/internal/testneeds"
	"github.com/gzramd/gzramd/pkg/codec"
)

func isZero(p []byte) bool {
	for _, b := range p {
		if b != 0 {
			return false
		}
	}
	return true
}

// stored is what a page costs the device: the frame, or the raw page.
func stored(n int) int {
	if n <= 0 || n >= PageSize {
		return PageSize
	}
	return n
}

// parallel runs f over the page indexes [0, n) on every core.
func parallel(n int, f func(lo, hi int)) {
	workers := runtime.GOMAXPROCS(0)
	var wg sync.WaitGroup
	chunk := (n + workers - 1) / workers
	for lo := 0; lo < n; lo += chunk {
		hi := min(lo+chunk, n)
		wg.Add(1)
		go func() {
			defer wg.Done()
			f(lo, hi)
		}()
	}
	wg.Wait()
}

// ratioOf returns total original bytes / total stored bytes over the
// non-zero pages, compressing each with comp (which returns the stored
// size) and checking each result with check (nil: no check).
func ratioOf(t *testing.T, pages []byte, idx []int, comp func(page, buf []byte) int) (float64, error) {
	sizes := make([]int, len(idx))
	var mu sync.Mutex
	var firstErr error
	parallel(len(idx), func(lo, hi int) {
		buf := make([]byte, 2*PageSize)
		for k := lo; k < hi; k++ {
			i := idx[k]
			page := pages[i*PageSize : (i+1)*PageSize]
			n := comp(page, buf)
			if n < 0 {
				mu.Lock()
				if firstErr == nil {
					firstErr = fmt.Errorf("page %d does not round-trip", i)
				}
				mu.Unlock()
				n = PageSize
			}
			sizes[k] = stored(n)
		}
	})
	total := 0
	for _, s := range sizes {
		total += s
	}
	return float64(len(idx)*PageSize) / float64(total), firstErr
}

// zpComp compresses with opts and, when check, decodes with libzstd.
func zpComp(opts Options, check bool) func(page, buf []byte) int {
	return func(page, buf []byte) int {
		n := Compress(buf[:PageSize], page, opts)
		if check && n > 0 {
			got, err := zstd.Decompress(nil, buf[:n])
			if err != nil || !bytes.Equal(got, page) {
				return -1
			}
		}
		return n
	}
}

func zstdComp(level int) func(page, buf []byte) int {
	return func(page, buf []byte) int {
		out, err := zstd.CompressLevel(buf[:0], page, level)
		if err != nil {
			return PageSize
		}
		return len(out)
	}
}

// TestCorpus round-trips every corpus page through libzstd and reports
// the ratio (original / stored bytes, all-zero pages left out on every
// side) of each encoder stage next to libzstd's level 1 and LZ4.
func TestCorpus(t *testing.T) {
	pages := testneeds.Corpus(t)
	var idx []int
	zero := 0
	for i := 0; i < len(pages)/PageSize; i++ {
		if isZero(pages[i*PageSize : (i+1)*PageSize]) {
			zero++
			continue
		}
		idx = append(idx, i)
	}
	if testing.Short() {
		// Every 8th page: a quick check of all workloads.
		var s []int
		for k := 0; k < len(idx); k += 8 {
			s = append(s, idx[k])
		}
		idx = s
	}
	t.Logf("%d pages, %d all-zero left out", len(idx), zero)
	ref, _ := ratioOf(t, pages, idx, zstdComp(1))
	lz := codec.NewLZ4()
	lz4r, _ := ratioOf(t, pages, idx, func(page, buf []byte) int { return lz.Compress(buf[:PageSize-1], page) })
	t.Logf("%-36s ratio %.3f", "libzstd level 1", ref)
	t.Logf("%-36s ratio %.3f", "gzramd LZ4 (pkg/codec)", lz4r)
	var def float64
	for _, st := range stages {
		r, err := ratioOf(t, pages, idx, zpComp(st.opts, true))
		if err != nil {
			t.Errorf("%s: %v", st.name, err)
		}
		t.Logf("%-36s ratio %.3f (%.3f x zstd -1)", st.name, r, r/ref)
		def = r
	}
	if !testing.Short() && def < ref {
		t.Errorf("default ratio %.3f below libzstd level 1's %.3f", def, ref)
	}
	if testing.Short() {
		return
	}
	// With the all-zero pages, each coder storing its own frame for them
	// (the measure of the corpus README: zstd -1 3.502).
	all := make([]int, len(pages)/PageSize)
	for i := range all {
		all[i] = i
	}
	refAll, _ := ratioOf(t, pages, all, zstdComp(1))
	defAll, _ := ratioOf(t, pages, all, zpComp(Options{}, false))
	t.Logf("all %d pages, zero pages included: libzstd level 1 %.3f, defaults %.3f (%.3f x)", len(all), refAll, defAll, defAll/refAll)
	// The match finder's share: faster and slower settings.
	for _, m := range []struct {
		name string
		opts Options
	}{
		{"defaults, greedy, 1 candidate", Options{Depth: 1, Lazy: -1}},
		{"defaults, lazy 1, 4 candidates", Options{Depth: 4, Lazy: 1}},
		{"defaults, min match 3, 64 candidates", Options{MinMatch: 3, Depth: 64}},
	} {
		r, _ := ratioOf(t, pages, idx, zpComp(m.opts, false))
		t.Logf("%-36s ratio %.3f (%.3f x zstd -1)", m.name, r, r/ref)
	}
}

// BenchmarkCompress measures the host C encoder with the default options
// on the corpus (non-zero pages), one page per iteration.
func BenchmarkCompress(b *testing.B) {
	pages := testneeds.Corpus(b)
	var nz []byte
	for i := 0; i < len(pages)/PageSize; i++ {
		if p := pages[i*PageSize : (i+1)*PageSize]; !isZero(p) {
			nz = append(nz, p...)
		}
	}
	const batch = 64
	n := len(nz) / PageSize
	dst := make([]byte, batch*PageSize)
	lens := make([]int32, batch)
	b.SetBytes(PageSize * batch)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		k := (i * batch) % (n - batch)
		CompressPages(dst, nz[k*PageSize:(k+batch)*PageSize], lens, Options{})
	}
}

func BenchmarkZstdLevel1(b *testing.B) {
	pages := testneeds.Corpus(b)
	n := len(pages) / PageSize
	buf := make([]byte, zstd.CompressBound(PageSize))
	ctx := zstd.NewCtx()
	b.SetBytes(PageSize)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		k := i % n
		_, _ = ctx.CompressLevel(buf, pages[k*PageSize:(k+1)*PageSize], 1)
	}
}

// BenchmarkDecode decodes the corpus's non-zero pages with the daemon's
// zstd codec (libzstd), as its reads do: frames from this encoder (the
// GPU's) at the default options and without each entropy stage, and
// frames from libzstd's level 1 (the CPU codec's), so the read cost of
// each encoder's choices can be compared.
func BenchmarkDecode(b *testing.B) {
	pages := testneeds.Corpus(b)
	var nz []byte
	for i := 0; i < len(pages)/PageSize; i++ {
		if p := pages[i*PageSize : (i+1)*PageSize]; !isZero(p) {
			nz = append(nz, p...)
		}
	}
	dec, err := codec.NewZstd(1)
	if err != nil {
		b.Fatal(err)
	}
	for _, e := range []struct {
		name string
		comp func(page, buf []byte) int
	}{
		{"gpu-encoder", zpComp(Options{}, false)},
		{"gpu-encoder-no-fse-tables", zpComp(Options{NoFSETables: true}, false)},
		{"gpu-encoder-no-huffman", zpComp(Options{NoHuffman: true}, false)},
		{"libzstd-1", zstdComp(1)},
	} {
		var frames [][]byte
		var stored int
		buf := make([]byte, 2*PageSize)
		for off := 0; off < len(nz); off += PageSize {
			n := e.comp(nz[off:off+PageSize], buf)
			if n <= 0 || n >= PageSize {
				continue // kept raw: no decoding
			}
			frames = append(frames, append([]byte(nil), buf[:n]...))
			stored += n
		}
		b.Run(e.name, func(b *testing.B) {
			out := make([]byte, PageSize)
			b.SetBytes(PageSize)
			i := 0
			for b.Loop() {
				if err := dec.Decompress(out, frames[i]); err != nil {
					b.Fatal(err)
				}
				if i++; i == len(frames) {
					i = 0
				}
			}
			b.ReportMetric(float64(len(frames)*PageSize)/float64(stored), "ratio")
		})
	}
}
