package codec

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"runtime"
	"testing"

	"github.com/gzramd/gzramd/internal/testneeds"
)

// dictPages makes n pages alike enough that a dictionary trained on some
// helps the others (words of a shared vocabulary, pointer-like words), and
// adds pages of the corpus where there is one.
func dictPages(tb testing.TB, r *rand.Rand, n int) []byte {
	vocab := make([][]byte, 200)
	for i := range vocab {
		vocab[i] = make([]byte, 8+r.IntN(56))
		for k := range vocab[i] {
			vocab[i][k] = byte(r.Uint32())
		}
	}
	pages := make([]byte, n*PageSize)
	for p := range n {
		page := pages[p*PageSize : (p+1)*PageSize]
		for i := 0; i < len(page); {
			switch r.IntN(5) {
			case 0: // pointer-like words
				v := uint64(0x7f3a00000000) + uint64(r.IntN(4096))*16
				for k := 0; k < 8 && i < len(page); k, i = k+1, i+1 {
					page[i] = byte(v >> (8 * k))
				}
			case 1: // noise
				page[i] = byte(r.Uint32())
				i++
			default:
				i += copy(page[i:], vocab[r.IntN(len(vocab))])
			}
		}
	}
	if data := testneeds.CorpusOr(tb, "made-up pages alone"); data != nil {
		for range n / 4 {
			off := r.IntN(len(data)/PageSize) * PageSize
			pages = append(pages, data[off:off+PageSize]...)
		}
	}
	return pages
}

// TestZstdDictDecode checks zstddec.c against the input on frames libzstd
// compresses with a trained dictionary, at several levels and frame sizes,
// for every length wanted near page boundaries: zstddec.c must decode them
// itself (its tables from the dictionary, matches into its content), not
// leave them to libzstd. A frame decodes with its own dictionary only.
func TestZstdDictDecode(t *testing.T) {
	zstdBothBuilds(t, testZstdDictDecode)
}

func testZstdDictDecode(t *testing.T) {
	r := rand.New(rand.NewPCG(35, 9))
	train, pages := dictPages(t, r, 600), dictPages(t, r, 64)
	raw, err := TrainZstdDict(train, PageSize, 16<<10)
	if err != nil {
		t.Fatal(err)
	}
	x, err := NewZstdDecoder(1)
	if err != nil {
		t.Fatal(err)
	}
	defer runtime.KeepAlive(x)
	ctx := x.ctxs.s[0].ctx
	frame := make([]byte, 64<<10)
	dst := make([]byte, 16<<10)
	for _, level := range []int{1, 3, 9, 15, 19} {
		d, err := NewZstdDict(raw, level)
		if err != nil {
			t.Fatal(err)
		}
		var in, out int
		for _, size := range []int{PageSize, 2 * PageSize, 4 * PageSize} {
			for at := 0; at+size <= len(pages); at += size {
				src := pages[at : at+size]
				n := d.Compress(frame, src)
				if n <= 0 {
					t.Fatalf("level %d: libzstd does not compress %d bytes with the dictionary", level, size)
				}
				in, out = in+size, out+n
				for want := 1; want <= size; want++ {
					if want != size && want%PageSize > 1 && want%PageSize < PageSize-1 && want%509 != 0 {
						continue
					}
					got := zdecDict(ctx.z, d, dst[:size], frame[:n], want)
					if got < want || got > size {
						t.Fatalf("level %d, %d-byte frame at %d: %d bytes wanted: zstddec returns %d", level, size, at, want, got)
					}
					if !bytes.Equal(dst[:got], src[:got]) {
						t.Fatalf("level %d, %d-byte frame at %d: %d bytes wanted: not the input", level, size, at, want)
					}
				}
				if err := x.DecompressDict(dst[:size], frame[:n], d, size); err != nil || !bytes.Equal(dst[:size], src) {
					t.Fatalf("level %d: DecompressDict: %v", level, err)
				}
			}
		}
		t.Logf("level %d: %.3f with the dictionary", level, float64(in)/float64(out))
		d.free()
	}

	// Another dictionary: its frames name another ID, and neither decoder
	// takes them with this one.
	other, err := TrainZstdDict(dictPages(t, rand.New(rand.NewPCG(1, 1)), 600), PageSize, 16<<10)
	if err != nil {
		t.Fatal(err)
	}
	d, err := NewZstdDict(raw, 0)
	if err != nil {
		t.Fatal(err)
	}
	o, err := NewZstdDict(other, 9)
	if err != nil {
		t.Fatal(err)
	}
	if d.ID() == o.ID() {
		t.Fatalf("two dictionaries with ID %d", d.ID())
	}
	n := o.Compress(frame, pages[:4*PageSize])
	if got := zdecDict(ctx.z, d, dst, frame[:n], len(dst)); got >= 0 {
		t.Errorf("zstddec decodes another dictionary's frame (%d bytes)", got)
	}
	if err := x.DecompressDict(dst[:4*PageSize], frame[:n], d, 4*PageSize); !errors.Is(err, ErrCorrupt) {
		t.Errorf("DecompressDict with another dictionary: %v, want ErrCorrupt", err)
	}
	// A frame with no dictionary decodes with one given.
	plain, err := NewZstd(3)
	if err != nil {
		t.Fatal(err)
	}
	n = plain.Compress(frame, pages[:PageSize])
	if err := x.DecompressDict(dst[:PageSize], frame[:n], d, PageSize); err != nil || !bytes.Equal(dst[:PageSize], pages[:PageSize]) {
		t.Errorf("a frame without a dictionary: %v", err)
	}
}

