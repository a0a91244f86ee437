package codec

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"os"
	"runtime"
	"testing"

	kzstd "github.com/klauspost/compress/zstd"

	"github.com/gzramd/gzramd/internal/testneeds"
	"github.com/gzramd/gzramd/internal/zstddeep"
	"github.com/gzramd/gzramd/internal/zstdpage"
)

// zstdInputs returns made-up inputs of 1 B to 64 KiB, of the kinds that
// steer an encoder to each literals and sequences mode (random bytes
// give raw literals, runs RLE blocks and literals, text Huffman codes of
// few symbols), and slices of the corpus when there is one: 16 KiB as
// the dense tier stores them, and a few of 64 KiB.
func zstdInputs(tb testing.TB, r *rand.Rand) [][]byte {
	var in [][]byte
	words := []string{"swap ", "page ", "gzramd ", "zram ", "frame ", "\x00\x00\x00\x00", "0123456789", "\xff\xfe"}
	for _, n := range []int{1, 2, 3, 7, 31, 100, 255, 1000, 4095, 4096, 5000, 16384, 32768, 65536} {
		random, text, runs, mixed, words8 := make([]byte, n), make([]byte, n), make([]byte, n), make([]byte, n), make([]byte, n)
		for i := range random {
			random[i] = byte(r.Uint32())
		}
		for i := 0; i < n; {
			i += copy(text[i:], words[r.IntN(len(words))])
		}
		for i := range runs {
			runs[i] = byte(i / 700)
		}
		for i := range mixed {
			if i/512%2 == 0 {
				mixed[i] = byte(r.Uint32())
			} else {
				mixed[i] = text[i]
			}
		}
		// Pointer-like words: small offsets and repeats of varied kinds.
		for i := 0; i+8 <= n; i += 8 {
			v := uint64(0x7f0000000000) + uint64(r.IntN(64))*8
			if r.IntN(4) == 0 {
				v = 0
			}
			for k := range 8 {
				words8[i+k] = byte(v >> (8 * k))
			}
		}
		in = append(in, random, text, runs, mixed, words8)
	}
	if data := testneeds.CorpusOr(tb, "made-up inputs alone"); data != nil {
		for range 12 {
			off := r.IntN(len(data)/PageSize-4) * PageSize
			in = append(in, data[off:off+4*PageSize])
		}
		for range 3 {
			off := r.IntN(len(data)/PageSize-16) * PageSize
			in = append(in, data[off:off+16*PageSize])
		}
	}
	return in
}

// zstdCheck decodes frame with zstddec.c for want = every length up to
// its content's (every step-th, and those around page boundaries, when
// step > 1), and fails unless each decode gives at least want bytes of
// libzstd's output, byte for byte.
func zstdCheck(t *testing.T, x *ZstdDecoder, name string, frame []byte, step int) {
	t.Helper()
	// x's cleanup frees the contexts once x is unreachable, ctx or not.
	defer runtime.KeepAlive(x)
	ctx := x.ctxs.s[0].ctx
	ref := make([]byte, 1<<17)
	n := libzstdDecode(ctx, ref, frame)
	if n <= 0 {
		t.Fatalf("%s: libzstd does not decode the frame", name)
	}
	ref = ref[:n]
	dst, fill := make([]byte, n), bytes.Repeat([]byte{0xa5}, n)
	if n > zdecMaxLiterals && zdec(ctx, dst, frame, n) == zdecTooLarge {
		return // a block of more literals than it holds: libzstd's
	}
	check := func(want int) {
		copy(dst, fill) // one call, not a loop the race detector checks byte by byte
		r := zdec(ctx, dst, frame, want)
		if r < want || r > n {
			t.Fatalf("%s: %d bytes wanted of %d: zstddec returns %d", name, want, n, r)
		}
		if !bytes.Equal(dst[:r], ref[:r]) {
			i := 0
			for dst[i] == ref[i] {
				i++
			}
			t.Fatalf("%s: %d bytes wanted of %d: byte %d differs from libzstd's", name, want, n, i)
		}
	}
	check(n)
	for want := 1; want < n; want++ {
		if step == 1 || want%step == 0 || want%PageSize <= 1 || want%PageSize == PageSize-1 {
			check(want)
		}
	}
}

