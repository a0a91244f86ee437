package codec

import (
	"bytes"
	"math/rand/v2"
	"strconv"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/gzramd/gzramd/internal/lz4oracle"
	"github.com/gzramd/gzramd/internal/testneeds"
)

// guard fills the bytes past a compressor's limit, which it must not touch.
const guard = 0x5c

// fencedPage returns a page of memory with inaccessible pages on both
// sides, so that a compressor reading outside its input faults.
func fencedPage(tb testing.TB) []byte { return fencedPages(tb, 1) }

// fencedPages returns n pages of memory with inaccessible pages on both
// sides, so that code reading or writing outside them faults.
func fencedPages(tb testing.TB, n int) []byte {
	tb.Helper()
	mem, err := unix.Mmap(-1, 0, (n+2)*PageSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = unix.Munmap(mem) })
	if err := unix.Mprotect(mem[:PageSize], unix.PROT_NONE); err != nil {
		tb.Fatal(err)
	}
	if err := unix.Mprotect(mem[(n+1)*PageSize:], unix.PROT_NONE); err != nil {
		tb.Fatal(err)
	}
	return mem[PageSize : (n+1)*PageSize : (n+1)*PageSize]
}

// compressBounded compresses page, copied into fence (from fencedPage),
// with limit bytes of room followed by guard bytes, and fails the test if
// any guard byte changed or a result does not decode to page with gzramd's
// decoder and, when the oracle is built in, with liblz4. It returns the
// compressed length, 0 if the page did not fit.
func compressBounded(t testing.TB, c *LZ4, fence, page []byte, limit int) int {
	t.Helper()
	copy(fence, page)
	buf := bytes.Repeat([]byte{guard}, limit+64)
	n := c.Compress(buf[:limit], fence)
	for i, b := range buf[limit:] {
		if b != guard {
			t.Fatalf("limit %d: wrote byte %d past the limit", limit, i)
		}
	}
	if n < 0 || n > limit {
		t.Fatalf("limit %d: returned length %d", limit, n)
	}
	if n > 0 {
		got := make([]byte, PageSize)
		if err := c.Decompress(got, buf[:n]); err != nil || !bytes.Equal(got, page) {
			t.Fatalf("limit %d: %d compressed bytes do not decode to the page (err %v)", limit, n, err)
		}
		if lz4oracle.Available { // the callers say when it is not (lz4oracle.Check)
			clear(got)
			if err := lz4oracle.Decompress(got, buf[:n]); err != nil || !bytes.Equal(got, page) {
				t.Fatalf("limit %d: %d compressed bytes do not decode with liblz4 to the page (err %v)", limit, n, err)
			}
		}
	}
	return n
}

func lz4EdgePages() map[string][]byte {
	pages := edgePages()
	r := rand.New(rand.NewPCG(7, 8))
	for _, period := range []int{1, 2, 3, 4, 5, 7, 8, 9, 15, 16, 17, 64, 255, 4095} {
		unit := make([]byte, period)
		for i := range unit {
			unit[i] = byte(r.Uint32())
		}
		pages["period-"+strconv.Itoa(period)] = bytes.Repeat(unit, PageSize/period+1)[:PageSize]
	}
	// Short matches separated by short literals, the shape of pointer arrays.
	ptrs := make([]byte, PageSize)
	for i := 0; i < PageSize; i += 8 {
		v := uint64(0x00007f1234560000) + uint64(r.IntN(1<<16))
		for k := range 8 {
			ptrs[i+k] = byte(v >> (8 * k))
		}
	}
	pages["pointers"] = ptrs
	// A match running into the last bytes, which must stay literals.
	tail := make([]byte, PageSize)
	for i := range tail[:PageSize-20] {
		tail[i] = byte(r.Uint32())
	}
	pages["zero-tail"] = tail
	// Long literal runs (over 255 bytes) between matches.
	lits := make([]byte, PageSize)
	for i := range lits {
		if (i/600)%2 == 0 {
			lits[i] = byte(r.Uint32())
		}
	}
	pages["long-literals"] = lits
	return pages
}

