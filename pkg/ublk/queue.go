package ublk

import (
	"fmt"
	"os"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/gzramd/gzramd/internal/uring"
)

// stopData marks the completion of a queue's poll on its stop eventfd;
// tags are below 1<<16.
const stopData = 1 << 32

// queue serves one of the device's hardware queues: a ring of its own,
// the tags' descriptors mapped from /dev/ublkcN and a data buffer, all
// set up before its first fetch and kept to the end, so that serving a
// request allocates nothing. One buffer serves every tag: the queue's
// thread serves its requests one after another, and each request's data
// is copied in and out (USER_COPY) before the next is served, so no
// request keeps the buffer past its commit.
type queue struct {
	id    uint16
	depth int
	maxIO int
	h     handler
	stop  int // eventfd: readable once the queue is to stop

	ioFlusher bool // mark the queue's thread the kernel's IO flusher

	ring  *uring.Ring
	descs []byte // the driver's descriptor area (read-only)
	buf   []byte // maxIO bytes of anonymous memory, every tag's in turn
}

// descAreaSize is the length of one queue's descriptor area, which the
// driver rounds up to whole pages.
func descAreaSize(depth int) int {
	page := os.Getpagesize()
	return (depth*ioDescSize + page - 1) / page * page
}

// descAreaOffset is where queue q's descriptor area is mapped from on
// /dev/ublkcN: the driver spaces the areas as if every queue were of
// MaxQueueDepth, whatever the device's depth.
func descAreaOffset(q uint16) int64 {
	return int64(q) * int64(descAreaSize(MaxQueueDepth))
}

// prepare sets up what the queue needs of its own: its ring and its
// buffers. It comes before the device's char device is opened: during a
// recovery, the time from START_USER_RECOVERY to the last fetch is all
// that a death must not interrupt (see Recover).
func (q *queue) prepare() error {
	if err := signalStackResident(); err != nil {
		return fmt.Errorf("ublk: queue %d: %w", q.id, err)
	}
	var err error
	if q.ioFlusher {
		// Per thread: this one's allocations must not wait on I/O,
		// which may be this queue's to serve.
		if err := unix.Prctl(unix.PR_SET_IO_FLUSHER, 1, 0, 0, 0); err != nil {
			return fmt.Errorf("ublk: queue %d: PR_SET_IO_FLUSHER: %w", q.id, err)
		}
	}
	q.ring, err = uring.New(uint32(2*q.depth), 0)
	if err != nil {
		return fmt.Errorf("ublk: queue %d: %w", q.id, err)
	}
	q.buf, err = unix.Mmap(-1, 0, q.maxIO, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		return fmt.Errorf("ublk: queue %d: buffer: %w", q.id, err)
	}
	prefault(q.buf)
	return nil
}

// attach has the queue serve through h's char device.
func (q *queue) attach(h handler) {
	q.h = h
	q.h.q = q.id
}

// mapDescs maps the queue's descriptors from its char device. The
// driver writes a request's descriptor before its fetch completes, so
// they are read only after.
func (q *queue) mapDescs() error {
	var err error
	q.descs, err = unix.Mmap(q.h.data, descAreaOffset(q.id), descAreaSize(q.depth), unix.PROT_READ, unix.MAP_SHARED|unix.MAP_POPULATE)
	if err != nil {
		return fmt.Errorf("ublk: queue %d: mapping its descriptors: %w", q.id, err)
	}
	return nil
}

// prefault writes to every page of b, so that each is there before the
// queue serves: a page first touched by the driver's copy would be
// allocated while serving, and with the device as swap that allocation
// may reclaim by writing to the device (seen in the e2e guest: the
// queue's thread in do_anonymous_page under pread, reclaiming, for good).
// MAP_POPULATE is not enough: under mlockall(MCL_ONFAULT) the kernel
// populates nothing.
func prefault(b []byte) {
	page := os.Getpagesize()
	for i := 0; i < len(b); i += page {
		b[i] = 0
	}
}

// close gives everything back; closing the ring cancels the fetches the
// driver still holds.
func (q *queue) close() {
	if q.ring != nil {
		q.ring.Close()
	}
	for _, m := range [][]byte{q.descs, q.buf} {
		if m != nil {
			_ = unix.Munmap(m)
		}
	}
	q.ring, q.descs, q.buf = nil, nil, nil
}

