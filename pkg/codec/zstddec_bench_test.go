package codec

import (
	"bytes"
	"flag"
	"fmt"
	"math/rand/v2"
	"runtime"
	"slices"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gzramd/gzramd/internal/corpus"
	"github.com/gzramd/gzramd/internal/testneeds"
	"github.com/gzramd/gzramd/internal/zstddeep"
)

var (
	zdReads  = flag.Int("zstddec.reads", 20000, "4 KiB reads timed per subject (and half as many 32 KiB reads)")
	zdRounds = flag.Int("zstddec.rounds", 5, "rounds the reads are spread over, every subject in each")
	zdDeep   = flag.Int("zstddec.deep", 8192, "corpus pages the deep frames are made of (the host build of the GPU's parser is slow)")
)

// TestZstdDecodeReads times reads of the corpus's pages as the tiers
// store them, each decoded with libzstd and with zstddec.c, interleaved
// in rounds, with the fast tier's LZ4 pages for scale; it prints the
// table of bench/results/zstd-decoder-cpu-2026-12-06.md. It runs only
// when asked, for a few minutes:
//
//	GZRAMD_ZSTDDEC_BENCH=1 go test ./pkg/codec -run TestZstdDecodeReads -v -timeout 30m
//
// The method is bench/denseframes's: a read is one call as gzramd's
// device makes it, timed alone on a locked thread; a read the thread was
// switched out in is timed again; p50 and p99 are the medians over the
// rounds; p99 warm is the shorter of two runs again at once.
func TestZstdDecodeReads(t *testing.T) {
	testneeds.Env(t, "GZRAMD_ZSTDDEC_BENCH", "times reads of the corpus with libzstd and zstddec.c (minutes)")
	pages := corpus.StoredPages(testneeds.Corpus(t))
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	out := t.Output()

	dec, err := NewZstdDecoder(1)
	if err != nil {
		t.Fatal(err)
	}
	z1, err := NewZstd(1)
	if err != nil {
		t.Fatal(err)
	}
	lz4 := zdPages(t, pages, NewLZ4())
	zp := zdPages(t, pages, z1)
	l5 := zdFrames(t, pages, 4, 0, 5, dec)
	l19 := zdFrames(t, pages, 4, 0, 19, dec)
	today := zdFrames(t, pages, 16, 16<<10, 3, dec)
	deepPages := pages[:min(len(pages), *zdDeep*PageSize)]
	deep := zdDeepFrames(t, deepPages, dec)

	type subject struct {
		name       string
		p          zdPager
		want       []byte
		own        bool
		ratio      float64
		small, win zdSamples
	}
	var subjects []*subject
	add := func(name string, p zdPager, want []byte, ratio float64, both bool) {
		if both {
			subjects = append(subjects, &subject{name: name + ", libzstd", p: p.withLibzstd(), want: want, ratio: ratio})
		}
		subjects = append(subjects, &subject{name: name + ", zstddec", p: p, want: want, ratio: ratio, own: true})
	}
	subjects = append(subjects, &subject{name: "LZ4 pages (fast tier)", p: lz4, want: pages, ratio: lz4.ratio()})
	// Pages through a ZstdDecoder, which tries zstddec.c (Zstd's own
	// Decompress does not).
	zp.decode, zp.dec = dec.Decompress, dec
	add("zstd -1 pages (fast tier, --algorithm zstd)", zp, pages, zp.ratio(), true)
	add("16 KiB frames, one block, level 5 (dense, CPU)", l5, pages, l5.ratio(), true)
	add("16 KiB frames, one block, level 19", l19, pages, l19.ratio(), true)
	add("16 KiB frames, deep parser (dense, GPU; first pages only)", deep, deepPages, deep.ratio(), true)
	add("64 KiB frames, 16 KiB blocks, level 3 (dense today, CPU)", today, pages, today.ratio(), true)

	fmt.Fprintf(out, "%d pages stored (same-filled ones left out), %d in the deep frames; %d reads of 4 KiB and %d of 32 KiB a subject, in %d rounds\n\n",
		len(pages)/PageSize, len(deepPages)/PageSize, *zdReads, *zdReads/2, *zdRounds)
	rng := rand.New(rand.NewPCG(35, 1206))
	for range *zdRounds {
		for _, s := range subjects {
			zdTimeReads(t, s.p, s.want, 1, *zdReads / *zdRounds, rng, &s.small)
			zdTimeReads(t, s.p, s.want, 8, *zdReads/2 / *zdRounds, rng, &s.win)
		}
	}
	fmt.Fprintln(out, "| subject | ratio | 4K mean µs | 4K p50 | 4K p99 | 4K p99 warm | p50 × LZ4 | 32K mean µs | 32K p50 | 32K p99 | 32K MB/s | switched % |")
	fmt.Fprintln(out, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
	lz4Small := subjects[0].small.stats(false)
	for _, s := range subjects {
		small, warm, win := s.small.stats(false), s.small.stats(true), s.win.stats(false)
		fmt.Fprintf(out, "| %s | %.3f | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f | %.0f | %.1f / %.1f |\n",
			s.name, s.ratio, zdUs(small.mean), zdUs(small.p50), zdUs(small.p99), zdUs(warm.p99),
			float64(small.p50)/float64(lz4Small.p50), zdUs(win.mean), zdUs(win.p50), zdUs(win.p99),
			float64(8*PageSize)/win.mean.Seconds()/1e6, 100*small.switched, 100*win.switched)
	}
}

// zdPager reads n adjacent pages from page first on into dst.
type zdPager interface {
	readPages(dst []byte, first, n int) error
	total() int
	// withLibzstd is the same pages decoded by libzstd alone.
	withLibzstd() zdPager
}

// zdDecoder is a ZstdDecoder, or libzstdOnly of one.
type zdDecoder interface {
	Decompress(dst, src []byte) error
	DecompressPrefix(dst, src []byte, n int) error
}

// libzstdOnly decodes with z's contexts as z does, but with libzstd
// alone: the rows zstddec.c is measured against.
type libzstdOnly struct{ z *ZstdDecoder }

func (l libzstdOnly) Decompress(dst, src []byte) error {
	s := l.z.ctxs.get()
	defer s.put()
	return libzstdDecompress(s.ctx, dst, src)
}

func (l libzstdOnly) DecompressPrefix(dst, src []byte, n int) error {
	s := l.z.ctxs.get()
	defer s.put()
	return libzstdPrefix(s.ctx, dst, src, n)
}

// zdFastPages are pages compressed alone, or kept raw where that would
// not come below gzramd's huge threshold.
type zdFastPages struct {
	decode func(dst, src []byte) error
	dec    *ZstdDecoder // where decode is its Decompress
	data   []byte
	off    []int
}

func zdPages(t *testing.T, pages []byte, c Codec) *zdFastPages {
	f := &zdFastPages{decode: c.Decompress, off: []int{0}}
	buf := make([]byte, PageSize)
	for p := 0; p < len(pages); p += PageSize {
		page := pages[p : p+PageSize]
		n := c.Compress(buf[:daemonLimit], page)
		if n == 0 {
			f.data = append(f.data, page...)
		} else {
			f.data = append(f.data, buf[:n]...)
		}
		f.off = append(f.off, len(f.data))
	}
	return f
}

func (f *zdFastPages) total() int { return len(f.off) - 1 }

// withLibzstd is for pages decoded by a ZstdDecoder (decode set to its
// Decompress, dec to it).
func (f *zdFastPages) withLibzstd() zdPager {
	g := *f
	g.decode = libzstdOnly{f.dec}.Decompress
	return &g
}
func (f *zdFastPages) ratio() float64 { return float64(f.total()*PageSize) / float64(len(f.data)) }

func (f *zdFastPages) readPages(dst []byte, first, n int) error {
	for i := range n {
		src := f.data[f.off[first+i]:f.off[first+i+1]]
		d := dst[i*PageSize : (i+1)*PageSize]
		if len(src) == PageSize {
			copy(d, src)
		} else if err := f.decode(d, src); err != nil {
			return err
		}
	}
	return nil
}

// zdFrameSet holds frames of pages pages each, decoded as the device's
// objects.decode does: a read decodes its frame only as far as its last
// page.
type zdFrameSet struct {
	pages, pageN int
	data         []byte
	off          []int
	dec          zdDecoder
	out          []byte
}

func zdFrames(t *testing.T, pages []byte, framePages, block, level int, dec *ZstdDecoder) *zdFrameSet {
	o, err := NewZstdObjects(level, framePages*PageSize, block)
	if err != nil {
		t.Fatal(err)
	}
	return zdMake(pages, framePages, dec, func(dst, src []byte) int { return o.Compress(dst, src) })
}

func zdDeepFrames(t *testing.T, pages []byte, dec *ZstdDecoder) *zdFrameSet {
	// A frame the parser finds incompressible is libzstd's, as it would
	// not be stored raw either in a measure of decode times.
	o, err := NewZstdObjects(5, 4*PageSize, 0)
	if err != nil {
		t.Fatal(err)
	}
	return zdMake(pages, 4, dec, func(dst, src []byte) int {
		if n := zstddeep.Compress(dst, src); n > 0 {
			return n
		}
		return o.Compress(dst, src)
	})
}

func zdMake(pages []byte, framePages int, dec *ZstdDecoder, compress func(dst, src []byte) int) *zdFrameSet {
	f := &zdFrameSet{pages: framePages, pageN: len(pages) / PageSize, off: []int{0}, dec: dec, out: make([]byte, framePages*PageSize)}
	buf := make([]byte, 2*framePages*PageSize)
	for p := 0; p < len(pages); p += framePages * PageSize {
		n := compress(buf, pages[p:min(len(pages), p+framePages*PageSize)])
		f.data = append(f.data, buf[:n]...)
		f.off = append(f.off, len(f.data))
	}
	return f
}

func (f *zdFrameSet) total() int { return f.pageN }

func (f *zdFrameSet) withLibzstd() zdPager {
	g := *f
	g.dec, g.out = libzstdOnly{f.dec.(*ZstdDecoder)}, make([]byte, len(f.out))
	return &g
}
func (f *zdFrameSet) ratio() float64 { return float64(f.pageN*PageSize) / float64(len(f.data)) }

func (f *zdFrameSet) readPages(dst []byte, first, n int) error {
	for n > 0 {
		i, p := first/f.pages, first%f.pages
		out := f.out[:min(f.pages, f.pageN-i*f.pages)*PageSize]
		k := min(n, len(out)/PageSize-p)
		frame := f.data[f.off[i]:f.off[i+1]]
		var err error
		if (p+k)*PageSize < len(out) {
			err = f.dec.DecompressPrefix(out, frame, (p+k)*PageSize)
		} else {
			err = f.dec.Decompress(out, frame)
		}
		if err != nil {
			return err
		}
		dst = dst[copy(dst, out[p*PageSize:(p+k)*PageSize]):]
		first, n = first+k, n-k
	}
	return nil
}

// zdSamples are the times of reads, a slice a round, with warm the
// shorter of two runs again at once of each read, and how many reads ran
// again as the thread was switched out in them.
type zdSamples struct {
	rounds, warm [][]time.Duration
	again        int
}

type zdStats struct {
	mean, p50, p99 time.Duration
	switched       float64
}

func (s *zdSamples) stats(warm bool) zdStats {
	rounds := s.rounds
	if warm {
		rounds = s.warm
	}
	var all, p50s, p99s []time.Duration
	for _, r := range rounds {
		all = append(all, r...)
		r = slices.Sorted(slices.Values(r))
		p50s, p99s = append(p50s, r[len(r)/2]), append(p99s, r[len(r)*99/100])
	}
	var sum time.Duration
	for _, d := range all {
		sum += d
	}
	slices.Sort(p50s)
	slices.Sort(p99s)
	return zdStats{mean: sum / time.Duration(len(all)), p50: p50s[len(p50s)/2], p99: p99s[len(p99s)/2],
		switched: float64(s.again) / float64(len(all)+s.again)}
}

func zdSwitches() int64 {
	var ru unix.Rusage
	if err := unix.Getrusage(unix.RUSAGE_THREAD, &ru); err != nil {
		panic(err)
	}
	return ru.Nvcsw + ru.Nivcsw
}

func zdTimed(read func() error) (took time.Duration, runs int, err error) {
	for runs = 1; ; runs++ {
		before := zdSwitches()
		start := time.Now()
		err = read()
		took = time.Since(start)
		if err != nil || zdSwitches() == before || runs == 100 {
			return took, runs, err
		}
	}
}

func zdUs(d time.Duration) float64 { return float64(d) / 1e3 }

// zdTimeReads times n reads of pages adjacent pages, aligned to pages and
// drawn uniformly, after a tenth as many untimed, each checked against
// want outside its time.
func zdTimeReads(t *testing.T, p zdPager, want []byte, pages, n int, rng *rand.Rand, s *zdSamples) {
	dst := make([]byte, pages*PageSize)
	warmup := n / 10
	cold, warm := make([]time.Duration, 0, n), make([]time.Duration, 0, n)
	for i := range warmup + n {
		first := rng.IntN(p.total()/pages) * pages
		read := func() error { return p.readPages(dst, first, pages) }
		took, runs, err := zdTimed(read)
		second, _, _ := zdTimed(read)
		third, _, _ := zdTimed(read)
		if err != nil {
			t.Fatalf("pages %d to %d: %v", first, first+pages-1, err)
		}
		if !bytes.Equal(dst, want[first*PageSize:(first+pages)*PageSize]) {
			t.Fatalf("pages %d to %d read back wrong", first, first+pages-1)
		}
		if i >= warmup {
			cold, warm = append(cold, took), append(warm, min(second, third))
			s.again += runs - 1
		}
	}
	s.rounds, s.warm = append(s.rounds, cold), append(s.warm, warm)
}
