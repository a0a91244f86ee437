package zstdpage

import (
	"bytes"
	"container/heap"
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/DataDog/zstd"
	"golang.org/x/sys/unix"

	"github.com/gzramd/gzramd/pkg/codec"
)

// stages are the option sets measured: each adds one part of the encoder.
var stages = []struct {
	name string
	opts Options
}{
	{"raw literals + predefined FSE", Options{NoHuffman: true, NoFSETables: true, NoRepeat: true}},
	{"+ Huffman literals", Options{NoFSETables: true, NoRepeat: true}},
	{"+ custom FSE tables", Options{NoRepeat: true}},
	{"+ repeat offsets (defaults)", Options{}},
}

// variants are option sets the round-trip tests also run, to cover the
// match finder's other paths.
var variants = []Options{
	{},
	{NoHuffman: true, NoFSETables: true, NoRepeat: true},
	{NoFSETables: true},
	{NoRepeat: true},
	{MinMatch: 3, RepMin: 3, Depth: 64, Lazy: 2},
	{MinMatch: 6, RepMin: 5, Depth: 1, Lazy: -1, HashBits: 8},
	{MinMatch: 5, Depth: 4, Lazy: 1},
}

const guard = 0xA5

// roundTrip compresses page with opts into a guarded buffer of cap bytes,
// checks nothing past cap was written and that libzstd decodes the frame
// to the page; it returns the frame length (0: stored raw).
func roundTrip(t testing.TB, page []byte, opts Options, cap int) int {
	t.Helper()
	buf := bytes.Repeat([]byte{guard}, cap+64)
	n := Compress(buf[:cap], page, opts)
	for i, b := range buf[cap:] {
		if b != guard {
			t.Fatalf("opts %+v cap %d: wrote byte %d past the end", opts, cap, i)
		}
	}
	if n < 0 || n > cap || n >= PageSize {
		t.Fatalf("opts %+v cap %d: returned length %d", opts, cap, n)
	}
	if n == 0 {
		return 0
	}
	got, err := zstd.Decompress(nil, buf[:n])
	if err != nil {
		t.Fatalf("opts %+v: %d-byte frame does not decode: %v\nframe % x", opts, n, err, buf[:min(n, 64)])
	}
	if !bytes.Equal(got, page) {
		i := 0
		for i < len(got) && i < len(page) && got[i] == page[i] {
			i++
		}
		t.Fatalf("opts %+v: %d-byte frame decodes to %d bytes differing from the page at byte %d", opts, n, len(got), i)
	}
	return n
}

