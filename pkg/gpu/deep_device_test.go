//go:build gpu

// The dense tier's hard-compressed frames (kernels/zstd_deep.cu) on a real
// GPU: every frame decodes with libzstd and is byte for byte the host
// build's (internal/zstddeep), and what the kernel costs at several
// launch sizes. GZRAMD_ZSTD_DEEP_PTX names a freshly built zstd_deep.ptx
// to use instead of the embedded one.

package gpu

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"runtime"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/DataDog/zstd"

	testcorpus "github.com/gzramd/gzramd/internal/corpus"
	"github.com/gzramd/gzramd/internal/testneeds"
	"github.com/gzramd/gzramd/internal/zstddeep"
	"github.com/gzramd/gzramd/kernels"
	"github.com/gzramd/gzramd/pkg/codec"
)

// deepFrames cuts the stored pages of the corpus (pages of one repeated
// word left out, as gzramd keeps them) into frames of deepFramePages, or
// makes frames of made-up pages where there is no corpus.
func deepFrames(t *testing.T) [][]byte {
	corpus := testneeds.CorpusOr(t, "frames of made-up pages instead")
	var pages []byte
	if corpus != nil {
		pages = testcorpus.StoredPages(corpus)
	} else {
		pages = edgePages(512)
		r := rand.New(rand.NewPCG(5, 6))
		for i := 0; i < 512*codec.PageSize; i++ {
			pages = append(pages, byte(r.IntN(1+i%61)))
		}
	}
	var frames [][]byte
	for p := 0; p < len(pages); p += deepFramePages * codec.PageSize {
		frames = append(frames, pages[p:min(p+deepFramePages*codec.PageSize, len(pages))])
	}
	return frames
}

// deepDevice runs gz_zstd_deep on launches of up to per frames.
type deepDevice struct {
	dr                                    *driver
	f                                     function
	s                                     stream
	per                                   int
	in, scratch, packed, meta, offs, lens devicePtr
}

func openDeep(t *testing.T, per int) *deepDevice {
	t.Helper()
	ptx := ptxFrom(t, "GZRAMD_ZSTD_DEEP_PTX", kernels.ZstdDeep)
	if len(ptx) == 0 {
		t.Skip("no zstd_deep.ptx: build it with kernels/build-ptx.sh zstd_deep.cu, or set GZRAMD_ZSTD_DEEP_PTX")
	}
	dr, _, err := loadDriver(0, 0)
	if err != nil {
		t.Skipf("no GPU: %v", err)
	}
	t.Cleanup(dr.close)
	m, err := dr.loadModule(ptx)
	if err != nil {
		t.Fatal(err)
	}
	d := &deepDevice{dr: dr, per: per}
	if d.f, err = dr.function(m, "gz_zstd_deep"); err != nil {
		t.Fatal(err)
	}
	if d.s, err = dr.streamCreate(); err != nil {
		t.Fatal(err)
	}
	frameBytes := deepFramePages * codec.PageSize
	for _, a := range []struct {
		p *devicePtr
		n int
	}{{&d.in, per * frameBytes}, {&d.scratch, per * deepScratchBytes}, {&d.packed, per * (frameBytes + 16)},
		{&d.meta, 4}, {&d.offs, 4 * per}, {&d.lens, 4 * per}} {
		if *a.p, err = dr.memAlloc(a.n); err != nil {
			t.Fatalf("%d bytes of device memory: %v", a.n, err)
		}
		p := *a.p
		t.Cleanup(func() { dr.memFree(p) })
	}
	return d
}

// compress runs the frames (at most d.per) and returns each one's frame,
// nil where it was not smaller than its pages.
func (d *deepDevice) compress(frames [][]byte) ([][]byte, error) {
	dr := d.dr
	frameBytes := deepFramePages * codec.PageSize
	in := make([]byte, len(frames)*frameBytes)
	entries := make([]uint32, len(frames))
	for i, f := range frames {
		copy(in[i*frameBytes:], f)
		entries[i] = uint32(i*deepFramePages)<<8 | uint32(len(f)/codec.PageSize)
	}
	if err := dr.htod(d.in, in, d.s); err != nil {
		return nil, err
	}
	if err := dr.htod(d.offs, bytesOf(entries), d.s); err != nil {
		return nil, err
	}
	if err := dr.memset32(d.meta, 0, 1, d.s); err != nil {
		return nil, err
	}
	n := len(frames)
	if err := dr.launchCompress(d.f, n, 32, d.s, d.in, n, d.scratch, d.packed, d.meta, d.offs, d.lens); err != nil {
		return nil, err
	}
	lens := make([]uint32, n)
	size := make([]uint32, 1)
	packed := make([]byte, n*(frameBytes+16))
	for _, c := range []struct {
		dst []byte
		src devicePtr
	}{{bytesOf(entries), d.offs}, {bytesOf(lens), d.lens}, {bytesOf(size), d.meta}, {packed, d.packed}} {
		if err := dr.dtoh(c.dst, c.src, d.s); err != nil {
			return nil, err
		}
	}
	if err := dr.streamSync(d.s); err != nil {
		return nil, err
	}
	out := make([][]byte, n)
	for i := range n {
		o, l := entries[i], lens[i]
		switch {
		case l == 0 && o == ^uint32(0):
		case l == 0 || l >= uint32(len(frames[i])) || uint64(o)+uint64(l) > uint64(size[0]) || o%16 != 0:
			return nil, fmt.Errorf("frame %d: device returned length %d at offset %d of %d packed bytes", i, l, o, size[0])
		default:
			out[i] = packed[o : o+l]
		}
	}
	return out, nil
}

