package pagestore_test

import (
	"math/rand/v2"
	"testing"

	"github.com/gzramd/gzramd/internal/testneeds"
	"github.com/gzramd/gzramd/pkg/codec"
	"github.com/gzramd/gzramd/pkg/pagestore"
)

// compressCorpus compresses every page with LZ4; a page that does not
// shrink is kept raw, as the device keeps huge pages.
func compressCorpus(tb testing.TB) (pages int, compressed [][]byte) {
	data := testneeds.Corpus(tb)
	lz4 := codec.NewLZ4()
	buf := make([]byte, codec.PageSize)
	for off := 0; off < len(data); off += codec.PageSize {
		page := data[off : off+codec.PageSize]
		n := lz4.Compress(buf, page)
		if n == 0 {
			compressed = append(compressed, page)
		} else {
			compressed = append(compressed, append([]byte(nil), buf[:n]...))
		}
	}
	return len(compressed), compressed
}

// TestCorpusRatio stores the LZ4-compressed corpus and compares the
// effective ratio (original bytes / memory held, zram's
// orig_data_size / mem_used_total) with the codec's own ratio.
func TestCorpusRatio(t *testing.T) {
	pages, comp := compressCorpus(t)
	s, err := pagestore.New(pagestore.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	var sum int64
	handles := make([]pagestore.Handle, pages)
	for i, c := range comp {
		h, b, err := s.Alloc(len(c), uint32(i))
		if err != nil {
			t.Fatal(err)
		}
		copy(b, c)
		handles[i] = h
		sum += int64(len(c))
	}
	orig := float64(pages * codec.PageSize)
	st := s.Stats()
	codecRatio := orig / float64(sum)
	effective := orig / float64(st.MemUsed)
	t.Logf("%d pages: codec ratio %.4f, effective ratio %.4f (%.2f%% of the codec's); %d data bytes in %d bytes held; %.2f metadata bytes per allocation",
		pages, codecRatio, effective, 100*effective/codecRatio, st.ComprDataSize, st.MemUsed, float64(st.MetadataBytes)/float64(st.Allocations))
	if st.ComprDataSize != sum || st.Allocations != int64(pages) {
		t.Fatalf("stats %+v, want %d allocations of %d bytes", st, pages, sum)
	}
	if effective < 0.95*codecRatio {
		t.Errorf("effective ratio %.4f < 0.95 x codec ratio %.4f", effective, codecRatio)
	}
	if per := float64(st.MetadataBytes) / float64(st.Allocations); per > 8 {
		t.Errorf("%.2f metadata bytes per allocation, want <= 8", per)
	}
	for i, h := range handles {
		if string(s.Bytes(h, len(comp[i]))) != string(comp[i]) {
			t.Fatalf("page %d: stored bytes differ", i)
		}
	}

	// Trim a random half, as a swap device sees, and compact.
	rng := rand.New(rand.NewPCG(41, 42))
	kept, keptData := 0, int64(0)
	for i, h := range handles {
		if rng.IntN(2) == 0 {
			s.Free(h)
			handles[i] = 0
		} else {
			kept++
			keptData += int64(len(comp[i]))
		}
	}
	fragmented := s.Stats().MemUsed
	moved := s.Compact(func(owner uint32, old, new pagestore.Handle) bool {
		if handles[owner] != old {
			return false
		}
		handles[owner] = new
		return true
	})
	st = s.Stats()
	orig = float64(kept * codec.PageSize)
	codecRatio, effective = orig/float64(keptData), orig/float64(st.MemUsed)
	t.Logf("half trimmed: %d bytes held before Compact, %d after (%d allocations moved); codec ratio %.4f, effective %.4f (%.2f%%)",
		fragmented, st.MemUsed, moved, codecRatio, effective, 100*effective/codecRatio)
	if effective < 0.9*codecRatio {
		t.Errorf("after compaction, effective ratio %.4f < 0.9 x codec ratio %.4f", effective, codecRatio)
	}
	for i, h := range handles {
		if h != 0 && string(s.Bytes(h, len(comp[i]))) != string(comp[i]) {
			t.Fatalf("page %d: stored bytes differ after compaction", i)
		}
	}
}