func edgePages() map[string][]byte {
	r := rand.New(rand.NewPCG(1, 2))
	pages := map[string][]byte{}
	page := func() []byte { return make([]byte, PageSize) }
	fill := func(f func(i int) byte) []byte {
		p := page()
		for i := range p {
			p[i] = f(i)
		}
		return p
	}
	pages["zero"] = page()
	pages["same-0x5c"] = bytes.Repeat([]byte{0x5c}, PageSize)
	pages["same-0xff"] = bytes.Repeat([]byte{0xff}, PageSize)
	pages["random"] = fill(func(int) byte { return byte(r.Uint32()) })
	pages["random-high"] = fill(func(int) byte { return 0x80 | byte(r.Uint32()) })
	pages["random-ascii"] = fill(func(int) byte { return byte(32 + r.IntN(95)) })
	pages["random-16-symbols"] = fill(func(int) byte { return byte(r.IntN(16)) })
	pages["random-2-symbols"] = fill(func(int) byte { return byte(r.IntN(2)) * 0xEE })
	pages["random-2-symbols-skewed"] = fill(func(int) byte {
		if r.IntN(50) == 0 {
			return 0x90
		}
		return 0x11
	})
	pages["random-3-symbols"] = fill(func(int) byte { return []byte{1, 0x80, 0xff}[r.IntN(3)] })
	pages["all-256-values"] = fill(func(i int) byte { return byte(i) })
	pages["all-256-values-shuffled"] = fill(func(int) byte { return byte(r.Uint32()) })
	perm := r.Perm(256)
	pages["256-values-once-then-zero"] = fill(func(i int) byte {
		if i < 256 {
			return byte(perm[i])
		}
		return 0
	})
	pages["one-byte-differs-first"] = fill(func(i int) byte { return byte(0x33 * min(i, 1)) })
	pages["one-byte-differs-last"] = fill(func(i int) byte {
		if i == PageSize-1 {
			return 7
		}
		return 0
	})
	pages["one-byte-differs-middle"] = fill(func(i int) byte {
		if i == 2000 {
			return 0x99
		}
		return 0xAA
	})
	words := strings.Fields("the quick brown fox jumps over a lazy dog while memory pages swap out to a compressed block device on the GPU and back")
	var text bytes.Buffer
	for text.Len() < PageSize {
		text.WriteString(words[r.IntN(len(words))])
		text.WriteByte(" \n,."[r.IntN(4)])
	}
	pages["text"] = text.Bytes()[:PageSize]
	// Text with no repeated 3-byte string: every byte a literal.
	lit := page()
	for i := range lit {
		lit[i] = byte('a' + (i*7+i/26)%26)
	}
	pages["all-literal-letters"] = lit
	pages["all-literal-ascii"] = fill(func(i int) byte { return byte(32 + (i*37+i*i/97)%95) })
	for _, period := range []int{2, 3, 4, 5, 7, 8, 9, 13, 16, 17, 31, 64, 100, 255, 256, 1000, 2048, 4000, 4095} {
		unit := make([]byte, period)
		for i := range unit {
			unit[i] = byte(r.Uint32())
		}
		pages[fmt.Sprintf("period-%d", period)] = bytes.Repeat(unit, PageSize/period+1)[:PageSize]
	}
	// Random then one long match to the end of the page.
	lm := fill(func(int) byte { return byte(r.Uint32()) })
	copy(lm[2048:], lm[:2048])
	pages["long-match-to-end"] = lm
	// A match ending exactly at the last byte, after literals.
	me := fill(func(int) byte { return byte(r.Uint32()) })
	copy(me[PageSize-100:], me[500:600])
	pages["match-ends-last-byte"] = me
	// A 3- to 5-byte match ending at the last byte.
	for _, l := range []int{3, 4, 5} {
		p := fill(func(int) byte { return byte(r.Uint32()) })
		copy(p[PageSize-l:], p[1000:1000+l])
		pages[fmt.Sprintf("short-match-%d-at-end", l)] = p
	}
	// Random with many short matches at varied offsets and lengths.
	for k, ml := range []int{3, 4, 5, 6, 8, 12, 20, 40, 130, 300, 1100} {
		p := fill(func(int) byte { return byte(r.Uint32()) })
		for pos := max(64, ml); pos+ml < PageSize; pos += ml + r.IntN(40) {
			src := r.IntN(pos - ml + 1)
			copy(p[pos:pos+ml], p[src:src+ml])
		}
		pages[fmt.Sprintf("matches-%d-%d", k, ml)] = p
	}
	// Many repeat offsets: records of a fixed stride with a changing field.
	rec := page()
	for i := 0; i+24 <= PageSize; i += 24 {
		binary.LittleEndian.PutUint64(rec[i:], 0x00007f12_3456_0000+uint64(i)*8)
		binary.LittleEndian.PutUint32(rec[i+8:], uint32(r.IntN(5)))
		copy(rec[i+12:], "rec:")
		binary.LittleEndian.PutUint32(rec[i+16:], uint32(i/24))
	}
	pages["records-24"] = rec
	// Pointer-like words: 8-byte values sharing high bytes.
	ptr := page()
	for i := 0; i < PageSize; i += 8 {
		binary.LittleEndian.PutUint64(ptr[i:], 0x00005555_55550000|uint64(r.IntN(1<<16))&^7)
	}
	pages["pointers"] = ptr
	// Sparse: mostly zero with a few random bytes.
	sp := page()
	for k := 0; k < 60; k++ {
		sp[r.IntN(PageSize)] = byte(r.Uint32())
	}
	pages["sparse"] = sp
	// Half random, half zero (long literal run then a long match).
	hz := page()
	for i := 0; i < PageSize/2; i++ {
		hz[i] = byte(r.Uint32())
	}
	pages["half-random"] = hz
	pages["half-random-reversed"] = reverse(hz)
	// Floats: a slow random walk.
	fl := page()
	x := 1.0
	for i := 0; i < PageSize; i += 8 {
		x += r.NormFloat64() * 1e-3
		binary.LittleEndian.PutUint64(fl[i:], math.Float64bits(x))
	}
	pages["float-walk"] = fl
	// Skewed byte distribution needing long Huffman codes (> 11 bits):
	// Fibonacci counts, 2 symbols per count, shuffled.
	fib := page()
	i := 0
	for s, a, b := 0, 1, 1; i < PageSize; s++ {
		for k := 0; k < a && i < PageSize; k++ {
			fib[i] = byte(s*97 + 5)
			i++
		}
		if s%2 == 1 {
			a, b = b, a+b
		}
	}
	r.Shuffle(len(fib), func(a, b int) { fib[a], fib[b] = fib[b], fib[a] })
	pages["skewed-geometric"] = fib
	// Literal counts around the 1-stream / 4-stream switch (1023/1024)
	// and the raw-header sizes (31/32).
	for _, nl := range []int{5, 31, 32, 33, 255, 1022, 1023, 1024, 1025, 4000} {
		p := page()
		for i := 0; i < nl; i++ {
			p[i] = byte(r.IntN(40))
		}
		pages[fmt.Sprintf("literals-%d", nl)] = p
	}
	return pages
}