func cpuSeconds() float64 {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()).Seconds()
}

// TestDeepFramesOnDevice checks every frame against libzstd and the host
// build, then times the kernel over all frames at several launch sizes
// (GZRAMD_DEEP_PER: one size; GZRAMD_DEEP_FRAMES: the first frames
// only) and reports the ratio beside libzstd's
// levels 5 and 19 on the same frames.
func TestDeepFramesOnDevice(t *testing.T) {
	frames := deepFrames(t)
	sizes := []int{256, 1024, 4096}
	if v := os.Getenv("GZRAMD_DEEP_PER"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			t.Fatalf("GZRAMD_DEEP_PER=%q", v)
		}
		sizes = []int{n}
	}
	if v := os.Getenv("GZRAMD_DEEP_FRAMES"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			t.Fatalf("GZRAMD_DEEP_FRAMES=%q", v)
		}
		frames = frames[:min(n, len(frames))]
	}
	var in int64
	for _, f := range frames {
		in += int64(len(f))
	}
	var stored int64
	for k, per := range sizes {
		d := openDeep(t, per)
		start, cpu0 := time.Now(), cpuSeconds()
		var got [][]byte
		for lo := 0; lo < len(frames); lo += per {
			out, err := d.compress(frames[lo:min(lo+per, len(frames))])
			if err != nil {
				t.Fatalf("frames %d..: %v", lo, err)
			}
			got = append(got, out...)
		}
		elapsed, cpu := time.Since(start), cpuSeconds()-cpu0
		t.Logf("%5d frames a launch: %d frames (%d MiB) in %v, %.1f MB/s, %.2f CPU-s per GB, %d MiB of device scratch",
			per, len(frames), in>>20, elapsed.Round(time.Millisecond), float64(in)/1e6/elapsed.Seconds(),
			cpu/(float64(in)/1e9), per*deepScratchBytes>>20)
		if k > 0 {
			continue
		}
		stored = 0
		for i, f := range got {
			if f == nil {
				stored += int64(len(frames[i]))
				continue
			}
			stored += int64(len(f))
			dec, err := zstd.Decompress(nil, f)
			if err != nil || !bytes.Equal(dec, frames[i]) {
				t.Fatalf("frame %d: libzstd does not decode it to its pages (%v)", i, err)
			}
		}
		mismatch := hostMismatches(frames, got)
		if mismatch > 0 {
			t.Errorf("%d of %d frames differ from the host build's", mismatch, len(frames))
		}
	}
	t.Logf("gz_zstd_deep     ratio %.3f", float64(in)/float64(stored))
	for _, level := range []int{5, 19} {
		var s int64
		for _, f := range frames {
			out, err := zstd.CompressLevel(nil, f, level)
			if err != nil || len(out) >= len(f) {
				s += int64(len(f))
			} else {
				s += int64(len(out))
			}
		}
		t.Logf("libzstd level %2d ratio %.3f", level, float64(in)/float64(s))
	}
}

// hostMismatches compresses the frames on every core with the host build
// of the same encoder and counts those whose bytes differ from got's.
func hostMismatches(frames, got [][]byte) int {
	var mu sync.Mutex
	bad := 0
	var wg sync.WaitGroup
	workers := runtime.GOMAXPROCS(0)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			dst := make([]byte, zstddeep.MaxFrame)
			for i := w; i < len(frames); i += workers {
				n := zstddeep.Compress(dst, frames[i])
				var want []byte
				if n > 0 {
					want = dst[:n]
				}
				if !bytes.Equal(want, got[i]) {
					mu.Lock()
					bad++
					mu.Unlock()
				}
			}
		}()
	}
	wg.Wait()
	return bad
}

