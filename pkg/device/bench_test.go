package device

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/gzramd/gzramd/internal/swaptrace"
	"github.com/gzramd/gzramd/internal/testneeds"
	"github.com/gzramd/gzramd/pkg/pagestore"
)

// benchPages is the corpus, or pages generated where it is missing.
func benchPages(b *testing.B) []byte {
	data := testneeds.CorpusOr(b, "generated pages written instead")
	if data == nil {
		data = make([]byte, 4096*pageSize)
		for i := range data {
			data[i] = byte(i/97) ^ byte(i/4096)
		}
	}
	return data
}

// BenchmarkWrite measures device ingest of corpus pages (or generated ones)
// from several writers, one page per request, like the kernel's swap-out.
func BenchmarkWrite(b *testing.B) {
	data := benchPages(b)
	for _, writers := range []int{1, 8, 32} {
		b.Run(fmt.Sprintf("writers-%d", writers), func(b *testing.B) {
			f := newDevice(b, int64(len(data)/pageSize)*pageSize, 0)
			benchWrites(b, f, data, pageSize, writers)
		})
	}
}

// BenchmarkWriteObjects measures 128 KiB inline writes of corpus pages
// (or generated ones) from 4 writers, aligned as the kernel's swap
// clusters are, with each write's pages kept in objects of 1 to 16 pages.
func BenchmarkWriteObjects(b *testing.B) {
	data := benchPages(b)
	const write = 32 * pageSize
	for _, per := range []int{1, 4, 16} {
		b.Run(fmt.Sprintf("object-pages-%d", per), func(b *testing.B) {
			f := newDeviceObjects(b, int64(len(data)/write)*write, pagestore.Config{}, pathInline, per)
			benchWrites(b, f, data, write, 4)
		})
	}
}

// benchWrites has writers write data into f's device, write bytes per
// request, in turn over its whole length, and reports the effective
// ratio.
func benchWrites(b *testing.B, f *fixture, data []byte, write, writers int) {
	writes := len(data) / write
	b.SetBytes(int64(write))
	var next sync.Mutex
	i := 0
	b.SetParallelism(writers)
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			next.Lock()
			w := i % writes
			i++
			next.Unlock()
			if err := f.dev.WriteAt(context.Background(), data[w*write:(w+1)*write], int64(w)*int64(write), false); err != nil {
				b.Error(err)
				return
			}
		}
	})
	st := f.dev.Stats()
	if st.MemUsedTotal > 0 {
		b.ReportMetric(float64(st.OrigDataSize)/float64(st.MemUsedTotal), "eff-ratio")
	}
}

// BenchmarkReadObjects measures 4 KiB reads of random pages of the corpus
// (or generated pages) written in 128 KiB writes with each write's pages
// kept in objects of 1 to 16 pages, and from the dense tier, every group
// aged: a read of a page of an object decodes the object as far as that
// page.
func BenchmarkReadObjects(b *testing.B) {
	data := benchPages(b)
	const write = 32 * pageSize
	data = data[:len(data)/write*write]
	pages := len(data) / pageSize
	for _, per := range []int{1, 4, 16, 0} {
		name := fmt.Sprintf("object-pages-%d", per)
		if per == 0 {
			name = "dense"
		}
		b.Run(name, func(b *testing.B) {
			f := newDeviceWith(b, int64(len(data)), pagestore.Config{}, pathInline, func(c *Config) {
				c.ObjectPages = per
				if per == 0 {
					c.Dense = DenseConfig{After: 100 * time.Microsecond, CPU: 1}
				}
			})
			for off := 0; off < len(data); off += write {
				if err := f.dev.WriteAt(context.Background(), data[off:off+write], int64(off), false); err != nil {
					b.Fatal(err)
				}
			}
			if per == 0 {
				age(b, f.dev)
			}
			r := rand.New(rand.NewPCG(1, 2))
			buf := make([]byte, pageSize)
			b.SetBytes(pageSize)
			b.ResetTimer()
			for range b.N {
				if err := f.dev.ReadAt(context.Background(), buf, int64(r.IntN(pages))*pageSize); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkReadTrace replays the reads of a recorded swap trace
// (bench/traces/host-2.iolog.zst: the kernel's readahead windows, most of
// 8 pages, at any page) over the corpus, its pages taken modulo the
// device's: from the fast tier, and from the dense tier with and without
// its cache of decoded frames. One op is one of the trace's reads.
func BenchmarkReadTrace(b *testing.B) {
	data := benchPages(b)
	const write = 32 * pageSize
	data = data[:len(data)/write*write]
	pages := len(data) / pageSize
	reads := traceReads(b, "../../bench/traces/host-2.iolog.zst", pages)
	for _, name := range []string{"fast", "dense", "dense-no-cache"} {
		b.Run(name, func(b *testing.B) {
			f := newDeviceWith(b, int64(len(data)), pagestore.Config{}, pathInline, func(c *Config) {
				if name != "fast" {
					c.Dense = DenseConfig{After: 100 * time.Microsecond, CPU: 1}
				}
			})
			for off := 0; off < len(data); off += write {
				if err := f.dev.WriteAt(context.Background(), data[off:off+write], int64(off), false); err != nil {
					b.Fatal(err)
				}
			}
			if name != "fast" {
				age(b, f.dev)
			}
			if name == "dense-no-cache" {
				f.dev.obj.frames = nil
			}
			buf := make([]byte, 32*pageSize)
			var bytes int64
			b.ResetTimer()
			for i := range b.N {
				r := reads[i%len(reads)]
				if err := f.dev.ReadAt(context.Background(), buf[:r.n*pageSize], int64(r.first)*pageSize); err != nil {
					b.Fatal(err)
				}
				bytes += int64(r.n) * pageSize
			}
			b.ReportMetric(float64(bytes)/b.Elapsed().Seconds()/1e6, "MB/s")
			if st := f.dev.Stats(); st.DenseFramesCached+st.DenseFramesDecoded > 0 {
				b.ReportMetric(float64(st.DenseFramesCached)/float64(st.DenseFramesCached+st.DenseFramesDecoded), "cached-frames")
			}
		})
	}
}

type traceRead struct{ first, n int }

// traceReads returns the reads of a recorded trace, moved onto pages
// pages (modulo, a read's pages kept adjacent).
func traceReads(b *testing.B, path string, pages int) []traceRead {
	trace, err := swaptrace.Read(path)
	if err != nil {
		b.Fatal(err)
	}
	var reads []traceRead
	for _, r := range trace {
		if r.Op != "read" {
			continue
		}
		if r.Len > 32*pageSize {
			b.Fatalf("the trace reads %d bytes at once: more than this benchmark takes", r.Len)
		}
		reads = append(reads, traceRead{first: int(r.Off/pageSize) % (pages - 32), n: int((r.Len + pageSize - 1) / pageSize)})
	}
	return reads
}