func reverse(b []byte) []byte {
	out := make([]byte, len(b))
	for i, c := range b {
		out[len(b)-1-i] = c
	}
	return out
}

func sortedNames(m map[string][]byte) []string {
	names := make([]string, 0, len(m))
	for k := range m {
		names = append(names, k)
	}
	sort.Strings(names)
	return names
}

func TestEdgePages(t *testing.T) {
	pages := edgePages()
	for _, name := range sortedNames(pages) {
		page := pages[name]
		for _, opts := range variants {
			n := roundTrip(t, page, opts, PageSize)
			if opts == (Options{}) {
				t.Logf("%-28s %5d bytes", name, n)
			}
		}
	}
	// Incompressible pages are stored raw.
	for _, name := range []string{"random", "all-256-values-shuffled"} {
		if n := Compress(make([]byte, PageSize), pages[name], Options{}); n != 0 {
			t.Errorf("%s: compressed to %d bytes, want 0 (stored raw)", name, n)
		}
	}
	if n := Compress(make([]byte, PageSize), pages["zero"], Options{}); n != 11 {
		t.Errorf("zero page: %d bytes, want an 11-byte RLE-block frame", n)
	}
}

// TestSmallDst checks that every smaller room either holds the frame or
// gets 0, never a write past it.
func TestSmallDst(t *testing.T) {
	pages := edgePages()
	for _, name := range []string{"text", "records-24", "literals-1025", "period-7", "zero", "float-walk"} {
		page := pages[name]
		full := roundTrip(t, page, Options{}, PageSize)
		for _, cap := range []int{1, 5, 10, 11, 12, full / 2, full - 1, full, full + 1} {
			if cap < 1 {
				continue
			}
			n := roundTrip(t, page, Options{}, cap)
			if cap >= full && n != full {
				t.Errorf("%s: cap %d gave %d bytes, want %d", name, cap, n, full)
			}
			if cap < full && n != 0 {
				t.Errorf("%s: cap %d gave %d bytes, want 0", name, cap, n)
			}
		}
	}
}

func TestRandomPages(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	n := 3000
	if testing.Short() {
		n = 300
	}
	for k := 0; k < n; k++ {
		page := randomPage(r)
		roundTrip(t, page, variants[k%len(variants)], PageSize)
	}
}

