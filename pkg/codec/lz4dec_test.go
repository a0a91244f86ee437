package codec

import (
	"bytes"
	"encoding/binary"
	"errors"
	"math/rand/v2"
	"testing"

	"github.com/gzramd/gzramd/internal/lz4oracle"
	"github.com/gzramd/gzramd/internal/testneeds"
)

// errModel is decodeModel's only error.
var errModel = errors.New("model: malformed block")

// decodeModel decodes the LZ4 block src into dst by the rules lz4dec.c
// keeps, byte by byte and without any of its shortcuts: the tests' own
// oracle for what gzramd's decoder accepts and what it writes. liblz4 is
// the other (it accepts a few blocks these rules refuse, offset 0 among
// them).
func decodeModel(dst, src []byte) error {
	ip, op := 0, 0
	readLen := func(n int) (int, error) {
		for {
			if ip >= len(src) {
				return 0, errModel
			}
			b := src[ip]
			ip++
			n += int(b)
			if b != 255 {
				return n, nil
			}
		}
	}
	for {
		if ip >= len(src) {
			return errModel
		}
		token := src[ip]
		ip++
		lit := int(token >> 4)
		var err error
		if lit == 15 {
			if lit, err = readLen(lit); err != nil {
				return err
			}
		}
		if lit > len(src)-ip || lit > len(dst)-op {
			return errModel
		}
		op += copy(dst[op:op+lit], src[ip:ip+lit])
		ip += lit
		if ip == len(src) {
			if op != len(dst) {
				return errModel
			}
			return nil
		}
		if len(dst)-op < 12 || len(src)-ip < 2 {
			return errModel
		}
		off := int(binary.LittleEndian.Uint16(src[ip:]))
		ip += 2
		if off == 0 || off > op {
			return errModel
		}
		ml := int(token & 15)
		if ml == 15 {
			if ml, err = readLen(ml); err != nil {
				return err
			}
		}
		ml += 4
		if ml > len(dst)-op-5 {
			return errModel
		}
		for i := range ml {
			dst[op+i] = dst[op+i-off]
		}
		op += ml
	}
}

// fencedDecoder decodes with gzramd's decoder from input that ends where
// an inaccessible page begins into output that does the same (and, for a
// page, starts where one ends): a read or write out of bounds faults.
type fencedDecoder struct {
	c        *LZ4
	in, out  []byte
	poisoned []byte // out as poisoned before each decode
}

const maxFencedInput = 2 * PageSize

func newFencedDecoder(tb testing.TB) *fencedDecoder {
	return &fencedDecoder{c: NewLZ4(), in: fencedPages(tb, 2), out: fencedPages(tb, 2)}
}

// decode decodes src to a buffer of n bytes and returns it (valid until
// the next call) with Decompress's error.
func (f *fencedDecoder) decode(src []byte, n int) ([]byte, error) {
	if len(src) > maxFencedInput {
		src = src[:maxFencedInput]
	}
	in := f.in[len(f.in)-len(src):]
	copy(in, src)
	out := f.out[len(f.out)-n:]
	for i := range out {
		out[i] = 0xa5
	}
	return out, f.c.Decompress(out, in)
}

// checkDecode decodes src to n bytes with gzramd's decoder, fenced, and
// fails t unless it agrees with decodeModel, in verdict and bytes, and,
// when the oracle is built in, any block it accepts decodes the same with
// liblz4. It reports whether the block decoded.
func checkDecode(t testing.TB, f *fencedDecoder, src []byte, n int) bool {
	t.Helper()
	got, err := f.decode(src, n)
	if err != nil && !errors.Is(err, ErrCorrupt) {
		t.Fatalf("decode: error %v is not ErrCorrupt", err)
	}
	want := make([]byte, n)
	werr := decodeModel(want, src)
	if (err == nil) != (werr == nil) {
		t.Fatalf("decode of % x to %d bytes: gzramd says %v, the model %v", head(src), n, err, werr)
	}
	if err != nil {
		return false
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("decode of % x to %d bytes: gzramd and the model disagree on the bytes", head(src), n)
	}
	if lz4oracle.Available { // the callers say when it is not (lz4oracle.Check)
		ref := make([]byte, n)
		if lerr := lz4oracle.Decompress(ref, src); lerr != nil || !bytes.Equal(ref, got) {
			t.Fatalf("decode of % x to %d bytes: gzramd accepts a block liblz4 does not decode the same (err %v)", head(src), n, lerr)
		}
	}
	return true
}

// notDecodedByLiblz4 is what an LZ4 test without the liblz4 oracle does
// not check (lz4oracle.Check).
const notDecodedByLiblz4 = "the blocks not also decoded with liblz4"

func head(b []byte) []byte { return b[:min(len(b), 24)] }

