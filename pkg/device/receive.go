// Writes whose payload the NBD server reads straight into staging (blockdev.WriteReceiver).

package device

import (
	"context"

	"github.com/gzramd/gzramd/pkg/blockdev"
	"github.com/gzramd/gzramd/pkg/stage"
)

// maxReceived bounds the writes being received at once (the NBD server
// reads one payload at a time per connection): more are declined.
const maxReceived = 256

// maxSegments bounds the staging batches one received write spans.
const maxSegments = 4

// unusedSlot marks a staging slot that holds no write: a received page
// that turned out same-filled, or a receive that was aborted. Its batch
// compresses it for nothing and commits nothing for it.
const unusedSlot = ^uint32(0)

// received is a write whose payload the NBD server reads straight into
// staging slots (blockdev.WriteReceiver), saving the copy out of a buffer.
type received struct {
	first uint32 // its first page
	pages int
	segs  [maxSegments]segment
	bufs  [maxSegments][]byte
	nsegs int
}

// segment is a run of slots of one staging batch.
type segment struct {
	b     *stage.Batch
	at, k int
}

// Buffers implements blockdev.Receipt.
func (r *received) Buffers() [][]byte { return r.bufs[:r.nsegs] }

// ReceiveWrite implements blockdev.WriteReceiver: a write of whole pages is
// received into staging slots when the router stages writes and staging
// has room for all of it; others are declined.
func (d *Device) ReceiveWrite(off int64, length int) (blockdev.Receipt, bool) {
	if d.stager == nil {
		return nil, false
	}
	return d.stager.receive(off, length)
}

// receive receives a write into staging slots (ReceiveWrite).
func (s *stager) receive(off int64, length int) (blockdev.Receipt, bool) {
	if length <= 0 || off%pageSize != 0 || length%pageSize != 0 ||
		off < 0 || off > int64(s.t.pages)*pageSize-int64(length) || !s.router.Stage(length/pageSize) {
		return nil, false
	}
	var r *received
	select {
	case r = <-s.receipts:
	default:
		return nil, false
	}
	n := length / pageSize
	if s.store.Reserve(int64(n)*pageSize) != nil {
		s.receipts <- r
		return nil, false
	}
	r.first, r.pages, r.nsegs = uint32(off/pageSize), n, 0
	for got := 0; got < n; {
		if r.nsegs == maxSegments {
			s.abort(r)
			return nil, false
		}
		b, at, k := s.area.Take(n - got)
		if k == 0 {
			s.abort(r)
			return nil, false
		}
		r.segs[r.nsegs] = segment{b: b, at: at, k: k}
		r.bufs[r.nsegs] = b.Pages[at*pageSize : (at+k)*pageSize]
		r.nsegs++
		got += k
	}
	s.router.Count(n) // a write declined is counted where it is written after
	return r, true
}

// CompleteWrite implements blockdev.WriteReceiver: the received pages are
// installed as staged, but for same-filled ones, which settle here as
// WriteAt would settle them.
func (d *Device) CompleteWrite(_ context.Context, rc blockdev.Receipt, _ bool) error {
	d.stager.complete(rc.(*received))
	return nil
}

// complete installs the pages of r (CompleteWrite).
func (s *stager) complete(r *received) {
	idx, staged := r.first, 0
	for _, sg := range r.segs[:r.nsegs] {
		b := sg.b
		for i := sg.at; i < sg.at+sg.k; i++ {
			// A same-filled page settles now, unless the store has no
			// room for its word: it is staged like any other then.
			if w, ok := fillWord(b.Page(i)); ok && s.writeFilled(idx, w) == nil {
				b.Owners[i], b.Words[i] = unusedSlot, 0
				s.unusedSlots.Add(1)
			} else {
				s.install(b, i, idx)
				staged++
			}
			idx++
		}
		s.area.Done(b)
	}
	s.store.Unreserve(int64(r.pages-staged) * pageSize)
	s.stagedWrites.Add(uint64(staged))
	s.receipts <- r
}

// AbortWrite implements blockdev.WriteReceiver.
func (d *Device) AbortWrite(rc blockdev.Receipt) { d.stager.abort(rc.(*received)) }

// abort gives back the slots and the reservation of r, and r.
func (s *stager) abort(r *received) {
	for _, sg := range r.segs[:r.nsegs] {
		for i := sg.at; i < sg.at+sg.k; i++ {
			sg.b.Owners[i], sg.b.Words[i] = unusedSlot, 0
			s.unusedSlots.Add(1)
		}
		s.area.Done(sg.b)
	}
	s.store.Unreserve(int64(r.pages) * pageSize)
	r.nsegs = 0
	s.receipts <- r
}

// install points page idx at slot i of b, whose bytes are the
// page's new content; the object it replaces is freed with the batch.
func (s *stager) install(b *stage.Batch, i int, idx uint32) {
	st := s.t.stripe(idx)
	st.mu.Lock()
	ref := s.t.swapLocked(st, idx, s.entryAt(b, i))
	st.mu.Unlock()
	b.Owners[i] = idx
	b.Words[i] = uint64(ref)
}
