// The ring of request records between the request path and the trace writer.

package iolog

import (
	"sync/atomic"

	"github.com/gzramd/gzramd/pkg/nbd"
)

// record is one request as the request path leaves it in the ring.
type record struct {
	off    uint64
	length uint32
	cmd    nbd.Command
}

// slot is one entry of the ring. Its sequence number says whose turn it
// is (Dmitry Vyukov's bounded queue): pos, free for the producer that
// claims position pos; pos+1, filled, for the consumer at pos.
type slot struct {
	seq atomic.Uint64
	rec record
}

// ring is a bounded queue of records with any number of producers and
// one consumer, in a fixed array: a producer claims a position with one
// compare-and-swap and never waits, and when the consumer is a whole lap
// behind, push fails instead.
type ring struct {
	slots []slot
	mask  uint64
	tail  atomic.Uint64 // the next position to claim
	head  uint64        // the next position to read; the consumer's alone
}

// newRing returns a ring of n slots, n a power of two. Setting every
// slot's sequence number writes all of its memory: the request path then
// never touches a page for the first time.
func newRing(n int) *ring {
	if n <= 0 || n&(n-1) != 0 {
		panic("iolog: ring size must be a power of two")
	}
	r := &ring{slots: make([]slot, n), mask: uint64(n - 1)}
	for i := range r.slots {
		r.slots[i].seq.Store(uint64(i))
	}
	return r
}

// push adds rec, or reports false when the ring is full.
func (r *ring) push(rec record) bool {
	pos := r.tail.Load()
	for {
		s := &r.slots[pos&r.mask]
		switch seq := s.seq.Load(); {
		case seq == pos:
			if r.tail.CompareAndSwap(pos, pos+1) {
				s.rec = rec
				s.seq.Store(pos + 1)
				return true
			}
		case int64(seq-pos) < 0:
			// The slot still holds the record of the previous lap.
			return false
		}
		// Another producer took pos first.
		pos = r.tail.Load()
	}
}

// pop removes the oldest record. It reports false when there is none, or
// when the oldest one's producer has claimed its slot but not yet filled
// it: the records after it wait for the next pop.
func (r *ring) pop() (record, bool) {
	s := &r.slots[r.head&r.mask]
	if s.seq.Load() != r.head+1 {
		return record{}, false
	}
	rec := s.rec
	s.seq.Store(r.head + uint64(len(r.slots)))
	r.head++
	return rec, true
}
