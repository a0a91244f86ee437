package zstddeep

import (
	"bytes"
	"encoding/binary"
	"math/rand/v2"
	"os"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/DataDog/zstd"

	"github.com/gzramd/gzramd/internal/corpus"
	"github.com/gzramd/gzramd/internal/testneeds"
)

const pageSize = 4096

// roundTrip compresses src and checks that libzstd decodes the frame to it.
func roundTrip(t *testing.T, src []byte) int {
	t.Helper()
	dst := make([]byte, len(src)+64)
	n := Compress(dst, src)
	if n == 0 {
		return len(src)
	}
	if n >= len(src) {
		t.Fatalf("%d bytes: a frame of %d, not smaller", len(src), n)
	}
	got, err := zstd.Decompress(nil, dst[:n])
	if err != nil {
		t.Fatalf("%d bytes: libzstd: %v", len(src), err)
	}
	if !bytes.Equal(got, src) {
		t.Fatalf("%d bytes: libzstd decodes another content", len(src))
	}
	return n
}

func TestShapes(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for _, pages := range []int{1, 2, 3, 4} {
		n := pages * pageSize
		random := make([]byte, n)
		for i := range random {
			random[i] = byte(r.Uint32())
		}
		text := make([]byte, n)
		words := []string{"swap ", "page ", "gzramd ", "zram ", "frame ", "\x00\x00\x00\x00", "0123456789"}
		for i := 0; i < n; {
			i += copy(text[i:], words[r.IntN(len(words))])
		}
		runs := make([]byte, n)
		for i := range runs {
			runs[i] = byte(i / 700)
		}
		few := make([]byte, n)
		for i := range few {
			few[i] = byte(r.IntN(3))
		}
		// Long matches at every offset class, and 3-byte ones.
		periodic := make([]byte, n)
		for i := range periodic {
			periodic[i] = byte(i%4093) ^ byte(i%7)
		}
		words32 := make([]byte, n)
		for i := 0; i < n; i += 8 {
			binary.LittleEndian.PutUint64(words32[i:], uint64(r.IntN(40))<<32|0x7f00)
		}
		zero := make([]byte, n)
		for name, src := range map[string][]byte{"random": random, "text": text, "runs": runs, "few": few,
			"periodic": periodic, "words": words32, "zero": zero} {
			got := roundTrip(t, src)
			t.Logf("%d pages %-8s %6d -> %6d", pages, name, n, got)
		}
	}
}

// TestRandomFrames round-trips frames of random structure: pieces of
// random bytes, copies from earlier at random offsets, runs.
func TestRandomFrames(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	count := 400
	if testing.Short() {
		count = 60
	}
	for k := 0; k < count; k++ {
		n := (1 + r.IntN(4)) * pageSize
		src := make([]byte, n)
		for i := 0; i < n; {
			l := 1 + r.IntN(64)
			switch r.IntN(4) {
			case 0:
				for j := 0; j < l && i < n; j++ {
					src[i] = byte(r.Uint32())
					i++
				}
			case 1:
				if i == 0 {
					continue
				}
				off := 1 + r.IntN(i)
				for j := 0; j < l*4 && i < n; j++ {
					src[i] = src[i-off]
					i++
				}
			case 2:
				b := byte(r.Uint32())
				for j := 0; j < l && i < n; j++ {
					src[i] = b
					i++
				}
			default:
				for j := 0; j < l && i < n; j++ {
					src[i] = byte(r.IntN(4))
					i++
				}
			}
		}
		roundTrip(t, src)
	}
}

func TestSizesRefused(t *testing.T) {
	dst := make([]byte, 2*MaxFrame)
	for _, n := range []int{0, 255, MaxFrame + 1} {
		if got := Compress(dst, make([]byte, n)); got != 0 {
			t.Errorf("%d bytes: %d, want 0", n, got)
		}
	}
	if got := Compress(dst[:5], make([]byte, 4096)); got != 0 {
		t.Errorf("5 bytes of room: %d, want 0", got)
	}
}

// TestCorpus measures the ratio of frames of 4 adjacent stored pages
// (pages of one repeated word left out, as gzramd keeps them) against
// libzstd's levels on the same frames, round-tripping every frame:
// GZRAMD_DEEP_CORPUS=1 for all of them, GZRAMD_ZD_ONLY=1 for this
// encoder's figures alone (built with CGO_CFLAGS="-O2 -DZD_DEPTH=..."
// to try its settings).
func TestCorpus(t *testing.T) {
	pages := corpus.StoredPages(testneeds.Corpus(t))
	// Every 32nd frame: a check of every workload in seconds; the whole
	// corpus takes a minute on two cores.
	step := 32
	if os.Getenv("GZRAMD_DEEP_CORPUS") != "" {
		step = 1
	}
	var frames [][]byte
	for p := 0; p < len(pages); p += MaxFrame * step {
		frames = append(frames, pages[p:min(p+MaxFrame, len(pages))])
	}
	type result struct {
		name    string
		stored  int64
		elapsed time.Duration
	}
	measure := func(name string, comp func(dst, src []byte) int) result {
		sizes := make([]int64, len(frames))
		start := time.Now()
		var wg sync.WaitGroup
		workers := runtime.GOMAXPROCS(0)
		for w := 0; w < workers; w++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				dst := make([]byte, 2*MaxFrame)
				for i := w; i < len(frames); i += workers {
					n := comp(dst, frames[i])
					if n <= 0 || n >= len(frames[i]) {
						n = len(frames[i])
					}
					sizes[i] = int64(n)
				}
			}()
		}
		wg.Wait()
		var total int64
		for _, s := range sizes {
			total += s
		}
		return result{name, total, time.Since(start)}
	}
	level := func(l int) func(dst, src []byte) int {
		return func(dst, src []byte) int {
			out, err := zstd.CompressLevel(dst[:0], src, l)
			if err != nil {
				return 0
			}
			return len(out)
		}
	}
	for _, f := range frames {
		roundTrip(t, f)
	}
	var in int64
	for _, f := range frames {
		in += int64(len(f))
	}
	t.Logf("%d frames of up to %d pages, %d MiB", len(frames), MaxFrame/pageSize, in>>20)
	results := []result{measure("zd (this encoder)", Compress)}
	if os.Getenv("GZRAMD_ZD_ONLY") == "" {
		results = append(results, measure("libzstd level 5", level(5)), measure("libzstd level 19", level(19)))
	}
	for _, r := range results {
		t.Logf("%-20s ratio %.3f  %6.1f MB/s on %d cores", r.name, float64(in)/float64(r.stored),
			float64(in)/1e6/r.elapsed.Seconds(), runtime.GOMAXPROCS(0))
	}
}
