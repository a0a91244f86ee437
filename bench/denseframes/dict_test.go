package denseframes

import (
	"bytes"
	"flag"
	"fmt"
	"math/rand/v2"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gzramd/gzramd/internal/corpus"
	"github.com/gzramd/gzramd/internal/testneeds"
	"github.com/gzramd/gzramd/pkg/codec"
)

var (
	dictFrames = flag.String("dict-frames", "4,8,16", "TestDictFrames: the frame sizes, in KiB")
	dictSizes  = flag.String("dict-sizes", "0,32,112", "TestDictFrames: the dictionary sizes, in KiB (0: none)")
	dictLevels = flag.String("dict-levels", "5,19", "TestDictFrames: the zstd levels")
)

// ints parses a comma-separated list of integers.
func ints(t *testing.T, list string) []int {
	t.Helper()
	var v []int
	for _, f := range strings.Split(list, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil {
			t.Fatalf("%q: %v", list, err)
		}
		v = append(v, n)
	}
	return v
}

// kibs is ints in KiB, as bytes.
func kibs(t *testing.T, list string) []int {
	t.Helper()
	v := ints(t, list)
	for i := range v {
		v[i] <<= 10
	}
	return v
}

// TestDictFrames measures small frames compressed with a dictionary trained
// on the device's own pages, the way issue 35 could keep a 4 KiB read's
// decode short without losing ratio: half the corpus's 64 KiB groups train
// the dictionary (the pages a device holds when it trains one), and the
// other half is cut into frames, compressed with and without it, and
// decoded whole at random, one context made ahead. The ratio is the
// frames' pages over their bytes, without gzramd's object headers.
//
//	GZRAMD_DENSE_FRAMES=1 go test ./bench/denseframes -run TestDictFrames -v -timeout 30m \
//		-args -dict-frames 4,8 -dict-sizes 112 -dict-levels 9,12,15,19
func TestDictFrames(t *testing.T) {
	testneeds.Env(t, "GZRAMD_DENSE_FRAMES", "measures dense frames with a trained zstd dictionary on the corpus (minutes)")
	pages := corpus.StoredPages(testneeds.Corpus(t))
	train, eval := splitGroups(pages)
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	out := t.Output()
	fmt.Fprintf(out, "%d pages train the dictionaries, %d are measured; decode: %d frames at random, decoded whole\n\n",
		len(train)/pageSize, len(eval)/pageSize, *reads/4)
	fmt.Fprintln(out, "| frame | dictionary | level | ratio | compress MB/s | decode p50 µs | decode p99 µs | decode MB/s | gzramd's decoder p50 µs | a random page of the frame p50 / p99 µs |")
	fmt.Fprintln(out, "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
	dicts := map[int]map[int][]byte{} // by dictionary size, then sample (frame) size
	for _, frame := range kibs(t, *dictFrames) {
		for _, dictSize := range kibs(t, *dictSizes) {
			var dict []byte
			if dictSize > 0 {
				if dicts[dictSize] == nil {
					dicts[dictSize] = map[int][]byte{}
				}
				start := time.Now()
				d, err := codec.TrainZstdDict(train, frame, dictSize)
				if err != nil {
					t.Fatal(err)
				}
				dict = d
				t.Logf("a %d-byte dictionary trained on %d-byte samples in %v", len(d), frame, time.Since(start).Round(time.Millisecond))
			}
			for _, level := range ints(t, *dictLevels) {
				measureDictFrames(t, out, eval, frame, dict, dictSize, level)
			}
		}
	}
}

// splitGroups splits pages by 64 KiB group: the even groups train a
// dictionary (the pages a device holds when it trains one), the odd ones
// are measured.
func splitGroups(pages []byte) (train, eval []byte) {
	const group = groupPages * pageSize
	for g := 0; g+group <= len(pages); g += group {
		if g/group%2 == 0 {
			train = append(train, pages[g:g+group]...)
		} else {
			eval = append(eval, pages[g:g+group]...)
		}
	}
	return train, eval
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
	whole, page := gzramdDecodes(t, pages, data, off, frame, dict, n, rng)
	dictName := "none"
	if dictSize > 0 {
		dictName = fmt.Sprintf("%d KiB", dictSize>>10)
	}
	fmt.Fprintf(out, "| %d KiB | %s | %d | %.3f | %.1f | %.2f | %.2f | %.0f | %.2f | %.2f / %.2f |\n", frame>>10, dictName, level,
		float64(frames*frame)/float64(len(data)), mbps(frames*frame, took),
		us(times[len(times)/2]), us(times[len(times)*99/100]), mbps(n*frame, sum),
		us(whole[len(whole)/2]), us(page[len(page)/2]), us(page[len(page)*99/100]))
}

// gzramdDecodes times gzramd's own decoder (pkg/codec, zstddec.c, the
// dictionary's tables built once) on n frames at random, decoded whole,
// and on n pages at random, each decoded from its frame only as far as
// the page (what a 4 KiB read of the dense tier does), sorted.
func gzramdDecodes(t *testing.T, pages, data []byte, off []int, frame int, dict []byte, n int, rng *rand.Rand) (whole, page []time.Duration) {
	x, err := codec.NewZstdDecoder(1)
	if err != nil {
		t.Fatal(err)
	}
	var d *codec.ZstdDict
	if len(dict) > 0 {
		if d, err = codec.NewZstdDict(dict, 0); err != nil {
			t.Fatal(err)
		}
	}
	decode := func(dst, src []byte, want int) error {
		if d != nil {
			return x.DecompressDict(dst, src, d, want)
		}
		return x.DecompressPrefix(dst, src, want)
	}
	dst := make([]byte, frame)
	frames := len(off) - 1
	for _, wantPage := range []bool{false, true} {
		times := make([]time.Duration, 0, n)
		for range n {
			i := rng.IntN(frames)
			src := data[off[i]:off[i+1]]
			want := frame
			if wantPage {
				want = (1 + rng.IntN(frame/pageSize)) * pageSize
			}
			t0 := time.Now()
			err := decode(dst, src, want)
			d := time.Since(t0)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(dst[want-pageSize:want], pages[i*frame+want-pageSize:i*frame+want]) {
				t.Fatalf("frame %d decodes wrong with gzramd's decoder", i)
			}
			times = append(times, d)
		}
		slices.Sort(times)
		if wantPage {
			page = times
		} else {
			whole = times
		}
	}
	return whole, page
}