// TestZstdDecodeLibzstd checks zstddec.c against libzstd on frames libzstd
// makes at every level, negative ones too, in one block and in blocks of
// a page and of 1000 bytes (one frame decodes over several blocks, whose
// tables repeat), and on frames of klauspost/compress's encoder, which
// has a window descriptor, a checksum, and choices of its own.
func TestZstdDecodeLibzstd(t *testing.T) {
	r := rand.New(rand.NewPCG(35, 1))
	x, err := NewZstdDecoder(1)
	if err != nil {
		t.Fatal(err)
	}
	inputs := zstdInputs(t, r)
	levels := []int{-7, -3, -1, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19}
	blocks := []int{0, PageSize, 1024}
	if testing.Short() {
		levels, blocks = []int{-3, 1, 5, 19}, []int{0, PageSize}
	}
	frame := make([]byte, 1<<17+1024)
	frames := 0
	for _, level := range levels {
		for _, block := range blocks {
			o, err := NewZstdObjects(level, 64<<10, block)
			if err != nil {
				t.Fatal(err)
			}
			for i, in := range inputs {
				// Every input at a few levels, a share of them at the rest.
				if level%4 != 1 && r.IntN(4) != 0 {
					continue
				}
				n := o.Compress(frame, in)
				if n == 0 {
					t.Fatalf("level %d: %d bytes do not compress", level, len(in))
				}
				// Every want for some of the dense tier's frames (level 5,
				// one block); fewer for long inputs.
				step := 97
				if len(in) > PageSize {
					step = 251
				}
				if len(in) > 4*PageSize {
					step = 1021
				}
				if len(in) == 4*PageSize && i%5 == 0 && block == 0 && level == 5 {
					step = 1
				}
				zstdCheck(t, x, fmt.Sprintf("level %d, blocks of %d, input %d (%d bytes)", level, block, i, len(in)), frame[:n], step)
				frames++
			}
		}
	}
	for _, level := range []kzstd.EncoderLevel{kzstd.SpeedFastest, kzstd.SpeedDefault, kzstd.SpeedBetterCompression, kzstd.SpeedBestCompression} {
		for _, crc := range []bool{true, false} {
			e, err := kzstd.NewWriter(nil, kzstd.WithEncoderLevel(level), kzstd.WithEncoderCRC(crc), kzstd.WithSingleSegment(!crc))
			if err != nil {
				t.Fatal(err)
			}
			for i, in := range inputs {
				f := e.EncodeAll(in, nil)
				zstdCheck(t, x, fmt.Sprintf("klauspost %v crc %v, input %d (%d bytes)", level, crc, i, len(in)), f, 97)
				frames++
			}
			e.Close()
		}
	}
	t.Logf("%d frames", frames)
}

// TestZstdDecodeDeep checks zstddec.c on the GPU encoders' frames, from
// their host builds: zstd_deep.h's optimal parse of up to 4 pages, and
// zstd_page.h's pages.
func TestZstdDecodeDeep(t *testing.T) {
	zstdBothBuilds(t, testZstdDecodeDeep)
}

// zstdBothBuilds runs test with zstddec.c's build for BMI2, where the
// processor has it, and with its plain build.
func zstdBothBuilds(t *testing.T, test func(t *testing.T)) {
	was := zdecUseBMI2(true)
	defer zdecUseBMI2(was)
	if zdecUseBMI2(true) {
		t.Run("bmi2", test)
	}
	zdecUseBMI2(false)
	t.Run("plain", test)
}

func testZstdDecodeDeep(t *testing.T) {
	r := rand.New(rand.NewPCG(35, 2))
	x, err := NewZstdDecoder(1)
	if err != nil {
		t.Fatal(err)
	}
	frame := make([]byte, zstddeep.MaxFrame+1024)
	frames := 0
	for i, in := range zstdInputs(t, r) {
		for _, n := range []int{256, 300, PageSize, 3 * PageSize, zstddeep.MaxFrame} {
			if len(in) < n {
				continue
			}
			k := zstddeep.Compress(frame, in[:n])
			if k == 0 {
				continue
			}
			step := 61
			if n == zstddeep.MaxFrame && i%7 == 0 {
				step = 1
			}
			zstdCheck(t, x, fmt.Sprintf("deep, input %d (%d bytes)", i, n), frame[:k], step)
			frames++
		}
		if len(in) >= PageSize {
			k := zstdpage.Compress(frame, in[:PageSize], zstdpage.Default())
			if k > 0 {
				zstdCheck(t, x, fmt.Sprintf("page, input %d", i), frame[:k], 1)
				frames++
			}
		}
	}
	if frames < 20 {
		t.Fatalf("only %d frames", frames)
	}
	t.Logf("%d frames", frames)
}

