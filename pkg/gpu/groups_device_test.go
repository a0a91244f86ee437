//go:build gpu

// Groups of pages compressed as one zstd frame on a real GPU: every frame
// decodes with libzstd, a page of it decodes without the pages after it,
// and what it stores and costs beside libzstd's frames of the same groups.

package gpu

import (
	"bytes"
	"context"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/gzramd/gzramd/internal/testneeds"
	"github.com/gzramd/gzramd/pkg/codec"
)

const groupBytes = codec.GroupPages * codec.PageSize

// groupRoundTrip compresses pages, whole groups, with CompressGroups and
// checks every frame: it decodes with libzstd to its group, and its first
// page, a middle one and its last decode alone with DecompressPrefix. It
// returns the bytes stored (the frames; a group without one counted
// whole), the groups declined (not those no smaller than their pages),
// and the time and this process's CPU time the compression took.
func groupRoundTrip(t *testing.T, g *Backend, pages []byte) (stored, declined int, wall, cpu time.Duration) {
	t.Helper()
	dec, err := codec.NewZstdDecoder(1)
	if err != nil {
		t.Fatal(err)
	}
	groups := len(pages) / groupBytes
	per := g.MaxGroups()
	b, err := g.NewBatch(per * codec.GroupPages)
	if err != nil {
		t.Fatal(err)
	}
	got := make([]byte, groupBytes)
	for lo := 0; lo < groups; lo += per {
		n := min(per, groups-lo)
		in := pages[lo*groupBytes : (lo+n)*groupBytes]
		copy(b.Pages, in)
		b.N = n * codec.GroupPages
		start, cpu0 := time.Now(), cpuTime(t)
		if err := g.CompressGroups(context.Background(), b, codec.Packed{}); err != nil {
			t.Fatalf("groups %d..%d: %v", lo, lo+n, err)
		}
		wall += time.Since(start)
		cpu += cpuTime(t) - cpu0
		for i := range n {
			want := in[i*groupBytes : (i+1)*groupBytes]
			frame := b.Compressed(i)
			if frame == nil {
				if b.Offsets[i] != codec.GroupNotSmaller {
					declined++
				}
				stored += groupBytes
				continue
			}
			stored += len(frame)
			if err := dec.Decompress(got, frame); err != nil || !bytes.Equal(got, want) {
				t.Fatalf("group %d: the frame of %d bytes does not decode to its pages (%v)", lo+i, len(frame), err)
			}
			for _, k := range []int{0, codec.GroupPages / 2, codec.GroupPages - 1} {
				clear(got)
				n := (k + 1) * codec.PageSize
				if err := dec.DecompressPrefix(got, frame, n); err != nil || !bytes.Equal(got[:n], want[:n]) {
					t.Fatalf("group %d: pages up to %d do not decode alone (%v)", lo+i, k, err)
				}
			}
		}
	}
	return stored, declined, wall, cpu
}

// TestGPUGroupsFromStored: groups whose pages come as stored, LZ4 blocks
// or zstd frames, decoded on the GPU first (every fifth page given
// decoded), store what the same pages given decoded store, and a group
// with a page that does not decode is declined, its neighbours not.
func TestGPUGroupsFromStored(t *testing.T) {
	pages := testneeds.Corpus(t)
	zstdPages, err := codec.NewZstd(1)
	if err != nil {
		t.Fatal(err)
	}
	for _, alg := range []string{"lz4", "zstd"} {
		for _, store := range []codec.Codec{codec.NewLZ4(), zstdPages} {
			t.Run(alg+"/"+store.Name(), func(t *testing.T) { groupsFromStored(t, pages, alg, store) })
		}
	}
}