// blockWriter writes LZ4 sequences, valid or not, for the tests.
type blockWriter struct{ b []byte }

func (w *blockWriter) length(n int) {
	for ; n >= 255; n -= 255 {
		w.b = append(w.b, 255)
	}
	w.b = append(w.b, byte(n))
}

// seq writes a sequence: literals, then a match of ml bytes (4 or more)
// at offset off.
func (w *blockWriter) seq(lits []byte, off, ml int) *blockWriter {
	tok := byte(min(len(lits), 15)<<4) | byte(min(ml-4, 15))
	w.b = append(w.b, tok)
	if len(lits) >= 15 {
		w.length(len(lits) - 15)
	}
	w.b = append(w.b, lits...)
	w.b = binary.LittleEndian.AppendUint16(w.b, uint16(off))
	if ml-4 >= 15 {
		w.length(ml - 4 - 15)
	}
	return w
}

// last writes the last sequence: literals alone.
func (w *blockWriter) last(lits []byte) []byte {
	w.b = append(w.b, byte(min(len(lits), 15)<<4))
	if len(lits) >= 15 {
		w.length(len(lits) - 15)
	}
	w.b = append(w.b, lits...)
	return w.b
}

func randomBytes(r *rand.Rand, n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

// TestLZ4DecodeBlocks decodes hand-made blocks, valid and malformed, each
// to exactly one page unless it says otherwise.
func TestLZ4DecodeBlocks(t *testing.T) {
	lz4oracle.Check(t, notDecodedByLiblz4)
	r := rand.New(rand.NewPCG(11, 12))
	lits := randomBytes(r, 2*PageSize)
	w := func() *blockWriter { return &blockWriter{} }
	cases := []struct {
		name  string
		block []byte
		n     int // output length; 0 means PageSize
		ok    bool
	}{
		{"literals only", w().last(lits[:PageSize]), 0, true},
		{"one literal and a run", w().seq(lits[:1], 1, PageSize-6).last(lits[:5]), 0, true},
		{"longest match allowed", w().seq(lits[:8], 8, PageSize-8-5).last(lits[:5]), 0, true},
		{"match into the last 5 bytes", w().seq(lits[:8], 8, PageSize-8-4).last(lits[:4]), 0, false},
		{"match starting 11 bytes from the end", w().seq(lits[:PageSize-11], 7, 4).last(lits[:7]), 0, false},
		{"match starting 12 bytes from the end", w().seq(lits[:PageSize-12], 7, 4).last(lits[:8]), 0, true},
		{"offset 0", w().seq(lits[:8], 0, 4).last(lits[:PageSize-12]), 0, false},
		{"offset before the output", w().seq(lits[:8], 9, 4).last(lits[:PageSize-12]), 0, false},
		{"offset at the output's start", w().seq(lits[:8], 8, 4).last(lits[:PageSize-12]), 0, true},
		{"decodes a byte short", w().last(lits[:PageSize-1]), 0, false},
		{"decodes a byte long", w().last(lits[:PageSize+1]), 0, false},
		{"match past the output", w().seq(lits[:8], 8, PageSize).last(lits[:5]), 0, false},
		{"literals past the input", w().last(lits[:100])[:90], 0, false},
		{"bytes after the last literals", append(w().last(lits[:PageSize]), 0), 0, false},
		{"no offset after literals", w().seq(lits[:20], 1, 4).b[:22], 0, false},
		{"half an offset", w().seq(lits[:20], 1, 4).b[:23], 0, false},
		{"match length bytes cut", w().seq(lits[:20], 1, 2000).b[:26], 0, false},
		{"literal length bytes cut", []byte{0xf0, 255, 255}, 0, false},
		{"endless literal length", append([]byte{0xf0}, bytes.Repeat([]byte{255}, 3*PageSize)...), 0, false},
		{"empty output", []byte{0}, 1, false},
		{"token alone", []byte{0}, 0, false},
		{"nothing", nil, 0, false},
		{"a short output", w().seq(lits[:4], 4, 20).last(lits[:12]), 36, true},
		{"a 3-byte output", w().last(lits[:3]), 3, true},
	}
	f := newFencedDecoder(t)
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			n := tc.n
			if n == 0 {
				n = PageSize
			}
			if got := checkDecode(t, f, tc.block, n); got != tc.ok {
				t.Errorf("decoded: %v, want %v", got, tc.ok)
			}
		})
	}
}

