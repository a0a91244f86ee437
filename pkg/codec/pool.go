// A fixed set of codec contexts that many goroutines share without a
// common lock.

package codec

import (
	"math/rand/v2"
	"sync"
)

// contextPool holds contexts of type T, each behind its own mutex. A caller
// tries them from a random one on, so that callers on different cores
// seldom meet: a channel or a single lock serializes every core on one
// cache line (with zstd reads on 16 cores, a buffered channel of
// contexts cost a third of the decoder's time in lock2 and futex).
type contextPool[T any] struct {
	s []pooled[T]
}

type pooled[T any] struct {
	mu  sync.Mutex
	ctx T
	// Keeps two contexts' mutexes off one cache line.
	_ [64]byte
}

// newContextPool holds each of ctxs.
func newContextPool[T any](ctxs []T) *contextPool[T] {
	p := &contextPool[T]{s: make([]pooled[T], len(ctxs))}
	for i, c := range ctxs {
		p.s[i].ctx = c
	}
	return p
}

// get locks a context: a free one if any, else the first it tried, waiting
// for it.
func (p *contextPool[T]) get() *pooled[T] {
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

func (s *pooled[T]) put() { s.mu.Unlock() }