// TestZstdDecodeFallback checks the codec's paths end to end: frames
// zstddec.c leaves to libzstd (a dictionary, concatenated frames, a
// destination too short) still decode, or fail, as libzstd has them.
func TestZstdDecodeFallback(t *testing.T) {
	x, err := NewZstdDecoder(2)
	if err != nil {
		t.Fatal(err)
	}
	ctx := x.ctxs.s[0].ctx
	in := bytes.Repeat([]byte("a page of swap, "), 1024)
	o, err := NewZstdObjects(3, len(in), 0)
	if err != nil {
		t.Fatal(err)
	}
	frame := make([]byte, len(in))
	frame = frame[:o.Compress(frame, in)]
	out := make([]byte, len(in))
	if err := x.Decompress(out, frame); err != nil || !bytes.Equal(out, in) {
		t.Fatalf("a frame does not decode: %v", err)
	}
	// Two frames one after the other: libzstd decodes both, zstddec.c
	// neither, and the codec wants one frame of the output's length.
	two := append(append([]byte{}, frame...), frame...)
	if r := zdec(ctx, make([]byte, 2*len(in)), two, 2*len(in)); r >= 0 {
		t.Errorf("zstddec takes concatenated frames: %d", r)
	}
	if err := x.Decompress(make([]byte, 2*len(in)), two); err != nil {
		t.Errorf("libzstd's fallback does not decode two frames: %v", err)
	}
	// A dictionary ID, of one byte after the header's first byte and
	// window descriptor.
	at := 5
	if frame[4]&0x20 == 0 {
		at = 6
	}
	dict := append(append(append([]byte{}, frame[:at]...), 7), frame[at:]...)
	dict[4] |= 1
	if r := zdec(ctx, out, dict, len(out)); r != -2 {
		t.Errorf("zstddec takes a dictionary ID: %d", r)
	}
	// Too short a destination: the codec fails either way, even for a
	// prefix that fits, as libzstd has a block's output whole.
	if err := x.Decompress(out[:len(out)-1], frame); err == nil {
		t.Error("a frame decodes into a buffer too short")
	}
	if err := x.DecompressPrefix(out[:len(out)-1], frame, 100); err == nil {
		t.Error("a prefix decodes into a buffer short of the frame's end")
	}
	if err := x.DecompressPrefix(out, frame, 100); err != nil || !bytes.Equal(out[:100], in[:100]) {
		t.Errorf("a prefix does not decode: %v", err)
	}
}

// zstdFuzzSeeds returns frames of each encoder for FuzzZstdDecode.
func zstdFuzzSeeds(tb testing.TB) [][]byte {
	r := rand.New(rand.NewPCG(35, 3))
	var seeds [][]byte
	buf := make([]byte, 1<<17)
	inputs := zstdInputs(tb, r)
	for _, level := range []int{-3, 1, 5, 19} {
		o, err := NewZstdObjects(level, 64<<10, PageSize)
		if err != nil {
			tb.Fatal(err)
		}
		for i, in := range inputs {
			if len(in) <= 4*PageSize && i%3 == level&3 {
				seeds = append(seeds, append([]byte{}, buf[:o.Compress(buf, in)]...))
			}
		}
	}
	for i, in := range inputs {
		if len(in) >= 1000 && len(in) <= zstddeep.MaxFrame && i%2 == 0 {
			if k := zstddeep.Compress(buf, in); k > 0 {
				seeds = append(seeds, append([]byte{}, buf[:k]...))
			}
		}
	}
	e, _ := kzstd.NewWriter(nil, kzstd.WithEncoderLevel(kzstd.SpeedBetterCompression))
	for i, in := range inputs {
		if len(in) <= 4*PageSize && i%4 == 0 {
			seeds = append(seeds, e.EncodeAll(in, nil))
		}
	}
	return seeds
}