// TestLZ4DecodeOffsets decodes matches at every short offset, and some
// long ones, of every length around the copy steps, at several distances
// from the end of the page.
func TestLZ4DecodeOffsets(t *testing.T) {
	lz4oracle.Check(t, notDecodedByLiblz4)
	r := rand.New(rand.NewPCG(13, 14))
	f := newFencedDecoder(t)
	var decoded int
	for off := 1; off <= 70; off++ {
		for _, ml := range []int{4, 5, 7, 8, 9, 15, 16, 17, 18, 19, 20, 24, 31, 32, 33, 34, 47, 48, 49, 64, 65, 100, 300} {
			for _, tail := range []int{5, 6, 12, 17, 30, 31, 32, 33, 48, 64, 65, 100} {
				head := PageSize - off - ml - tail
				w := &blockWriter{}
				w.seq(randomBytes(r, head), 1+r.IntN(min(head, 65535)), 4)
				block := w.seq(randomBytes(r, off), off, ml).last(randomBytes(r, tail-4))
				if checkDecode(t, f, block, PageSize) {
					decoded++
				}
			}
		}
	}
	if decoded == 0 {
		t.Fatal("no block decoded")
	}
	t.Logf("%d blocks decoded", decoded)
}

// TestLZ4DecodesLiblz4 decodes liblz4's blocks of the edge pages and the
// corpus with gzramd's decoder.
func TestLZ4DecodesLiblz4(t *testing.T) {
	lz4oracle.Require(t)
	f := newFencedDecoder(t)
	buf := make([]byte, lz4oracle.CompressBound(PageSize))
	check := func(name string, page []byte) {
		n := lz4oracle.Compress(buf, page)
		if n == 0 {
			t.Fatalf("%s: liblz4 did not compress the page", name)
		}
		got, err := f.decode(buf[:n], PageSize)
		if err != nil || !bytes.Equal(got, page) {
			t.Fatalf("%s: liblz4's %d-byte block does not decode to the page (err %v)", name, n, err)
		}
	}
	for name, page := range lz4EdgePages() {
		check(name, page)
	}
	data := testneeds.Corpus(t)
	step := PageSize
	if testing.Short() {
		step = 8 * PageSize
	}
	for off := 0; off+PageSize <= len(data); off += step {
		check("corpus", data[off:off+PageSize])
	}
}

// TestLZ4DecodeCorrupted decodes every truncation of some compressed
// pages, which must fail, and random corruptions of them, which must
// decode as the model says or fail, without a fault.
func TestLZ4DecodeCorrupted(t *testing.T) {
	lz4oracle.Check(t, notDecodedByLiblz4)
	r := rand.New(rand.NewPCG(15, 16))
	f := newFencedDecoder(t)
	c := NewLZ4()
	var pages [][]byte
	for _, p := range lz4EdgePages() {
		pages = append(pages, p)
	}
	most, rounds := 200, 200
	if testing.Short() {
		most, rounds = 40, 40
	}
	data := testneeds.CorpusOr(t, "the edge pages only were corrupted")
	for off := 0; off+PageSize <= len(data) && len(pages) < most; off += 117 * PageSize {
		pages = append(pages, data[off:off+PageSize])
	}
	buf := make([]byte, PageSize-1)
	var accepted int
	for _, page := range pages {
		n := c.Compress(buf, page)
		if n == 0 {
			continue
		}
		block := append([]byte(nil), buf[:n]...)
		for cut := range n {
			if checkDecode(t, f, block[:cut], PageSize) {
				t.Fatalf("a block cut to %d of its %d bytes decoded", cut, n)
			}
		}
		bad := make([]byte, n)
		for range rounds {
			copy(bad, block)
			for range 1 + r.IntN(4) {
				i := r.IntN(n)
				switch r.IntN(4) {
				case 0:
					bad[i] = byte(r.Uint32())
				case 1:
					bad[i] ^= 1 << r.IntN(8)
				case 2:
					bad[i] = 0
				case 3:
					bad[i] = 255
				}
			}
			if checkDecode(t, f, bad, PageSize) {
				accepted++
			}
		}
	}
	t.Logf("%d pages, %d corruptions each, %d decoded (as the model says)", len(pages), rounds, accepted)
}

