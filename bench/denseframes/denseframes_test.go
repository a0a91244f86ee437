// Package denseframes measures, on the corpus of real memory pages, the
// frame layouts issue 35 asks about for the dense tier: the ratio each
// stores, and the time a 4 KiB or a 32 KiB read spends decoding it, beside
// the fast tier's pages in the same run; and a small cache of decoded
// frames under swap-in read patterns. It measures the codec as gzramd's
// reads call it (pkg/codec: libzstd, one context made ahead and reused),
// not the device: the device adds the same request handling to every
// layout. The write-up is bench/results/dense-frames-cpu-2026-11-28.md.
//
// It runs only when asked, for some minutes (level 19 compresses slowly):
//
//	GZRAMD_DENSE_FRAMES=1 go test ./bench/denseframes -run TestDenseFrames -v -timeout 60m
package denseframes

import (
	"bytes"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/DataDog/zstd"
	"golang.org/x/sys/unix"

	"github.com/gzramd/gzramd/internal/corpus"
	"github.com/gzramd/gzramd/internal/testneeds"
	"github.com/gzramd/gzramd/pkg/codec"
	"github.com/gzramd/gzramd/pkg/device"
)

var (
	reads  = flag.Int("reads", 40000, "4 KiB reads timed per layout (and half as many 32 KiB reads)")
	rounds = flag.Int("rounds", 5, "rounds the reads are spread over, every layout in each")
	levels = flag.String("levels", "3,9,19", "the zstd levels of the layouts besides today's")
)

const (
	pageSize = codec.PageSize
	// groupPages is the dense tier's group: 16 pages, 64 KiB.
	groupPages = 16
	// window is the kernel's swap readahead: 8 pages, 32 KiB.
	window = 8
)