// TestZstdDictMutated decodes mutated frames and dictionaries: zstddec.c
// never decodes to other bytes than libzstd with the same dictionary, nor
// reads or writes outside its buffers (fenced by unmapped pages).
func TestZstdDictMutated(t *testing.T) {
	zstdBothBuilds(t, testZstdDictMutated)
}

func testZstdDictMutated(t *testing.T) {
	r := rand.New(rand.NewPCG(35, 10))
	raw, err := TrainZstdDict(dictPages(t, r, 600), PageSize, 16<<10)
	if err != nil {
		t.Fatal(err)
	}
	pages := dictPages(t, r, 32)
	x, err := NewZstdDecoder(1)
	if err != nil {
		t.Fatal(err)
	}
	defer runtime.KeepAlive(x)
	ctx := x.ctxs.s[0].ctx
	var seeds [][]byte
	for _, level := range []int{1, 9, 19} {
		d, err := NewZstdDict(raw, level)
		if err != nil {
			t.Fatal(err)
		}
		for at := 0; at+2*PageSize <= len(pages); at += 2 * PageSize {
			f := make([]byte, 3*PageSize)
			seeds = append(seeds, f[:d.Compress(f, pages[at:at+2*PageSize])])
		}
		d.free()
	}
	d, err := NewZstdDict(raw, 0)
	if err != nil {
		t.Fatal(err)
	}
	rounds := 20000
	if testing.Short() {
		rounds = 3000
	}
	const most = 16 << 10
	fenceIn, fenceOut, ref := fencedPages(t, most/PageSize), fencedPages(t, most/PageSize), make([]byte, most)
	decoded := 0
	for round := range rounds {
		frame := append([]byte{}, seeds[r.IntN(len(seeds))]...)
		for range 1 + r.IntN(3) {
			switch i := r.IntN(len(frame)); r.IntN(3) {
			case 0:
				frame[i] ^= 1 << r.IntN(8)
			case 1:
				frame[i] = byte(r.Uint32())
			default:
				frame = frame[:i+1]
			}
		}
		src := fenceIn[most-len(frame):]
		copy(src, frame)
		n := libzstdDecodeDict(ctx.d, d, ref, src)
		if n <= 0 {
			n = 2 * PageSize
		}
		want := 1 + r.IntN(n)
		dst := fenceOut[most-n:]
		got := zdecDict(ctx.z, d, dst, src, want)
		if got < 0 {
			continue
		}
		if got > n {
			t.Fatalf("round %d: %d bytes out of %d", round, got, n)
		}
		if libzstdDecodeDict(ctx.d, d, ref, src) < 0 {
			continue // libzstd rejects what zstddec.c stopped short of reading
		}
		if !bytes.Equal(dst[:min(got, n)], ref[:min(got, n)]) {
			t.Fatalf("round %d: %d bytes out for %d wanted of %d: not libzstd's", round, got, want, n)
		}
		decoded++
	}
	t.Logf("%d of %d mutated frames decoded, as libzstd does", decoded, rounds)
}