// TestLZ4PageLimits checks every limit around each edge page's compressed
// length: the page fits exactly from that length on, the output is the same
// at every limit it fits in, and nothing is written past the limit.
func TestLZ4PageLimits(t *testing.T) {
	oracle := lz4oracle.Check(t, notDecodedByLiblz4+", nor their lengths compared with liblz4's")
	c, fence := NewLZ4(), fencedPage(t)
	for name, page := range lz4EdgePages() {
		t.Run(name, func(t *testing.T) {
			full := compressBounded(t, c, fence, page, 2*PageSize)
			if full == 0 {
				t.Fatal("did not fit in twice a page")
			}
			for _, limit := range []int{0, 1, 5, full - 2, full - 1, full, full + 1, full + 7, PageSize - 1, PageSize} {
				if limit < 0 {
					continue
				}
				n := compressBounded(t, c, fence, page, limit)
				switch {
				case limit >= full && n != full:
					t.Errorf("limit %d: length %d, want %d", limit, n, full)
				case limit < full && n != 0:
					t.Errorf("limit %d: length %d, want 0 (full length %d)", limit, n, full)
				}
			}
			if !oracle {
				return
			}
			ref := lz4oracle.Compress(make([]byte, lz4oracle.CompressBound(PageSize)), page)
			if full > ref+ref/8+16 {
				t.Errorf("compressed to %d bytes, liblz4 to %d", full, ref)
			}
		})
	}
}

// TestLZ4CorpusAgainstLiblz4 decodes every corpus page gzramd compresses
// with liblz4 and checks the ratio at the daemon's limit is at least
// liblz4's.
func TestLZ4CorpusAgainstLiblz4(t *testing.T) {
	lz4oracle.Require(t)
	data := testneeds.Corpus(t)
	if testing.Short() {
		data = data[:min(len(data), 2048*PageSize)]
	}
	c, fence := NewLZ4(), fencedPage(t)
	var total int64
	for off := 0; off < len(data); off += PageSize {
		if n := compressBounded(t, c, fence, data[off:off+PageSize], daemonLimit); n > 0 {
			total += int64(n)
		} else {
			total += PageSize
		}
	}
	ours := float64(len(data)) / float64(total)
	ref := float64(len(data)) / float64(lz4oracle.CompressPages(data, PageSize, daemonLimit))
	t.Logf("ratio at limit %d: gzramd %.4f, liblz4 %.4f", daemonLimit, ours, ref)
	if ours < ref {
		t.Errorf("ratio %.4f below liblz4's %.4f", ours, ref)
	}
}

// FuzzLZ4Page compresses arbitrary pages (the input repeated to PageSize)
// under arbitrary limits: no byte past the limit may change and every
// result must decode, with gzramd's decoder and with liblz4.
func FuzzLZ4Page(f *testing.F) {
	f.Add([]byte{0}, uint16(PageSize-1))
	f.Add([]byte("gzramd compresses pages. "), uint16(100))
	f.Add([]byte{1, 2, 3, 4, 5, 6, 7, 8, 9}, uint16(3263))
	f.Add(bytes.Repeat([]byte{0xff, 0, 0x7f, 0x12}, 300), uint16(40))
	r := rand.New(rand.NewPCG(9, 10))
	random := make([]byte, PageSize)
	for i := range random {
		random[i] = byte(r.Uint32())
	}
	f.Add(random, uint16(PageSize))
	f.Add(random[:PageSize-300], uint16(PageSize-1))
	lz4oracle.Check(f, notDecodedByLiblz4)
	c, fence := NewLZ4(), fencedPage(f)
	f.Fuzz(func(t *testing.T, in []byte, limit uint16) {
		if len(in) == 0 {
			return
		}
		page := bytes.Repeat(in, PageSize/len(in)+1)[:PageSize]
		compressBounded(t, c, fence, page, int(limit)%(PageSize+256))
	})
}