// randomPage builds a page from random pieces: runs, copies of earlier
// bytes at random and repeated offsets, and random bytes from alphabets
// of varied sizes.
func randomPage(r *rand.Rand) []byte {
	p := make([]byte, 0, PageSize)
	alpha := 1 + r.IntN(256)
	base := byte(r.Uint32())
	var offs []int
	for len(p) < PageSize {
		switch r.IntN(5) {
		case 0:
			n := 1 + r.IntN(100)
			b := base + byte(r.IntN(alpha))
			for i := 0; i < n; i++ {
				p = append(p, b)
			}
		case 1, 2:
			if len(p) == 0 {
				continue
			}
			var off int
			if len(offs) > 0 && r.IntN(2) == 0 {
				off = offs[r.IntN(len(offs))]
			} else {
				off = 1 + r.IntN(len(p))
				offs = append(offs[max(0, len(offs)-3):], off)
			}
			if off > len(p) {
				continue
			}
			n := 3 + r.IntN([]int{4, 16, 300}[r.IntN(3)])
			for i := 0; i < n; i++ {
				p = append(p, p[len(p)-off])
			}
		default:
			n := 1 + r.IntN(60)
			for i := 0; i < n; i++ {
				p = append(p, base+byte(r.IntN(alpha)))
			}
		}
	}
	return p[:PageSize]
}

// fuzzPage truncates data to one page, or pads it: with zeros when zero
// is set, else by repeating it (so that matches appear).
func fuzzPage(data []byte, zero bool) []byte {
	page := make([]byte, PageSize)
	copy(page, data)
	if !zero && len(data) > 0 && len(data) < PageSize {
		// Repeat the input to fill the page, so matches appear.
		for i := len(data); i < PageSize; i++ {
			page[i] = page[i-len(data)]
		}
	}
	return page
}

func fuzzSeeds(f *testing.F) {
	pages := edgePages()
	for _, name := range []string{"text", "records-24", "skewed-geometric", "literals-1025", "period-13", "all-256-values", "pointers"} {
		f.Add(pages[name], uint8(0))
	}
	f.Add([]byte("abc"), uint8(3))
	f.Add([]byte{}, uint8(1))
	f.Add([]byte{0x80, 0x81, 0x00}, uint8(4))
	f.Add([]byte("zero-padded"), uint8(0x81))
}

func FuzzCompress(f *testing.F) {
	fuzzSeeds(f)
	f.Fuzz(func(t *testing.T, data []byte, v uint8) {
		roundTrip(t, fuzzPage(data, v&0x80 != 0), variants[int(v&0x7F)%len(variants)], PageSize)
	})
}

// FuzzDecodeCorrupt feeds damaged frames to the daemon's zstd decoder
// (pkg/codec, libzstd): it must fail or return a page, never crash.
func FuzzDecodeCorrupt(f *testing.F) {
	pages := edgePages()
	for i, name := range []string{"text", "records-24", "skewed-geometric", "literals-1025", "float-walk"} {
		f.Add(pages[name], uint16(i*37), uint8(1<<(i%8)), uint16(0))
	}
	f.Add([]byte("abc"), uint16(5), uint8(0xFF), uint16(3))
	dec, err := codec.NewZstd(1)
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, data []byte, pos uint16, xor uint8, cut uint16) {
		frame := make([]byte, PageSize)
		n := Compress(frame, fuzzPage(data, xor&1 != 0), Options{})
		if n == 0 {
			return
		}
		frame = frame[:n]
		if xor != 0 {
			frame[int(pos)%n] ^= xor
		}
		if c := int(cut) % n; cut != 0 {
			frame = frame[:n-c]
		}
		out := make([]byte, PageSize)
		_ = dec.Decompress(out, frame)
	})
}

// TestDecodeCorrupt runs the corruption check over every byte and bit of
// a few frames (what FuzzDecodeCorrupt does at random).
func TestDecodeCorrupt(t *testing.T) {
	pages := edgePages()
	dec, err := codec.NewZstd(1)
	if err != nil {
		t.Fatal(err)
	}
	out := make([]byte, PageSize)
	for _, name := range []string{"text", "records-24", "skewed-geometric", "literals-1025"} {
		frame := make([]byte, PageSize)
		n := Compress(frame, pages[name], Options{})
		frame = frame[:n]
		bad := 0
		step := 1
		if testing.Short() {
			step = 7
		}
		for i := 0; i < n; i += step {
			for bit := 0; bit < 8; bit++ {
				f := bytes.Clone(frame)
				f[i] ^= 1 << bit
				if dec.Decompress(out, f) != nil {
					bad++
				}
			}
		}
		for c := 1; c < n; c += step {
			if dec.Decompress(out, frame[:c]) == nil {
				t.Errorf("%s: frame cut to %d of %d bytes decoded", name, c, n)
			}
		}
		t.Logf("%s: %d-byte frame, %d of %d bit flips rejected", name, n, bad, 8*((n+step-1)/step))
	}
}

