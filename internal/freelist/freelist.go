// Package freelist keeps reusable objects across garbage collections.
//
// sync.Pool empties at every collection, so a program that recycles its
// buffers through one allocates them afresh after each. For a swap device
// that is the wrong trade: fresh memory is touched for the first time
// while the kernel is short of memory, and a page fault then waits for the
// swap-out that is waiting for the daemon. A List keeps up to its capacity
// for as long as it lives.
package freelist

// List is a bounded free list of T. Its zero value is not usable; call New.
type List[T any] struct {
	free  chan T
	alloc func() T
}

// New returns a list that keeps up to capacity objects and makes new
// ones with alloc when it has none.
func New[T any](capacity int, alloc func() T) *List[T] {
	return &List[T]{free: make(chan T, capacity), alloc: alloc}
}

// Get returns a kept object, or a new one.
func (l *List[T]) Get() T {
	select {
	case v := <-l.free:
		return v
	default:
		return l.alloc()
	}
}

// Put keeps v for a later Get, or drops it when the list is full.
func (l *List[T]) Put(v T) {
	select {
	case l.free <- v:
	default:
	}
}

// Fill makes objects until the list holds its capacity, so that Gets up
// to that many allocate nothing.
func (l *List[T]) Fill() {
	for len(l.free) < cap(l.free) {
		l.Put(l.alloc())
	}
}