// TestDeepGroupsOnDevice runs the corpus's groups through the backend's
// DeepGroups, as the dense tier does (batches of its most groups, a batch
// with some pages as LZ4 blocks and one with some as zstd frames,
// decoded on the GPU first, and in each one page that does not decode): every frame decodes with libzstd to its 4 pages
// and is the host build's byte for byte, only the frame with the bad
// block is declined, and it reports the ratio, the time and this
// process's CPU per GB.
func TestDeepGroupsOnDevice(t *testing.T) {
	for _, alg := range []string{"lz4", "zstd"} {
		t.Run(alg, func(t *testing.T) {
			g := openGroups(t, alg)
			d, err := g.DeepGroups()
			if err != nil {
				t.Fatal(err)
			}
			if d.FramePages() != deepFramePages {
				t.Fatalf("frames of %d pages, want %d", d.FramePages(), deepFramePages)
			}
			deepGroupsRoundTrip(t, d, deepCorpusGroups(t))
		})
	}
}

// deepCorpusGroups is the corpus's stored pages cut to whole groups, or
// made-up pages where there is no corpus.
func deepCorpusGroups(t *testing.T) []byte {
	var pages []byte
	for _, f := range deepFrames(t) {
		pages = append(pages, f...)
	}
	if v := os.Getenv("GZRAMD_DEEP_FRAMES"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			t.Fatalf("GZRAMD_DEEP_FRAMES=%q", v)
		}
		pages = pages[:min(len(pages), n*deepFramePages*codec.PageSize)]
	}
	return pages[:len(pages)/groupBytes*groupBytes]
}

func deepGroupsRoundTrip(t *testing.T, d *DeepGroups, pages []byte) {
	const frameBytes = deepFramePages * codec.PageSize
	per := d.MaxGroups()
	b, err := d.NewBatch(per * codec.GroupPages)
	if err != nil {
		t.Fatal(err)
	}
	zstdPages, err := codec.NewZstd(1)
	if err != nil {
		t.Fatal(err)
	}
	stores := map[int]codec.Codec{1: codec.NewLZ4(), 2: zstdPages}
	var frames, got [][]byte
	var stored int64
	var wall time.Duration
	cpu0 := cpuSeconds()
	for lo, batch := 0, 0; lo < len(pages); lo, batch = lo+per*groupBytes, batch+1 {
		in := pages[lo:min(lo+per*groupBytes, len(pages))]
		n := len(in) / codec.PageSize
		copy(b.Pages, in)
		b.N = n
		var packed codec.Packed
		bad := -1
		if store := stores[batch]; store != nil {
			// Pages as stored, every third given decoded, and one that
			// does not decode.
			packed = codec.Packed{Codec: store.Name(), Offsets: make([]uint32, n), Lens: make([]uint32, n)}
			offsets, lens := packed.Offsets, packed.Lens
			at := 0
			for i := range n {
				page := in[i*codec.PageSize : (i+1)*codec.PageSize]
				l := store.Compress(b.Out[at:at+codec.PageSize-1], page)
				if i%3 == 0 || l <= 0 {
					continue
				}
				clear(b.Pages[i*codec.PageSize : (i+1)*codec.PageSize])
				offsets[i], lens[i] = uint32(at), uint32(l)
				at += l
				if bad < 0 && i >= 5*deepFramePages && l > 8 {
					bad = i
					lens[i]-- // a page cut short does not decode
				}
			}
		}
		start := time.Now()
		if err := d.CompressGroups(context.Background(), b, packed); err != nil {
			t.Fatalf("batch %d: %v", batch, err)
		}
		wall += time.Since(start)
		for f := range n / deepFramePages {
			want := in[f*frameBytes : (f+1)*frameBytes]
			frame := b.Compressed(f)
			if bad >= 0 && f == bad/deepFramePages {
				if frame != nil || b.Offsets[f] == codec.GroupNotSmaller {
					t.Fatalf("batch %d: the frame with a block that does not decode came out (%d bytes at %d)", batch, b.Lens[f], b.Offsets[f])
				}
				continue
			}
			frames = append(frames, want)
			if frame == nil {
				if b.Offsets[f] != codec.GroupNotSmaller {
					t.Fatalf("batch %d: frame %d declined", batch, f)
				}
				got = append(got, nil)
				stored += frameBytes
				continue
			}
			got = append(got, append([]byte(nil), frame...))
			stored += int64(len(frame))
			dec, err := zstd.Decompress(nil, frame)
			if err != nil || !bytes.Equal(dec, want) {
				t.Fatalf("batch %d: frame %d does not decode to its pages (%v)", batch, f, err)
			}
		}
	}
	cpu := cpuSeconds() - cpu0
	if n := hostMismatches(frames, got); n > 0 {
		t.Errorf("%d of %d frames differ from the host build's", n, len(frames))
	}
	in := float64(len(frames) * frameBytes)
	t.Logf("%d frames in batches of %d groups: ratio %.3f, %.1f MB/s, %.2f CPU-s per GB of this process",
		len(frames), per, in/float64(stored), in/wall.Seconds()/1e6, cpu/(in/1e9))
}