// TestDenseFrames prints the tables of the write-up.
func TestDenseFrames(t *testing.T) {
	testneeds.Env(t, "GZRAMD_DENSE_FRAMES", "measures the dense tier's candidate frame layouts on the corpus (minutes)")
	pages := corpus.StoredPages(testneeds.Corpus(t))
	// One thread, so that switches counts the reads it was taken off its
	// CPU in.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	out := t.Output()
	fmt.Fprintf(out, "%d pages stored (same-filled ones left out); %d reads of 4 KiB and %d of 32 KiB a layout, in %d rounds\n\n",
		len(pages)/pageSize, *reads, *reads/2, *rounds)

	// The ways to keep the pages: the fast tier's, then the layouts,
	// today's first; the others' ratios and times are given against it
	// and against the LZ4 pages.
	lz4 := compressPages(t, pages, codec.NewLZ4())
	z1, err := codec.NewZstd(1)
	if err != nil {
		t.Fatal(err)
	}
	zpages := compressPages(t, pages, z1)
	subjects := []*subject{
		{name: "LZ4 pages (fast tier)", p: lz4, ratio: lz4.ratio(), stored: lz4.ratio(), compressMBps: lz4.compressMBps()},
		{name: "zstd -1 pages (fast tier, --algorithm zstd)", p: zpages, ratio: zpages.ratio(), stored: zpages.ratio(), compressMBps: zpages.compressMBps()},
	}
	dec, err := codec.NewZstdDecoder(1)
	if err != nil {
		t.Fatal(err)
	}
	today := layout{pages: groupPages, block: 16 << 10, level: 3}
	layouts := []layout{today}
	for _, f := range strings.Split(*levels, ",") {
		level, err := strconv.Atoi(f)
		if err != nil {
			t.Fatalf("-levels: %v", err)
		}
		layouts = append(layouts, layout{2, 0, level})
		for _, p := range []int{4, 8} {
			layouts = append(layouts, layout{p, pageSize, level}, layout{p, 0, level})
		}
		for _, block := range []int{pageSize, 16 << 10, 0} {
			if l := (layout{groupPages, block, level}); l != today {
				layouts = append(layouts, l)
			}
		}
	}
	byLayout := map[layout]*frames{}
	for _, l := range layouts {
		f := compressFrames(t, pages, l)
		byLayout[l] = f
		subjects = append(subjects, &subject{name: l.String(), p: &frameReader{f: f, dec: dec, out: make([]byte, groupPages*pageSize)},
			ratio: f.ratio(), stored: f.storedRatio(), compressMBps: f.compressMBps()})
	}

	// Every subject's reads in each round, so that the other work on the
	// machine falls on all of them alike.
	rng := rand.New(rand.NewPCG(35, 2026))
	var gcBefore runtime.MemStats
	runtime.ReadMemStats(&gcBefore)
	for range *rounds {
		for _, s := range subjects {
			timeReads(t, s.p, pages, 1, *reads / *rounds, rng, &s.small)
			timeReads(t, s.p, pages, window, *reads/2 / *rounds, rng, &s.win)
		}
	}

	var gcAfter runtime.MemStats
	runtime.ReadMemStats(&gcAfter)
	fmt.Fprintf(out, "%d garbage collections while the reads were timed\n\n", gcAfter.NumGC-gcBefore.NumGC)
	fmt.Fprintln(out, "| layout | ratio | as stored | × today | compress MB/s | 4K mean µs | 4K p50 | 4K p99 | 4K p99 warm | p50 × LZ4 | p99 warm × LZ4 | 32K mean µs | 32K p50 | 32K p99 | 32K MB/s | 32K MB/s × LZ4 | switched % |")
	fmt.Fprintln(out, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
	lz4Small, lz4Warm, lz4Win := subjects[0].small.stats(), subjects[0].small.warmStats(), subjects[0].win.stats()
	todayRatio := byLayout[today].ratio()
	for _, s := range subjects {
		small, warm, win := s.small.stats(), s.small.warmStats(), s.win.stats()
		fmt.Fprintf(out, "| %s | %.3f | %.3f | %.3f | %.1f | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f | %.0f | %.2f | %.1f / %.1f |\n",
			s.name, s.ratio, s.stored, s.ratio/todayRatio, s.compressMBps,
			us(small.mean), us(small.p50), us(small.p99), us(warm.p99),
			float64(small.p50)/float64(lz4Small.p50), float64(warm.p99)/float64(lz4Warm.p99),
			us(win.mean), us(win.p50), us(win.p99), win.mbps(), win.mbps()/lz4Win.mbps(), 100*small.switched, 100*win.switched)
	}
	fmt.Fprintln(out)
	fmt.Fprintln(out, "The virtual machine's stalls: loops of arithmetic alone, 20000 runs each")
	fmt.Fprintln(out)
	fmt.Fprintln(out, "| p50 µs (the loop) | p99 µs |")
	fmt.Fprintln(out, "|---:|---:|")
	for _, d := range []time.Duration{2 * time.Microsecond, 8 * time.Microsecond, 16 * time.Microsecond, 32 * time.Microsecond} {
		st := spinTimes(d, 20000)
		fmt.Fprintf(out, "| %.2f | %.2f |\n", us(st.p50), us(st.p99))
	}
	fmt.Fprintln(out)

	// The caches and contexts over today's frames, and over the small
	// frames that store at least 4.1 (one block of 16 KiB at level 19) and
	// that decode fastest (a block a page), where measured.
	cached, ctxFrames := []*frames{byLayout[today]}, []*frames{byLayout[today]}
	if f := byLayout[layout{4, 0, 19}]; f != nil {
		cached = append(cached, f)
	}
	if f := byLayout[layout{4, pageSize, 19}]; f != nil {
		ctxFrames = append(ctxFrames, f)
	}
	for _, f := range cached {
		cacheTable(t, out, pages, f, dec, lz4, rng)
	}
	contextTable(t, out, ctxFrames, rng)
}

// subject is a way to keep the pages, and the times of its reads.
type subject struct {
	name                        string
	p                           pager
	ratio, stored, compressMBps float64
	small, win                  samples // 4 KiB and 32 KiB reads
}

// pager reads n adjacent pages from the stored pages' page first into
// dst, as one request.
type pager interface {
	readPages(dst []byte, first, n int) error
	total() int
}

// fastPages is the fast tier: each page compressed alone by c, or kept raw
// where that would not come below gzramd's huge threshold.
type fastPages struct {
	c        codec.Codec
	data     []byte
	off      []int // page i is data[off[i]:off[i+1]]
	compress time.Duration
}

func compressPages(t *testing.T, pages []byte, c codec.Codec) *fastPages {
	f := &fastPages{c: c, off: []int{0}}
	buf := make([]byte, device.DefaultHugeThreshold-1)
	start := time.Now()
	for p := 0; p < len(pages); p += pageSize {
		page := pages[p : p+pageSize]
		if n := c.Compress(buf, page); n > 0 {
			f.data = append(f.data, buf[:n]...)
		} else {
			f.data = append(f.data, page...) // huge: stored raw
		}
		f.off = append(f.off, len(f.data))
	}
	f.compress = time.Since(start)
	if f.total() == 0 {
		t.Fatal("no pages")
	}
	return f
}

func (f *fastPages) total() int            { return len(f.off) - 1 }
func (f *fastPages) ratio() float64        { return float64(f.total()*pageSize) / float64(len(f.data)) }
func (f *fastPages) compressMBps() float64 { return mbps(f.total()*pageSize, f.compress) }

func (f *fastPages) readPages(dst []byte, first, n int) error {
	for k := range n {
		src, page := f.data[f.off[first+k]:f.off[first+k+1]], dst[k*pageSize:(k+1)*pageSize]
		if len(src) == pageSize {
			copy(page, src)
		} else if err := f.c.Decompress(page, src); err != nil {
			return err
		}
	}
	return nil
}

// layout is a way to keep the stored pages as zstd frames: frames of pages
// adjacent pages (the last may be shorter), in blocks of block bytes of
// input each (0: one block for the frame), at a libzstd level. A read
// decodes a frame up to the block that holds the last page it wants: a
// frame of one block is decoded whole.
type layout struct {
	pages, block, level int
}

func (l layout) String() string {
	blocks := fmt.Sprintf("%d KiB blocks", l.block>>10)
	switch {
	case l.block == pageSize:
		blocks = "a block a page"
	case l.block == 0 || l.block >= l.pages*pageSize:
		blocks = "one block"
	}
	s := fmt.Sprintf("%d KiB frames, %s, level %d", l.pages*pageSize>>10, blocks, l.level)
	if l == (layout{groupPages, 16 << 10, 3}) {
		s += " (today, CPU)"
	}
	return s
}

// frames is a layout applied to the stored pages: frame i holds pages from
// i*pages on, and is data[off[i]:off[i+1]].
type frames struct {
	layout
	data     []byte
	off      []int
	pageN    int
	compress time.Duration
}

func compressFrames(t *testing.T, pages []byte, l layout) *frames {
	z, err := codec.NewZstdObjects(l.level, l.pages*pageSize, l.block)
	if err != nil {
		t.Fatal(err)
	}
	f := &frames{layout: l, off: []int{0}, pageN: len(pages) / pageSize}
	buf := make([]byte, 2*l.pages*pageSize) // above zstd's bound
	start := time.Now()
	for p := 0; p < len(pages); p += l.pages * pageSize {
		n := z.Compress(buf, pages[p:min(len(pages), p+l.pages*pageSize)])
		if n <= 0 {
			t.Fatalf("%v: frame at page %d does not compress", l, p/pageSize)
		}
		f.data = append(f.data, buf[:n]...)
		f.off = append(f.off, len(f.data))
	}
	f.compress = time.Since(start)
	return f
}

func (f *frames) frame(i int) []byte    { return f.data[f.off[i]:f.off[i+1]] }
func (f *frames) framePages(i int) int  { return min(f.pages, f.pageN-i*f.pages) }
func (f *frames) total() int            { return f.pageN }
func (f *frames) ratio() float64        { return float64(f.pageN*pageSize) / float64(len(f.data)) }
func (f *frames) compressMBps() float64 { return mbps(f.pageN*pageSize, f.compress) }
func (f *frames) frameCount() int       { return len(f.off) - 1 }
func (f *frames) storedRatio() float64 {
	held := 0
	for i := range f.frameCount() {
		held += objectBytes(len(f.frame(i)))
	}
	return float64(f.pageN*pageSize) / float64(held)
}

// objectBytes is what gzramd's store holds for a frame of n bytes kept as
// an object: a header of 8 bytes and 6 more for each 4 KiB chunk after
// the first, then the frame (pkg/device/object.go, layoutFor).
func objectBytes(n int) int {
	for c := 1; ; c++ {
		if h := 8 + 6*(c-1); h+n <= c*pageSize {
			return h + n
		}
	}
}

// frameReader reads frames as gzramd's reads do (decodeObject): each frame
// a request touches decoded once, as far as the last page it wants there.
type frameReader struct {
	f   *frames
	dec *codec.ZstdDecoder
	out []byte
}

func (r *frameReader) total() int { return r.f.pageN }

func (r *frameReader) readPages(dst []byte, first, n int) error {
	for n > 0 {
		i, p := first/r.f.pages, first%r.f.pages
		k := min(n, r.f.framePages(i)-p)
		out, err := decode(r.dec, r.f, i, p+k, r.out)
		if err != nil {
			return err
		}
		dst = dst[copy(dst, out[p*pageSize:(p+k)*pageSize]):]
		first, n = first+k, n-k
	}
	return nil
}

// decode decodes frame i of f into out, as far as its first upto pages at
// least, and returns its pages.
func decode(dec *codec.ZstdDecoder, f *frames, i, upto int, out []byte) ([]byte, error) {
	out = out[:f.framePages(i)*pageSize]
	if upto*pageSize < len(out) {
		return out, dec.DecompressPrefix(out, f.frame(i), upto*pageSize)
	}
	return out, dec.Decompress(out, f.frame(i))
}

// samples are the times of reads of bytes each, a slice a round, and how
// many reads ran again as the thread was switched out in them. warm holds,
// for each read, the shorter of two runs of it again at once: its data
// in the caches, and a stall of the virtual machine's (see spinTimes) in
// both runs of one read seldom.
type samples struct {
	rounds, warm [][]time.Duration
	again        int
	bytes        int
}

// stats gives the mean of all the reads, and the median over the rounds of
// each round's p50 and p99: a round in which the machine's other work
// slowed every read moves one of five.
func (s *samples) stats() stats { return s.summary(s.rounds) }

// warmStats is stats of the reads run again.
func (s *samples) warmStats() stats { return s.summary(s.warm) }

func (s *samples) summary(rounds [][]time.Duration) stats {
	var all []time.Duration
	var p50s, p99s []time.Duration
	for _, r := range rounds {
		all = append(all, r...)
		st := summarize(r, s.bytes)
		p50s, p99s = append(p50s, st.p50), append(p99s, st.p99)
	}
	st := summarize(all, s.bytes)
	slices.Sort(p50s)
	slices.Sort(p99s)
	st.p50, st.p99 = p50s[len(p50s)/2], p99s[len(p99s)/2]
	st.switched = float64(s.again) / float64(len(all)+s.again)
	return st
}

// stats summarises the times of reads of bytes each.
type stats struct {
	mean, p50, p99 time.Duration
	bytes          int
	// switched is the share of reads the thread was switched out in.
	switched float64
}

func summarize(times []time.Duration, bytes int) stats {
	times = slices.Sorted(slices.Values(times))
	var sum time.Duration
	for _, d := range times {
		sum += d
	}
	return stats{mean: sum / time.Duration(len(times)), p50: times[len(times)/2], p99: times[len(times)*99/100], bytes: bytes}
}

func (s stats) mbps() float64 { return mbps(s.bytes, s.mean) }

// switches is how often this thread has left its CPU. The machine is
// shared (2 cores, other work running): a read in which the thread was
// switched out timed the other work, not its layout.
func switches() int64 {
	var ru unix.Rusage
	if err := unix.Getrusage(unix.RUSAGE_THREAD, &ru); err != nil {
		panic(err)
	}
	return ru.Nvcsw + ru.Nivcsw
}

// timed times read, again (up to 100 times) while the thread is switched
// out during it, and returns its time and how many times it ran.
func timed(read func() error) (took time.Duration, runs int, err error) {
	for runs = 1; ; runs++ {
		before := switches()
		start := time.Now()
		err = read()
		took = time.Since(start)
		if err != nil || switches() == before || runs == 100 {
			return took, runs, err
		}
	}
}

func mbps(bytes int, d time.Duration) float64 { return float64(bytes) / d.Seconds() / 1e6 }
func us(d time.Duration) float64              { return float64(d) / 1e3 }

// timeReads times n reads of pages adjacent pages from p into s, each at
// a place drawn uniformly among the stored pages aligned to pages (the
// kernel's swap readahead reads an aligned cluster), after a tenth as many
// untimed to warm up; a read the thread was switched out in is timed
// again. Each read is run twice more at once, for s.warm. Each read is
// checked against want, outside its time.
func timeReads(t *testing.T, p pager, want []byte, pages, n int, rng *rand.Rand, s *samples) {
	dst := make([]byte, pages*pageSize)
	warmup := n / 10
	s.bytes = pages * pageSize
	cold, warm := make([]time.Duration, 0, n), make([]time.Duration, 0, n)
	for i := range warmup + n {
		first := rng.IntN(p.total()/pages) * pages
		read := func() error { return p.readPages(dst, first, pages) }
		took, runs, err := timed(read)
		second, _, _ := timed(read)
		third, _, _ := timed(read)
		if err != nil {
			t.Fatalf("pages %d to %d: %v", first, first+pages-1, err)
		}
		if !bytes.Equal(dst, want[first*pageSize:(first+pages)*pageSize]) {
			t.Fatalf("pages %d to %d read back wrong", first, first+pages-1)
		}
		if i >= warmup {
			cold, warm = append(cold, took), append(warm, min(second, third))
			s.again += runs - 1
		}
	}
	s.rounds, s.warm = append(s.rounds, cold), append(s.warm, warm)
}

// spinTimes times n runs of a loop of arithmetic that takes about d,
// touching no memory: what its p99 adds to its p50 is the virtual
// machine's, not a layout's (the host stalls it unseen by the guest: no
// switch, no interrupt counted in /proc/interrupts).
func spinTimes(d time.Duration, n int) stats {
	// Calibrated first: iterations a microsecond.
	per := 0
	for start := time.Now(); time.Since(start) < time.Millisecond; per++ {
		spin(1000)
	}
	iters := int(d.Microseconds()) * per
	times := make([]time.Duration, n)
	for i := range times {
		times[i], _, _ = timed(func() error { spin(iters); return nil })
	}
	return summarize(times, 0)
}

var spinSink uint64

func spin(n int) {
	x := uint64(1)
	for i := range n {
		x = x*6364136223846793005 + uint64(i)
	}
	spinSink = x
}

// frameCache keeps the frames (groups, for today's layout) that reads
// decoded whole, the least recently used replaced first, so that the reads
// of a frame's other pages that follow a fault copy them instead of
// decoding the frame again. With no slots it reads as gzramd does today.
type frameCache struct {
	f            *frames
	dec          *codec.ZstdDecoder
	slots        []cachedFrame
	out          []byte // for reads without slots
	clock        uint64
	hits, misses int
}

type cachedFrame struct {
	frame int // -1: empty
	used  uint64
	pages []byte
}

func newFrameCache(f *frames, dec *codec.ZstdDecoder, slots int) *frameCache {
	c := &frameCache{f: f, dec: dec, out: make([]byte, groupPages*pageSize)}
	for range slots {
		c.slots = append(c.slots, cachedFrame{frame: -1, pages: make([]byte, f.pages*pageSize)})
	}
	return c
}

func (c *frameCache) total() int { return c.f.pageN }

func (c *frameCache) readPages(dst []byte, first, n int) error {
	for n > 0 {
		i, p := first/c.f.pages, first%c.f.pages
		k := min(n, c.f.framePages(i)-p)
		out, err := c.get(i, p+k)
		if err != nil {
			return err
		}
		dst = dst[copy(dst, out[p*pageSize:(p+k)*pageSize]):]
		first, n = first+k, n-k
	}
	return nil
}

// get returns frame i's pages, at least its first upto: from a slot, or
// decoded whole into the least recently used one; without slots, decoded
// as far as upto.
func (c *frameCache) get(i, upto int) ([]byte, error) {
	c.clock++
	if len(c.slots) == 0 {
		c.misses++
		return decode(c.dec, c.f, i, upto, c.out)
	}
	lru := 0
	for s := range c.slots {
		if c.slots[s].frame == i {
			c.slots[s].used = c.clock
			c.hits++
			return c.slots[s].pages[:c.f.framePages(i)*pageSize], nil
		}
		if c.slots[s].used < c.slots[lru].used {
			lru = s
		}
	}
	c.misses++
	s := &c.slots[lru]
	s.frame, s.used = -1, c.clock
	out, err := decode(c.dec, c.f, i, c.f.pages, s.pages)
	if err == nil {
		s.frame = i
	}
	return out, err
}

// request is one read: n pages from first; fault marks the first of a
// run of requests (the fault that starts a swap-in).
type request struct {
	first, n int
	fault    bool
}

// interleave returns n requests from streams programs swapping in at once,
// taking turns: each runs the requests start gives it, then starts again
// elsewhere.
func interleave(n, streams int, start func() []request) []request {
	runs := make([][]request, streams)
	var out []request
	for len(out) < n {
		for s := range runs {
			if len(runs[s]) == 0 {
				runs[s] = start()
				runs[s][0].fault = true
			}
			out = append(out, runs[s][0])
			runs[s] = runs[s][1:]
		}
	}
	return out[:n]
}

// The read patterns of the cache's table.
func randomPages(rng *rand.Rand, total int) func() []request {
	return func() []request { return []request{{first: rng.IntN(total), n: 1}} }
}

// faultThenGroup: a fault at a page, then reads of the following pages of
// its group one by one, as the readahead after a fault brings them when
// its requests are not merged.
func faultThenGroup(rng *rand.Rand, total int) func() []request {
	return func() []request {
		p := rng.IntN(total)
		var run []request
		for q := p; q < min(total, (p/groupPages+1)*groupPages); q++ {
			run = append(run, request{first: q, n: 1})
		}
		return run
	}
}

// sequentialWindows: aligned 32 KiB windows, 8 in a row (256 KiB), as a
// program that walks its memory back in brings them by readahead.
func sequentialWindows(rng *rand.Rand, total int) func() []request {
	return func() []request {
		w := rng.IntN(total/window - 8)
		run := make([]request, 8)
		for k := range run {
			run[k] = request{first: (w + k) * window, n: window}
		}
		return run
	}
}

// cacheTable replays the read patterns on f with caches of 0 (as gzramd
// reads today), 1, 4 and 8 decoded frames, and on the LZ4 pages. Each
// pattern's requests are replayed in rounds, every cache in each, each
// cache kept from one round to the next.
func cacheTable(t *testing.T, out io.Writer, pages []byte, f *frames, dec *codec.ZstdDecoder, lz4 *fastPages, rng *rand.Rand) {
	fmt.Fprintf(out, "Cache of decoded frames over %v; LZ4 pages replayed for reference\n\n", f.layout)
	fmt.Fprintln(out, "| pattern | streams | cache | holds KiB | hit rate | mean µs | p50 | p99 | faults: mean µs | the reads after: mean µs | MB/s | mean × LZ4 | switched % |")
	fmt.Fprintln(out, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
	for _, pat := range []struct {
		name string
		gen  func(*rand.Rand, int) func() []request
	}{
		{"random 4K", randomPages},
		{"fault, then the group's following pages, 4K each", faultThenGroup},
		{"32K windows, 8 in a row", sequentialWindows},
	} {
		for _, streams := range []int{1, 4, 16} {
			reqs := interleave(*reads/2, streams, pat.gen(rng, f.pageN))
			caches := []*frameCache{newFrameCache(f, dec, 0), newFrameCache(f, dec, 1), newFrameCache(f, dec, 4), newFrameCache(f, dec, 8)}
			results := make([]replayed, len(caches)+1)
			chunk := len(reqs) / *rounds
			for r := range *rounds {
				part := reqs[r*chunk : (r+1)*chunk]
				for i, c := range caches {
					results[i].replay(t, c, pages, part)
				}
				results[len(caches)].replay(t, lz4, pages, part)
			}
			base := results[len(caches)]
			for i, c := range caches {
				name := fmt.Sprint(len(c.slots))
				if name == "0" {
					name = "none"
				}
				results[i].row(out, pat.name, streams, name, fmt.Sprint(len(c.slots)*f.pages*pageSize>>10),
					fmt.Sprintf("%.3f", float64(c.hits)/float64(c.hits+c.misses)), base)
			}
			base.row(out, pat.name, streams, "LZ4 pages", "", "", base)
		}
	}
	fmt.Fprintln(out)
}

// replayed are the times of replayed requests: all of them, a slice a
// round; the faults' and the others' sums; the bytes read; the requests
// left out as the thread was switched out in them (not run again: they
// changed the cache).
type replayed struct {
	samples
	faults, rest   time.Duration
	nFaults, nRest int
	read, dropped  int
}

// replay times each request of reqs on p, checking what it read.
func (rp *replayed) replay(t *testing.T, p pager, want []byte, reqs []request) {
	dst := make([]byte, groupPages*pageSize)
	times := make([]time.Duration, 0, len(reqs))
	for _, r := range reqs {
		d := dst[:r.n*pageSize]
		before := switches()
		start := time.Now()
		err := p.readPages(d, r.first, r.n)
		took := time.Since(start)
		if err != nil || !slices.Equal(d, want[r.first*pageSize:(r.first+r.n)*pageSize]) {
			t.Fatalf("pages %d to %d: read back wrong (%v)", r.first, r.first+r.n-1, err)
		}
		if switches() != before {
			rp.dropped++
			continue
		}
		times = append(times, took)
		rp.read += len(d)
		if r.fault {
			rp.faults += took
			rp.nFaults++
		} else {
			rp.rest += took
			rp.nRest++
		}
	}
	rp.rounds = append(rp.rounds, times)
}

func (rp *replayed) row(out io.Writer, pattern string, streams int, cache, holds, hits string, base replayed) {
	st, bt := rp.stats(), base.stats()
	n := rp.nFaults + rp.nRest
	perRead := func(sum time.Duration, k int) string {
		if k == 0 {
			return "-"
		}
		return fmt.Sprintf("%.2f", us(sum/time.Duration(k)))
	}
	fmt.Fprintf(out, "| %s | %d | %s | %s | %s | %.2f | %.2f | %.2f | %s | %s | %.0f | %.2f | %.1f |\n",
		pattern, streams, cache, holds, hits, us(st.mean), us(st.p50), us(st.p99),
		perRead(rp.faults, rp.nFaults), perRead(rp.rest, rp.nRest),
		float64(rp.read)/(rp.faults+rp.rest).Seconds()/1e6, float64(st.mean)/float64(bt.mean), 100*float64(rp.dropped)/float64(n+rp.dropped))
}

// contextTable decodes whole frames three ways: libzstd's one-shot
// ZSTD_decompress, which allocates a context and frees it each call; a
// context made once (DataDog's Ctx); and gzramd's, made once in memory it
// wrote ahead (codec.ZstdDecoder, what reads use).
func contextTable(t *testing.T, out io.Writer, fs []*frames, rng *rand.Rand) {
	ctx := zstd.NewCtx()
	dec, err := codec.NewZstdDecoder(1)
	if err != nil {
		t.Fatal(err)
	}
	ways := []struct {
		name string
		run  func(dst, src []byte) error
	}{
		{"ZSTD_decompress: a context each call", func(dst, src []byte) error { _, err := zstd.DecompressInto(dst, src); return err }},
		{"ZSTD_decompressDCtx, one context reused", func(dst, src []byte) error { _, err := ctx.DecompressInto(dst, src); return err }},
		{"codec.ZstdDecoder (gzramd today)", dec.Decompress},
	}
	fmt.Fprintln(out, "Whole frames decoded, by how the context is had")
	fmt.Fprintln(out)
	fmt.Fprintln(out, "| layout | context | mean µs | p50 | p99 |")
	fmt.Fprintln(out, "|---|---|---:|---:|---:|")
	dst := make([]byte, groupPages*pageSize)
	for _, f := range fs {
		// Each frame drawn is decoded every way in turn.
		times := make([][]time.Duration, len(ways))
		for range *reads / 2 {
			i := rng.IntN(f.frameCount())
			d := dst[:f.framePages(i)*pageSize]
			for w, way := range ways {
				took, _, err := timed(func() error { return way.run(d, f.frame(i)) })
				if err != nil {
					t.Fatalf("%v frame %d: %s: %v", f.layout, i, way.name, err)
				}
				times[w] = append(times[w], took)
			}
		}
		for w, way := range ways {
			s := summarize(times[w], 0)
			fmt.Fprintf(out, "| %v | %s | %.2f | %.2f | %.2f |\n", f.layout, way.name, us(s.mean), us(s.p50), us(s.p99))
		}
	}
	fmt.Fprintln(out)
}