// TestLZ4OtherSizes compresses inputs other than a page, which go through
// the page compressor's code for any length up to 64 KiB, and decodes
// them with gzramd's decoder and liblz4.
func TestLZ4OtherSizes(t *testing.T) {
	oracle := lz4oracle.Check(t, notDecodedByLiblz4)
	r := rand.New(rand.NewPCG(17, 18))
	c := NewLZ4()
	for _, n := range []int{1, 2, 5, 11, 12, 13, 14, 15, 16, 17, 31, 64, 100, 1000, PageSize - 1, PageSize + 1, 3 * PageSize, 65535, 65536} {
		src := make([]byte, n)
		for i := range src {
			src[i] = byte(r.IntN(1 + i%7)) // compressible, and not only zeros
		}
		dst := make([]byte, n+n/255+16)
		m := c.Compress(dst, src)
		if m == 0 {
			t.Fatalf("%d bytes: not compressed into %d", n, len(dst))
		}
		got := make([]byte, n)
		if err := c.Decompress(got, dst[:m]); err != nil || !bytes.Equal(got, src) {
			t.Fatalf("%d bytes: round trip failed (err %v)", n, err)
		}
		if err := decodeModel(got, dst[:m]); err != nil || !bytes.Equal(got, src) {
			t.Fatalf("%d bytes: the model does not decode the block (err %v)", n, err)
		}
		if oracle {
			clear(got)
			if err := lz4oracle.Decompress(got, dst[:m]); err != nil || !bytes.Equal(got, src) {
				t.Fatalf("%d bytes: liblz4 does not decode the block (err %v)", n, err)
			}
		}
	}
	if m := c.Compress(make([]byte, 1<<17), make([]byte, 65537)); m != 0 {
		t.Errorf("an input over 64 KiB compressed to %d bytes, want 0 (kept raw)", m)
	}
}

// FuzzLZ4Decode decodes arbitrary input to an arbitrary length, fenced:
// gzramd's decoder must agree with the model and never touch memory
// outside its buffers.
func FuzzLZ4Decode(f *testing.F) {
	lz4oracle.Check(f, notDecodedByLiblz4)
	c := NewLZ4()
	buf := make([]byte, PageSize-1)
	for _, page := range lz4EdgePages() {
		if n := c.Compress(buf, page); n > 0 {
			f.Add(append([]byte(nil), buf[:n]...), uint16(PageSize))
		}
	}
	f.Add([]byte{0x1f, 0, 1, 0, 0x50, 1, 2, 3, 4, 5}, uint16(24))
	f.Add([]byte{0xf0, 255, 255, 1}, uint16(PageSize))
	fd := newFencedDecoder(f)
	f.Fuzz(func(t *testing.T, src []byte, n uint16) {
		size := 1 + int(n)%(2*PageSize)
		checkDecode(t, fd, src, size)
		// Decoded only as far as half of it: never outside the
		// buffers, and right as far as it goes when the model decodes
		// the block whole.
		got, want := fd.out[len(fd.out)-size:], make([]byte, size)
		in := fd.in[len(fd.in)-min(len(src), maxFencedInput):]
		if err := fd.c.DecompressPrefix(got, in, size/2); err == nil && decodeModel(want, src[:len(in)]) == nil && !bytes.Equal(got[:size/2], want[:size/2]) {
			t.Fatalf("a prefix of %d of %d bytes differs from the model's", size/2, size)
		}
	})
}

// TestLZ4DecodePrefix decodes blocks of several pages only as far as a
// reader of one page needs: the bytes it asked for are right, for every
// length asked; a block corrupted only after them still yields them; and
// one corrupted or cut before them fails or yields what the model
// decodes, never a fault (the output is fenced).
func TestLZ4DecodePrefix(t *testing.T) {
	r := rand.New(rand.NewPCG(21, 22))
	c := NewLZ4()
	data := testneeds.CorpusOr(t, "generated pages used instead")
	for round := range 40 {
		n := (1 + r.IntN(16)) * PageSize
		src := make([]byte, n)
		if data != nil && len(data) >= n {
			off := r.IntN(len(data)/PageSize-n/PageSize+1) * PageSize
			copy(src, data[off:off+n])
		} else {
			for i := range src {
				src[i] = byte(r.IntN(1 + i%13))
			}
		}
		block := make([]byte, n)
		m := c.Compress(block, src)
		if m == 0 {
			continue
		}
		block = block[:m]
		out := fencedPages(t, n/PageSize)
		for _, want := range []int{0, 1, PageSize - 1, PageSize, r.IntN(n + 1), n - 1, n} {
			for i := range out {
				out[i] = 0xa5
			}
			if err := c.DecompressPrefix(out, block, want); err != nil {
				t.Fatalf("round %d: a block of %d bytes decoded to %d: %v", round, n, want, err)
			}
			if !bytes.Equal(out[:want], src[:want]) {
				t.Fatalf("round %d: the first %d of %d bytes differ", round, want, n)
			}
		}
		// Cut short, the block may still give a prefix, or fail; it
		// must not fault, and what it gives must be right.
		for range 20 {
			cut, want := r.IntN(m), r.IntN(n+1)
			for i := range out {
				out[i] = 0xa5
			}
			if err := c.DecompressPrefix(out, block[:cut], want); err == nil && !bytes.Equal(out[:want], src[:want]) {
				t.Fatalf("round %d: a block cut to %d of %d bytes gave a wrong prefix of %d", round, cut, m, want)
			}
		}
	}
}
