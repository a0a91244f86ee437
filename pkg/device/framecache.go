// A cache of the dense tier's decoded frames, for the readahead that
// follows a swap-in.

package device

import (
	"bytes"
	"sync"

	"github.com/gzramd/gzramd/pkg/dense"
	"github.com/gzramd/gzramd/pkg/pagestore"
)

// The kernel reads swapped pages back in readahead windows of up to
// 8 pages at any page, not aligned to the dense tier's frames, and the
// next window starts where the last one ended: a window decodes the
// frame it ends in, and the next decodes it again. Replaying a recorded
// swap trace's reads over the corpus, a cache of 8 decoded frames took
// the frames decoded a read from 2.44 to 1.76 and the decode time a read
// from 37 to 26 µs (bench/results/dense-frame-cache-2026-12-07.md).
const (
	frameCacheSlots = 8
	// frameCacheSrc is the longest frame kept: a frame that did not
	// compress to half its pages is rare, and is decoded each time.
	frameCacheSrc = dense.FramePages * pageSize / 2
)

// frameCache keeps frames of the dense tier that reads decoded, the
// least recently used replaced first. A slot is found by the frame's
// first chunk and used only if the frame's stream is the one it was
// decoded from, byte for byte: a frame freed and its chunk reused by
// another is then a miss, whatever path freed it (a rewrite, a trim,
// the compactor's move, a takeover), and no free needs to tell the
// cache. Decoding is a function of the stream, so a hit returns what
// decoding would.
type frameCache struct {
	mu    sync.Mutex
	clock uint64
	slots [frameCacheSlots]frameSlot
	// hits and misses count the frames reads took from the cache and
	// decoded (gzramd_dense_frame_reads_total).
	hits, misses uint64
}

type frameSlot struct {
	first   pagestore.Handle // 0: empty
	used    uint64
	pages   int // the frame's pages
	srcLen  int
	decoded int // bytes of the frame decoded into out
	src     [frameCacheSrc]byte
	out     [dense.FramePages * pageSize]byte
}

// newFrameCache makes the cache, its memory written now rather than
// first while serving.
func newFrameCache() *frameCache {
	c := new(frameCache)
	for i := range c.slots {
		clear(c.slots[i].src[:])
		clear(c.slots[i].out[:])
	}
	return c
}

// held is the memory the cache holds.
func (c *frameCache) held() int64 {
	return int64(len(c.slots)) * int64(len(frameSlot{}.src)+len(frameSlot{}.out))
}

// get copies into out the frame of pages pages whose first chunk is first
// and whose stream is src, if the cache holds at least its first want
// bytes decoded, and returns how many bytes it copied (0 for a miss).
func (c *frameCache) get(first pagestore.Handle, pages int, src, out []byte, want int) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	for i := range c.slots {
		s := &c.slots[i]
		if s.first != first || s.pages != pages || s.decoded < want || !bytes.Equal(s.src[:s.srcLen], src) {
			continue
		}
		c.clock++
		s.used = c.clock
		c.hits++
		return copy(out, s.out[:s.decoded])
	}
	c.misses++
	return 0
}

// put keeps the first len(decoded) bytes of the frame of pages pages whose
// first chunk is first and whose stream is src, in place of the least
// recently used slot (or of this frame's own, decoded less far).
func (c *frameCache) put(first pagestore.Handle, pages int, src, decoded []byte) {
	if len(src) > frameCacheSrc || len(decoded) > len(frameSlot{}.out) {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	victim := 0
	for i := range c.slots {
		if c.slots[i].first == first {
			victim = i
			break
		}
		if c.slots[i].used < c.slots[victim].used {
			victim = i
		}
	}
	c.clock++
	s := &c.slots[victim]
	s.first, s.used, s.pages = first, c.clock, pages
	s.srcLen = copy(s.src[:], src)
	s.decoded = copy(s.out[:], decoded)
}

// counts returns the frames reads took from the cache and decoded.
func (c *frameCache) counts() (hits, misses uint64) {
	if c == nil {
		return 0, 0
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.hits, c.misses
}
