package denseframes

import (
	"bytes"
	"flag"
	"fmt"
	"runtime"
	"slices"
	"testing"
	"time"

	"github.com/gzramd/gzramd/internal/corpus"
	"github.com/gzramd/gzramd/internal/swaptrace"
	"github.com/gzramd/gzramd/internal/testneeds"
	"github.com/gzramd/gzramd/pkg/codec"
)

var (
	traceFile   = flag.String("trace", "../traces/host-2.iolog.zst", "TestTraceReads: the recorded trace whose reads are replayed")
	traceCaches = flag.String("trace-caches", "8", "TestTraceReads: the sizes, in frames, of the caches of decoded frames tried on the 16 KiB frames")
)

// TestTraceReads replays the reads a real kernel sent while swapping in
// (bench/traces: 71 % of them 32 KiB readahead windows, at any page, not
// aligned to 32 KiB) over the dense tier's frame layouts, as gzramd reads
// them: each frame a request touches decoded once, as far as the last
// page it wants there, by gzramd's decoder (the dictionary's tables built
// once). The layouts differ in how many frames a request touches and how
// long each takes, so only a real request mix can weigh 4 KiB frames'
// short faults against their longer readahead. The requests are taken in
// turn by every layout, the fast tier's LZ4 pages among them, one after
// another, so the machine's other work falls on all alike; a request the
// thread was switched out in is left out of that layout's figures.
//
// The corpus is split as TestDictFrames splits it: the even 64 KiB groups
// train the dictionaries, the odd ones are the device the trace reads,
// its pages taken modulo their number. Writes and trims of the trace only
// empty the cache of decoded frames where one is kept.
//
//	GZRAMD_DENSE_FRAMES=1 go test ./bench/denseframes -run TestTraceReads -v -timeout 30m
func TestTraceReads(t *testing.T) {
	testneeds.Env(t, "GZRAMD_DENSE_FRAMES", "replays a recorded swap trace's reads over the dense tier's frame layouts (minutes)")
	pages := corpus.StoredPages(testneeds.Corpus(t))
	train, eval := splitGroups(pages)
	total := len(eval) / pageSize
	reqs := traceRequests(t, *traceFile, total)

	dict, err := codec.TrainZstdDict(train, 8<<10, 112<<10)
	if err != nil {
		t.Fatal(err)
	}
	readers := []tracePager{}
	for _, l := range []struct {
		name              string
		frame, level, ksl int
		dict              []byte
	}{
		{name: "16 KiB, level 19 (the GPU's frames: 0.3 % below level 19)", frame: 16 << 10, level: 19},
		{name: "16 KiB, level 5 (the CPU's frames)", frame: 16 << 10, level: 5},
		{name: "8 KiB, 112 KiB dictionary, level 15", frame: 8 << 10, level: 15, dict: dict},
		{name: "4 KiB, 112 KiB dictionary, level 15", frame: 4 << 10, level: 15, dict: dict},
	} {
		readers = append(readers, newTraceFrames(t, eval, l.name, l.frame, l.level, l.dict, l.ksl))
	}
	for _, slots := range ints(t, *traceCaches) {
		name := fmt.Sprintf("16 KiB, level 19, a cache of %d decoded frames", slots)
		readers = append(readers, newTraceFrames(t, eval, name, 16<<10, 19, nil, slots))
		f := newTraceFrames(t, eval, name+", 4 KiB reads decoded only as far as their page", 16<<10, 19, nil, slots)
		f.pageAlone = true
		readers = append(readers, f)
	}
	fast := &lz4Pages{compressPages(t, eval, codec.NewLZ4())}
	readers = append(readers, fast)

	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	res := make([]traceResult, len(readers))
	dst := make([]byte, 32*pageSize)
	for _, r := range reqs {
		if r.write {
			for _, p := range readers {
				p.forget(r.first, r.n)
			}
			continue
		}
		d := dst[:r.n*pageSize]
		for i, p := range readers {
			clear(d)
			before := switches()
			start := time.Now()
			frames, err := p.read(d, r.first, r.n)
			took := time.Since(start)
			if err != nil || !bytes.Equal(d, eval[r.first*pageSize:(r.first+r.n)*pageSize]) {
				t.Fatalf("%s: pages %d to %d read back wrong (%v)", p.name(), r.first, r.first+r.n-1, err)
			}
			res[i].add(r.n, frames, took, switches() != before)
		}
	}
	out := t.Output()
	nReads := 0
	for _, r := range reqs {
		if !r.write {
			nReads++
		}
	}
	fmt.Fprintf(out, "%s: %d reads replayed over %d pages (%d pages trained the dictionary)\n\n", *traceFile, nReads, total, len(train)/pageSize)
	fmt.Fprintln(out, "| layout | ratio | frames decoded a read | mean µs a read | p50 | p99 | 4 KiB reads: mean µs | 32 KiB reads: mean µs | MB/s | mean × LZ4 | left out % |")
	fmt.Fprintln(out, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
	base := res[len(res)-1]
	for i, p := range readers {
		r := res[i]
		fmt.Fprintf(out, "| %s | %.3f | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f | %.0f | %.2f | %.1f |\n",
			p.name(), p.ratio(), float64(r.frames)/float64(len(r.times)), us(r.mean()), us(r.pct(50)), us(r.pct(99)),
			us(r.meanOf(1)), us(r.meanOf(8)), float64(r.bytes)/r.sum.Seconds()/1e6, float64(r.mean())/float64(base.mean()),
			100*float64(r.dropped)/float64(r.dropped+len(r.times)))
	}
}

// traceRequest is a request of the trace, in pages of the measured ones.
type traceRequest struct {
	first, n int
	write    bool
}

// traceRequests reads a recorded trace and returns its reads, writes and
// trims of whole pages, each moved onto total pages (modulo, keeping a
// request's pages adjacent); a read must be of at most 32 pages.
func traceRequests(t *testing.T, path string, total int) []traceRequest {
	trace, err := swaptrace.Read(path)
	if err != nil {
		t.Fatal(err)
	}
	var reqs []traceRequest
	for _, r := range trace {
		if r.Off%pageSize != 0 || r.Len%pageSize != 0 {
			t.Fatalf("the trace: %s of %d bytes at %d, not of whole pages", r.Op, r.Len, r.Off)
		}
		first, n := int(r.Off/pageSize), int(r.Len/pageSize)
		if r.Op != "read" {
			// A write or a trim only empties caches; longer ones too.
			first %= total
			reqs = append(reqs, traceRequest{first: first, n: min(n, total-first), write: true})
			continue
		}
		if n > 32 {
			t.Fatalf("the trace reads %d bytes at once: more than this replay takes", r.Len)
		}
		reqs = append(reqs, traceRequest{first: first % (total - 32), n: n})
	}
	return reqs
}

// tracePager is a way to keep the measured pages, read as gzramd reads it.
type tracePager interface {
	name() string
	ratio() float64
	// read reads n pages from first into dst, and says how many frames it
	// decoded (pages, for the fast tier).
	read(dst []byte, first, n int) (frames int, err error)
	// forget drops what is cached of pages first to first+n-1.
	forget(first, n int)
}

// traceResult gathers a layout's request times.
type traceResult struct {
	times         []time.Duration
	sizes         []int
	sum           time.Duration
	bytes, frames int
	dropped       int
}

func (r *traceResult) add(pages, frames int, took time.Duration, switched bool) {
	if switched {
		r.dropped++
		return
	}
	r.times = append(r.times, took)
	r.sizes = append(r.sizes, pages)
	r.sum += took
	r.bytes += pages * pageSize
	r.frames += frames
}

func (r *traceResult) mean() time.Duration { return r.sum / time.Duration(len(r.times)) }

func (r *traceResult) pct(p int) time.Duration {
	s := slices.Clone(r.times)
	slices.Sort(s)
	return s[len(s)*p/100]
}

// meanOf is the mean time of the reads of n pages.
func (r *traceResult) meanOf(n int) time.Duration {
	var sum time.Duration
	k := 0
	for i, d := range r.times {
		if r.sizes[i] == n {
			sum += d
			k++
		}
	}
	if k == 0 {
		return 0
	}
	return sum / time.Duration(k)
}

// traceFrames are the measured pages in frames of frame bytes at a level,
// compressed with a dictionary where dict is not nil, read with gzramd's
// decoder; with slots, through a cache of that many decoded frames.
type traceFrames struct {
	label      string
	framePages int
	data       []byte
	off        []int
	pageN      int
	dec        *codec.ZstdDecoder
	dict       *codec.ZstdDict
	out        []byte
	slots      []cachedFrame
	clock      uint64
	// pageAlone: a read of one page decodes its frame only as far as the
	// page, and caches what it decoded.
	pageAlone bool
	decodedTo []int // pages of each slot's frame decoded
}

func newTraceFrames(t *testing.T, pages []byte, label string, frame, level int, dict []byte, slots int) *traceFrames {
	c, err := newDictCodec(dict, level)
	if err != nil {
		t.Fatal(err)
	}
	defer c.close()
	f := &traceFrames{label: label, framePages: frame / pageSize, off: []int{0}, pageN: len(pages) / pageSize, out: make([]byte, frame)}
	buf := make([]byte, 2*frame)
	for p := 0; p+frame <= len(pages); p += frame {
		n := c.compress(buf, pages[p:p+frame])
		if n <= 0 {
			t.Fatalf("%s: the frame at page %d does not compress", label, p/pageSize)
		}
		f.data = append(f.data, buf[:n]...)
		f.off = append(f.off, len(f.data))
	}
	f.pageN = (len(f.off) - 1) * f.framePages
	if f.dec, err = codec.NewZstdDecoder(1); err != nil {
		t.Fatal(err)
	}
	if len(dict) > 0 {
		if f.dict, err = codec.NewZstdDict(dict, 0); err != nil {
			t.Fatal(err)
		}
	}
	for range slots {
		f.slots = append(f.slots, cachedFrame{frame: -1, pages: make([]byte, frame)})
	}
	f.decodedTo = make([]int, slots)
	return f
}

func (f *traceFrames) name() string { return f.label }

func (f *traceFrames) ratio() float64 { return float64(f.pageN*pageSize) / float64(len(f.data)) }

func (f *traceFrames) read(dst []byte, first, n int) (frames int, err error) {
	single := n == 1
	for n > 0 {
		i, p := first/f.framePages, first%f.framePages
		k := min(n, f.framePages-p)
		upto := f.framePages
		if f.pageAlone && single {
			upto = p + k
		}
		out, decoded, err := f.frame(i, p+k, upto)
		if err != nil {
			return frames, err
		}
		if decoded {
			frames++
		}
		dst = dst[copy(dst, out[p*pageSize:(p+k)*pageSize]):]
		first, n = first+k, n-k
	}
	return frames, nil
}

// frame returns frame i's pages, at least its first need, and whether it
// decoded them: without slots as far as need, as gzramd does; with slots
// from one that holds them, or decoded as far as upto into the least
// recently used.
func (f *traceFrames) frame(i, need, upto int) ([]byte, bool, error) {
	if len(f.slots) == 0 {
		return f.out, true, f.decode(f.out, i, need*pageSize)
	}
	f.clock++
	lru := 0
	for s := range f.slots {
		if f.slots[s].frame == i && f.decodedTo[s] >= need {
			f.slots[s].used = f.clock
			return f.slots[s].pages, false, nil
		}
		if f.slots[s].frame == i {
			lru = s // decoded not far enough: decode it again in place
			break
		}
		if f.slots[s].used < f.slots[lru].used {
			lru = s
		}
	}
	s := &f.slots[lru]
	s.frame, s.used = -1, f.clock
	if err := f.decode(s.pages, i, upto*pageSize); err != nil {
		return nil, true, err
	}
	s.frame, f.decodedTo[lru] = i, upto
	return s.pages, true, nil
}

func (f *traceFrames) decode(dst []byte, i, want int) error {
	src := f.data[f.off[i]:f.off[i+1]]
	if f.dict != nil {
		return f.dec.DecompressDict(dst, src, f.dict, want)
	}
	if want < len(dst) {
		return f.dec.DecompressPrefix(dst, src, want)
	}
	return f.dec.Decompress(dst, src)
}

func (f *traceFrames) forget(first, n int) {
	for s := range f.slots {
		if fr := f.slots[s].frame; fr >= 0 && fr*f.framePages < first+n && (fr+1)*f.framePages > first {
			f.slots[s].frame = -1
		}
	}
}

// lz4Pages is the fast tier: a page alone, LZ4, or raw.
type lz4Pages struct{ *fastPages }

func (p *lz4Pages) name() string { return "LZ4 pages (the fast tier)" }

func (p *lz4Pages) read(dst []byte, first, n int) (int, error) {
	return n, p.readPages(dst, first, n)
}

func (p *lz4Pages) forget(int, int) {}