// fenced returns n bytes ending at an inaccessible page, with another
// inaccessible page before them, so that any access outside faults.
func fenced(tb testing.TB, n int) []byte {
	tb.Helper()
	size := (n + PageSize - 1) / PageSize * PageSize
	mem, err := unix.Mmap(-1, 0, size+2*PageSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = unix.Munmap(mem) })
	if err := unix.Mprotect(mem[:PageSize], unix.PROT_NONE); err != nil {
		tb.Fatal(err)
	}
	if err := unix.Mprotect(mem[PageSize+size:], unix.PROT_NONE); err != nil {
		tb.Fatal(err)
	}
	return mem[PageSize+size-n : PageSize+size : PageSize+size]
}

// TestFenced compresses pages that sit against inaccessible memory into
// rooms that end against it: a read outside the page or a write past the
// room faults.
func TestFenced(t *testing.T) {
	src := fenced(t, PageSize)
	pages := edgePages()
	for _, name := range sortedNames(pages) {
		copy(src, pages[name])
		for _, opts := range variants[:3] {
			full := Compress(make([]byte, PageSize), src, opts)
			for _, room := range []int{PageSize, full, full - 1, 11} {
				if room <= 0 {
					continue
				}
				dst := fenced(t, room)
				n := Compress(dst, src, opts)
				if n != 0 && n != full {
					t.Fatalf("%s: room %d gave %d bytes, want %d or 0", name, room, n, full)
				}
				if n > 0 {
					if got, err := zstd.Decompress(nil, dst[:n]); err != nil || !bytes.Equal(got, src) {
						t.Fatalf("%s: room %d: frame does not decode to the page (%v)", name, room, err)
					}
				}
			}
		}
	}
}

func TestLog2Table(t *testing.T) {
	if n := log2TableErrors(); n != 0 {
		t.Fatalf("%d entries of zp_log2q8_tab differ from zp_log2q8", n)
	}
}

// TestHuffmanDepths: zp_huf_mk's code is complete and optimal (its cost,
// the sum of count times depth, is a heap-built Huffman code's) on random
// ascending counts of 2 to 256 symbols, runs of equal counts among them.
func TestHuffmanDepths(t *testing.T) {
	rng := rand.New(rand.NewPCG(17, 25))
	for it := range 20000 {
		n := 2 + rng.IntN(255)
		counts := make([]uint16, n)
		spread := []int{3, 40, 4096 / n}[it%3]
		for i := range counts {
			counts[i] = uint16(1 + rng.IntN(spread))
		}
		slices.Sort(counts)
		depths := hufDepths(counts)
		var cost, want uint64
		kraft := 0.0
		for i, d := range depths {
			if d == 0 || d > 32 {
				t.Fatalf("counts %v: depth %d", counts, d)
			}
			cost += uint64(counts[i]) * uint64(d)
			kraft += math.Ldexp(1, -int(d))
		}
		h := &weights{}
		for _, c := range counts {
			heap.Push(h, uint64(c))
		}
		for h.Len() > 1 {
			a, b := heap.Pop(h).(uint64), heap.Pop(h).(uint64)
			want += a + b
			heap.Push(h, a+b)
		}
		if cost != want || kraft != 1 {
			t.Fatalf("counts %v: depths %v cost %d (Huffman: %d), Kraft sum %g", counts, depths, cost, want, kraft)
		}
	}
}

type weights []uint64

func (w weights) Len() int           { return len(w) }
func (w weights) Less(i, j int) bool { return w[i] < w[j] }
func (w weights) Swap(i, j int)      { w[i], w[j] = w[j], w[i] }
func (w *weights) Push(x any)        { *w = append(*w, x.(uint64)) }
func (w *weights) Pop() any {
	old := *w
	x := old[len(old)-1]
	*w = old[:len(old)-1]
	return x
}
