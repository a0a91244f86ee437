package device

import (
	"bytes"
	"context"
	"testing"

	"github.com/gzramd/gzramd/pkg/pagestore"
)

// TestFrameCacheMatchesTheStream: a frame is taken from the cache only
// for the chunk, the pages and the very stream it was decoded from, and
// only as far as it was decoded; the least recently used goes first.
func TestFrameCacheMatchesTheStream(t *testing.T) {
	c := newFrameCache()
	src := bytes.Repeat([]byte("stream"), 100)
	frame := bytes.Repeat([]byte{7}, 4*pageSize)
	out := make([]byte, 4*pageSize)
	const h = pagestore.Handle(42)
	if n := c.get(h, 4, src, out, pageSize); n != 0 {
		t.Fatalf("an empty cache gave %d bytes", n)
	}
	c.put(h, 4, src, frame[:2*pageSize])
	if n := c.get(h, 4, src, out, 2*pageSize); n != 2*pageSize || !bytes.Equal(out[:n], frame[:n]) {
		t.Fatalf("the frame put: %d bytes", n)
	}
	if n := c.get(h, 4, src, out, 3*pageSize); n != 0 {
		t.Fatal("a frame decoded as far as 2 pages gave 3")
	}
	other := bytes.Clone(src)
	other[len(other)-1] ^= 1
	if n := c.get(h, 4, other, out, pageSize); n != 0 {
		t.Fatal("another stream in the same chunk (freed and reused) was taken from the cache")
	}
	if n := c.get(h, 4, src[:len(src)-1], out, pageSize); n != 0 {
		t.Fatal("a shorter stream was taken from the cache")
	}
	if n := c.get(h, 3, src, out, pageSize); n != 0 {
		t.Fatal("the frame was taken for another count of pages")
	}
	// Decoded further, the frame replaces its own slot.
	c.put(h, 4, src, frame)
	if n := c.get(h, 4, src, out, 4*pageSize); n != 4*pageSize {
		t.Fatalf("the whole frame: %d bytes", n)
	}
	for i := range frameCacheSlots - 1 {
		c.put(pagestore.Handle(100+i), 4, src, frame)
	}
	if n := c.get(h, 4, src, out, pageSize); n == 0 {
		t.Fatal("the frame went while the cache had room")
	}
	// h was used last; 100 is now the least recently used.
	c.put(200, 4, src, frame)
	if c.get(100, 4, src, out, pageSize) != 0 || c.get(h, 4, src, out, pageSize) == 0 {
		t.Fatal("the cache did not replace its least recently used frame")
	}
	if c.put(300, 4, make([]byte, frameCacheSrc+1), frame); c.get(300, 4, make([]byte, frameCacheSrc+1), out, pageSize) != 0 {
		t.Fatal("a frame longer than the cache keeps was kept")
	}
}

// TestDenseReadaheadWindowsUseTheCache reads an aged device in the
// kernel's readahead windows of 8 pages starting between frames, forward
// and back: every page reads back, and a window takes the frame the one
// before it ended in from the cache. Its pages then leave the tier and
// new ones age in (chunks freed and taken again), and reads give the new
// pages, never the cached old ones.
func TestDenseReadaheadWindowsUseTheCache(t *testing.T) {
	const pages = 128
	f := newDenseFixture(t, pages, 1)
	d, store := f.open(t)
	defer func() { d.Close(); store.Close() }()
	ctx := context.Background()
	data := denseData(pages)
	for round := range 3 {
		if err := d.WriteAt(ctx, data, 0, false); err != nil {
			t.Fatal(err)
		}
		age(t, d)
		if st := d.Stats(); st.DensePages == 0 {
			t.Fatal("nothing aged into the dense tier")
		}
		before := d.Stats()
		got := make([]byte, 8*pageSize)
		check := func(first int) {
			t.Helper()
			if err := d.ReadAt(ctx, got, int64(first)*pageSize); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, data[first*pageSize:(first+8)*pageSize]) {
				t.Fatalf("round %d: pages %d to %d read back wrong", round, first, first+7)
			}
		}
		for first := 1; first+8 <= pages; first += 8 {
			check(first)
		}
		for first := pages - 11; first >= 0; first -= 8 {
			check(first)
		}
		st := d.Stats()
		cached, decoded := st.DenseFramesCached-before.DenseFramesCached, st.DenseFramesDecoded-before.DenseFramesDecoded
		if cached == 0 || decoded == 0 {
			t.Fatalf("round %d: %d frames from the cache, %d decoded", round, cached, decoded)
		}
		t.Logf("round %d: %d frames from the cache, %d decoded", round, cached, decoded)
		// New pages: each round's content differs from the last's.
		for i := range pages {
			objectPage(uint64(round+3+i%3), i%5, data[i*pageSize:(i+1)*pageSize])
		}
	}
	checkStore(t, d, store)
}
