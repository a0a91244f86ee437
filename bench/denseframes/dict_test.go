package denseframes

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"runtime"
	"slices"
	"testing"
	"time"

	"github.com/gzramd/gzramd/internal/corpus"
	"github.com/gzramd/gzramd/internal/testneeds"
)

// TestDictFrames measures small frames compressed with a dictionary trained
// on the device's own pages, the way issue 35 could keep a 4 KiB read's
// decode short without losing ratio: half the corpus's 64 KiB groups train
// the dictionary (the pages a device holds when it trains one), and the
// other half is cut into frames, compressed with and without it, and
// decoded whole at random, one context made ahead. The ratio is the
// frames' pages over their bytes, without gzramd's object headers.
//
//	GZRAMD_DENSE_FRAMES=1 go test ./bench/denseframes -run TestDictFrames -v -timeout 30m
func TestDictFrames(t *testing.T) {
	testneeds.Env(t, "GZRAMD_DENSE_FRAMES", "measures dense frames with a trained zstd dictionary on the corpus (minutes)")
	pages := corpus.StoredPages(testneeds.Corpus(t))
	var train, eval []byte
	for g := 0; g+groupPages*pageSize <= len(pages); g += groupPages * pageSize {
		if g/(groupPages*pageSize)%2 == 0 {
			train = append(train, pages[g:g+groupPages*pageSize]...)
		} else {
			eval = append(eval, pages[g:g+groupPages*pageSize]...)
		}
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	out := t.Output()
	fmt.Fprintf(out, "%d pages train the dictionaries, %d are measured; decode: %d frames at random, decoded whole\n\n",
		len(train)/pageSize, len(eval)/pageSize, *reads/4)
	fmt.Fprintln(out, "| frame | dictionary | level | ratio | compress MB/s | decode p50 µs | decode p99 µs | decode MB/s |")
	fmt.Fprintln(out, "|---:|---:|---:|---:|---:|---:|---:|---:|")
	dicts := map[int]map[int][]byte{} // by dictionary size, then sample (frame) size
	for _, frame := range []int{4 << 10, 8 << 10, 16 << 10} {
		for _, dictSize := range []int{0, 32 << 10, 112 << 10} {
			var dict []byte
			if dictSize > 0 {
				if dicts[dictSize] == nil {
					dicts[dictSize] = map[int][]byte{}
				}
				start := time.Now()
				d, err := trainDict(train, frame, dictSize)
				if err != nil {
					t.Fatal(err)
				}
				dict = d
				t.Logf("a %d-byte dictionary trained on %d-byte samples in %v", len(d), frame, time.Since(start).Round(time.Millisecond))
			}
			for _, level := range []int{5, 19} {
				measureDictFrames(t, out, eval, frame, dict, dictSize, level)
			}
		}
	}
}

func measureDictFrames(t *testing.T, out interface{ Write([]byte) (int, error) }, pages []byte, frame int, dict []byte, dictSize, level int) {
	c, err := newDictCodec(dict, level)
	if err != nil {
		t.Fatal(err)
	}
	defer c.close()
	var data []byte
	off := []int{0}
	buf := make([]byte, 2*frame)
	start := time.Now()
	for p := 0; p+frame <= len(pages); p += frame {
		n := c.compress(buf, pages[p:p+frame])
		if n <= 0 {
			t.Fatalf("frame at %d does not compress", p)
		}
		data = append(data, buf[:n]...)
		off = append(off, len(data))
	}
	took := time.Since(start)
	frames := len(off) - 1
	rng := rand.New(rand.NewPCG(7, uint64(frame+dictSize+level)))
	dst := make([]byte, frame)
	n := *reads / 4
	times := make([]time.Duration, 0, n)
	for range n {
		i := rng.IntN(frames)
		src := data[off[i]:off[i+1]]
		t0 := time.Now()
		err := c.decompress(dst, src)
		d := time.Since(t0)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(dst, pages[i*frame:(i+1)*frame]) {
			t.Fatalf("frame %d decodes wrong", i)
		}
		times = append(times, d)
	}
	slices.Sort(times)
	var sum time.Duration
	for _, d := range times {
		sum += d
	}
	dictName := "none"
	if dictSize > 0 {
		dictName = fmt.Sprintf("%d KiB", dictSize>>10)
	}
	fmt.Fprintf(out, "| %d KiB | %s | %d | %.3f | %.1f | %.2f | %.2f | %.0f |\n", frame>>10, dictName, level,
		float64(frames*frame)/float64(len(data)), mbps(frames*frame, took),
		us(times[len(times)/2]), us(times[len(times)*99/100]), mbps(n*frame, sum))
}
