package codec

import (
	"math/rand/v2"
	"sync/atomic"
	"testing"
	"time"
)

// TestLZ4PageSurvivesChangingInput compresses pages that another goroutine
// keeps changing, as a late reader of a staging buffer that is being
// reused would see them: the result may be any bytes, but the compressor
// must stay within its output's limit. The output ends at an inaccessible
// page and is followed by guard bytes up to it, so a write past the limit
// faults or shows. (A match whose bytes changed between two reads once
// made the match length underflow and write 0xFF over megabytes.)
func TestLZ4PageSurvivesChangingInput(t *testing.T) {
	c := NewLZ4()
	in := fencedPage(t)
	out := fencedPage(t)
	const limit = 3263
	d := time.Second
	if testing.Short() {
		d = 200 * time.Millisecond
	}
	var stop atomic.Bool
	mutated := make(chan struct{})
	go func() {
		defer close(mutated)
		r := rand.New(rand.NewPCG(7, 7))
		for !stop.Load() {
			// Runs of a repeated word, with random bytes flipped in
			// them: many 4-byte matches, some broken while they are
			// measured.
			for i := 0; i < 64; i++ {
				in[r.IntN(PageSize)] ^= byte(1 << r.IntN(8))
			}
			if r.IntN(256) == 0 {
				w := byte(r.Uint32())
				for i := range in {
					in[i] = w + byte(i/64)
				}
			}
		}
	}()
	compressions := 0
	for start := time.Now(); time.Since(start) < d; compressions++ {
		for i := limit; i < PageSize; i++ {
			out[i] = guard
		}
		n := c.Compress(out[:limit], in)
		if n < 0 || n > limit {
			t.Fatalf("compression %d returned length %d, limit %d", compressions, n, limit)
		}
		for i := limit; i < PageSize; i++ {
			if out[i] != guard {
				t.Fatalf("compression %d wrote byte %d, past its limit %d", compressions, i, limit)
			}
		}
	}
	stop.Store(true)
	<-mutated
	t.Logf("%d compressions of a changing page", compressions)
}