func groupsFromStored(t *testing.T, pages []byte, alg string, store codec.Codec) {
	g := openGroups(t, alg)
	per := g.MaxGroups()
	n := per * codec.GroupPages
	in := pages[:n*codec.PageSize]
	plain, err := g.NewBatch(n)
	if err != nil {
		t.Fatal(err)
	}
	copy(plain.Pages, in)
	plain.N = n
	if err := g.CompressGroups(context.Background(), plain, codec.Packed{}); err != nil {
		t.Fatal(err)
	}
	b, err := g.NewBatch(n)
	if err != nil {
		t.Fatal(err)
	}
	packed := codec.Packed{Codec: store.Name(), Offsets: make([]uint32, n), Lens: make([]uint32, n)}
	offsets, lens := packed.Offsets, packed.Lens
	at := 0
	for i := range n {
		page := in[i*codec.PageSize : (i+1)*codec.PageSize]
		l := store.Compress(b.Out[at:at+codec.PageSize-1], page)
		if i%5 == 0 || l <= 0 {
			copy(b.Pages[i*codec.PageSize:], page)
			continue
		}
		offsets[i], lens[i] = uint32(at), uint32(l)
		at += l
	}
	bad := 2*codec.GroupPages + 4 // in group 2, given as stored
	lens[bad]--                   // a page cut short does not decode
	b.N = n
	if err := g.CompressGroups(context.Background(), b, packed); err != nil {
		t.Fatal(err)
	}
	dec, err := codec.NewZstdDecoder(1)
	if err != nil {
		t.Fatal(err)
	}
	got := make([]byte, groupBytes)
	for i := range per {
		switch frame := b.Compressed(i); {
		case i == bad/codec.GroupPages:
			if frame != nil {
				t.Fatalf("%s: group %d, with a page that does not decode, was compressed", alg, i)
			}
		case !bytes.Equal(frame, plain.Compressed(i)):
			t.Fatalf("%s: group %d: %d bytes from stored pages, %d from its pages", alg, i, len(frame), len(plain.Compressed(i)))
		case frame != nil:
			if err := dec.Decompress(got, frame); err != nil || !bytes.Equal(got, in[i*groupBytes:(i+1)*groupBytes]) {
				t.Fatalf("%s: group %d does not decode to its pages (%v)", alg, i, err)
			}
		}
	}
}

// cpuTime is the process's user and system time.
func cpuTime(t *testing.T) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		t.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// groupEdgePages are edgePages in groups: zeros, one byte, text, random
// (incompressible) pages, and pages alike, side by side.
func TestGPUGroupsEdgePages(t *testing.T) {
	for _, alg := range []string{"lz4", "zstd"} {
		t.Run(alg, func(t *testing.T) {
			g := openGroups(t, alg)
			pages := edgePages(9 * codec.GroupPages)
			_, declined, _, _ := groupRoundTrip(t, g, pages)
			// Whole groups of one kind, each kind's pages alike.
			alike := make([]byte, 0, 9*groupBytes)
			for k := range 9 {
				for range codec.GroupPages {
					alike = append(alike, pages[k*codec.PageSize:(k+1)*codec.PageSize]...)
				}
			}
			_, declinedAlike, _, _ := groupRoundTrip(t, g, alike)
			t.Logf("declined %d of 9 mixed groups, %d of 9 groups of one kind", declined, declinedAlike)
		})
	}
}

// TestGPUGroupsCorpus: every group of the corpus, and the ratio beside
// libzstd's frames of the same groups (levels 1 and 3, blocks of a page
// and of 16 KiB, the CPU dense tier's), and the CPU time per GB.
func TestGPUGroupsCorpus(t *testing.T) {
	pages := testneeds.Corpus(t)
	pages = pages[:len(pages)/groupBytes*groupBytes]
	n := float64(len(pages))
	for _, alg := range []string{"lz4", "zstd"} {
		t.Run(alg, func(t *testing.T) {
			g := openGroups(t, alg)
			stored, declined, wall, cpu := groupRoundTrip(t, g, pages)
			t.Logf("%s backend: %d groups, ratio %.3f, %d declined; %.0f MB/s, %.3f CPU-s per GB (%d groups a call)",
				alg, len(pages)/groupBytes, n/float64(stored), declined, n/wall.Seconds()/1e6, cpu.Seconds()/(n/1e9), g.MaxGroups())
		})
	}
	for _, c := range []struct{ level, block int }{{1, codec.PageSize}, {3, codec.PageSize}, {1, 16 << 10}, {3, 16 << 10}} {
		z, err := codec.NewZstdObjects(c.level, groupBytes, c.block)
		if err != nil {
			t.Fatal(err)
		}
		frame := make([]byte, groupBytes)
		stored := 0
		start, cpu0 := time.Now(), cpuTime(t)
		for i := 0; i < len(pages); i += groupBytes {
			if l := z.Compress(frame, pages[i:i+groupBytes]); l > 0 && l < groupBytes {
				stored += l
			} else {
				stored += groupBytes
			}
		}
		t.Logf("libzstd level %d, %d KiB blocks: ratio %.3f, %.0f MB/s, %.3f CPU-s per GB", c.level, c.block>>10,
			n/float64(stored), n/time.Since(start).Seconds()/1e6, (cpuTime(t)-cpu0).Seconds()/(n/1e9))
	}
}

// openGroups opens a backend of alg; with $GZRAMD_ZSTD_PTX, a zstd backend
// takes its kernels from there.
func openGroups(t *testing.T, alg string) *Backend {
	t.Helper()
	if alg == "zstd" {
		return openZstd(t, testConfig(t))
	}
	if os.Getenv("GZRAMD_ZSTD_PTX") != "" {
		t.Skip("the LZ4 backend links the embedded zstd kernels, not $GZRAMD_ZSTD_PTX's")
	}
	return openGPU(t, testConfig(t))
}
