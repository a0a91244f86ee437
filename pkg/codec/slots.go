// A fixed set of codec contexts that many goroutines share without a
// common lock.

package codec

import (
	"math/rand/v2"
	"sync"
)

// slots holds contexts of type T, each behind its own mutex. A caller
// tries them from a random one on, so that callers on different cores
// seldom meet: a channel or a single lock serializes every core on one
// cache line (with zstd reads on 16 cores, a buffered channel of
// contexts cost a third of the decoder's time in lock2 and futex).
type slots[T any] struct {
	s []slot[T]
}

type slot[T any] struct {
	mu  sync.Mutex
	ctx T
	// Keeps two slots' mutexes off one cache line.
	_ [64]byte
}

// newSlots returns a slot for each context.
func newSlots[T any](ctxs []T) *slots[T] {
	p := &slots[T]{s: make([]slot[T], len(ctxs))}
	for i, c := range ctxs {
		p.s[i].ctx = c
	}
	return p
}

// get locks a slot: a free one if any, else the first it tried, waiting
// for it.
func (p *slots[T]) get() *slot[T] {
	n := uint32(len(p.s))
	start := rand.Uint32N(n)
	for i := range n {
		s := &p.s[(start+i)%n]
		if s.mu.TryLock() {
			return s
		}
	}
	s := &p.s[start]
	s.mu.Lock()
	return s
}

func (s *slot[T]) put() { s.mu.Unlock() }