// FuzzZstdDecode feeds zstddec.c mutated frames, with src ending at an
// unmapped page and dst fenced on both sides: it must never fault, and
// whatever it decodes must be what libzstd decodes, as far as it wants.
func FuzzZstdDecode(f *testing.F) {
	for _, s := range zstdFuzzSeeds(f) {
		f.Add(s, uint16(len(s)*7))
	}
	x, err := NewZstdDecoder(1)
	if err != nil {
		f.Fatal(err)
	}
	ctx := x.ctxs.s[0].ctx
	const most = 64 << 10
	fenceIn, fenceOut, ref := fencedPages(f, most/PageSize), fencedPages(f, most/PageSize), make([]byte, most)
	f.Fuzz(func(t *testing.T, frame []byte, w uint16) {
		if len(frame) == 0 || len(frame) > most {
			return
		}
		src := fenceIn[most-len(frame):]
		copy(src, frame)
		n := libzstdDecode(ctx, ref, src)
		full := n > 0
		if !full {
			n = 1 + int(w)%most
		}
		want := 1 + int(w)%n
		if w%5 == 0 {
			want = n
		}
		dst := fenceOut[most-n:]
		r := zdec(ctx, dst, src, want)
		// x's cleanup frees the contexts once x is unreachable.
		runtime.KeepAlive(x)
		if r < 0 {
			return
		}
		if r > n {
			t.Fatalf("%d bytes out of %d", r, n)
		}
		if !full {
			// libzstd refuses the whole frame; its decode block by block
			// still gives the prefix as far as want, if it gives one.
			if libzstdPrefix(ctx, ref[:n], src, want) != nil {
				return
			}
			r = min(r, want)
		}
		if !bytes.Equal(dst[:r], ref[:r]) {
			t.Fatalf("%d bytes out for %d wanted of %d (libzstd decodes the whole frame: %v): not libzstd's", r, want, n, full)
		}
	})
}

// TestZstdDecodeMutated is FuzzZstdDecode's check on a fixed run of
// random mutations, so that plain go test runs some of it.
func TestZstdDecodeMutated(t *testing.T) {
	zstdBothBuilds(t, testZstdDecodeMutated)
}

func testZstdDecodeMutated(t *testing.T) {
	seeds := zstdFuzzSeeds(t)
	// For fuzzing zstddec.c alone, under a C sanitizer.
	if dir := os.Getenv("GZRAMD_ZSTDDEC_SEEDS"); dir != "" {
		for i, s := range seeds {
			if err := os.WriteFile(fmt.Sprintf("%s/seed%03d.zst", dir, i), s, 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	r := rand.New(rand.NewPCG(35, 4))
	rounds := 20000
	if testing.Short() {
		rounds = 3000
	}
	if s := os.Getenv("GZRAMD_ZSTDDEC_ROUNDS"); s != "" {
		fmt.Sscan(s, &rounds)
	}
	x, err := NewZstdDecoder(1)
	if err != nil {
		t.Fatal(err)
	}
	ctx := x.ctxs.s[0].ctx
	const most = 64 << 10
	fenceIn, fenceOut, ref := fencedPages(t, most/PageSize), fencedPages(t, most/PageSize), make([]byte, most)
	defer runtime.KeepAlive(x) // its cleanup frees ctx
	decoded := 0
	for round := range rounds {
		frame := append([]byte{}, seeds[r.IntN(len(seeds))]...)
		for range 1 + r.IntN(4) {
			switch i := r.IntN(len(frame)); r.IntN(4) {
			case 0:
				frame[i] ^= 1 << r.IntN(8)
			case 1:
				frame[i] = byte(r.Uint32())
			case 2:
				frame = frame[:i+1]
			default:
				frame = append(frame[:i], frame[min(len(frame), i+1+r.IntN(4)):]...)
			}
			if len(frame) == 0 {
				frame = []byte{0}
			}
		}
		src := fenceIn[most-len(frame):]
		copy(src, frame)
		n := libzstdDecode(ctx, ref, src)
		full := n > 0
		if !full {
			n = 1 + r.IntN(most)
		}
		want := 1 + r.IntN(n)
		if r.IntN(3) == 0 {
			want = n
		}
		dst := fenceOut[most-n:]
		got := zdec(ctx, dst, src, want)
		if got < 0 {
			continue
		}
		if got > n {
			t.Fatalf("round %d: %d bytes out of %d", round, got, n)
		}
		if !full {
			if libzstdPrefix(ctx, ref[:n], src, want) != nil {
				continue
			}
			got = min(got, want)
		}
		if !bytes.Equal(dst[:got], ref[:got]) {
			t.Fatalf("round %d: %d bytes out for %d wanted of %d (whole: %v): not libzstd's", round, got, want, n, full)
		}
		decoded++
	}
	t.Logf("%d of %d mutated frames decoded, as libzstd does", decoded, rounds)
}