// desc is tag's descriptor as the driver last wrote it.
func (q *queue) desc(tag uint16) ioDesc {
	return *(*ioDesc)(unsafe.Pointer(&q.descs[int(tag)*ioDescSize]))
}

// prepIO fills the next entry with FETCH_REQ or COMMIT_AND_FETCH_REQ for
// tag. The ring has room for every tag and the stop poll, so an entry is
// always free.
func (q *queue) prepIO(op uint32, tag uint16, result int32) error {
	c := ioCmd{QID: q.id, Tag: tag, Result: result}
	e := q.ring.NextSQE()
	if e == nil {
		return fmt.Errorf("ublk: queue %d: ring full", q.id)
	}
	return e.PrepUringCmd(q.h.data, op, (*[ioCmdSize]byte)(unsafe.Pointer(&c))[:], uint64(tag))
}

// fetchAll sends a FETCH_REQ for every tag and the stop poll. The driver
// counts the fetches; START_DEV waits for all of them.
func (q *queue) fetchAll() error {
	for tag := range q.depth {
		if err := q.prepIO(ioFetchReq, uint16(tag), 0); err != nil {
			return err
		}
	}
	e := q.ring.NextSQE()
	if e == nil {
		return fmt.Errorf("ublk: queue %d: ring full", q.id)
	}
	e.PrepPollAdd(q.stop, unix.POLLIN, stopData)
	if err := q.ring.Submit(0); err != nil {
		return fmt.Errorf("ublk: queue %d: fetching: %w", q.id, err)
	}
	return nil
}

// serve runs requests until the stop eventfd is written or the driver
// aborts every tag. It runs on the thread that called fetchAll: the
// driver takes a queue's commands from one task only. Nothing here
// allocates (no closure, no error but on the way out).
func (q *queue) serve() error {
	live := q.depth
	var ioErr error
	stopping := false
	for live > 0 {
		if err := q.ring.Submit(1); err != nil {
			return fmt.Errorf("ublk: queue %d: %w", q.id, err)
		}
		for {
			c, ok := q.ring.PopCQE()
			if !ok {
				break
			}
			if c.UserData == stopData {
				// The requests already taken are answered first: a
				// server leaving the device to the next (ErrLeave) hands
				// over at a request boundary.
				stopping = true
				continue
			}
			tag := uint16(c.UserData)
			switch {
			case c.Res == ioResOK && int(tag) < q.depth:
				res := q.h.serve(tag, q.desc(tag), q.buf)
				if err := q.prepIO(ioCommitAndFetchReq, tag, res); err != nil && ioErr == nil {
					ioErr = err
				}
			case c.Res == ioResAbort:
				live--
			default:
				// The driver refused a fetch or commit: the tag is lost
				// to this server.
				live--
				errno := unix.EINVAL // a tag the queue does not have
				if c.Res < 0 {
					errno = unix.Errno(-c.Res)
				}
				if ioErr == nil {
					ioErr = fmt.Errorf("ublk: queue %d tag %d: %w", q.id, tag, errno)
				}
			}
		}
		if stopping {
			if err := q.ring.Submit(0); err != nil && ioErr == nil {
				ioErr = fmt.Errorf("ublk: queue %d: %w", q.id, err)
			}
			return ioErr
		}
	}
	return ioErr
}

// stackBytes is how far a queue's goroutine grows its stack before it
// serves. The backend's calls run on that goroutine, and a first deep
// call (a compressor's tables on the stack) would otherwise allocate a
// larger stack while serving: with the device as swap, that allocation
// may wait for reclaim to write to the device (seen in the e2e guest: a
// queue's thread in the runtime's span bookkeeping, faulting, reclaiming).
// The runtime may shrink it again at a garbage collection unless
// GODEBUG=gcshrinkstackoff=1.
const stackBytes = 256 << 10

// growStack uses at least n bytes of stack, in frames of 16 KiB.
//
//go:noinline
func growStack(n int) byte {
	var frame [16 << 10]byte
	frame[n%len(frame)] = byte(n)
	if n > len(frame) {
		return growStack(n-len(frame)) ^ frame[n%len(frame)]
	}
	return frame[n%len(frame)]
}
