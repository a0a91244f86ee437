// Writing replies: whoever finds no write under way sends every queued one in one writev.

package nbd

import (
	"bufio"
	"errors"
	"net"
	"os"
	"sync"
	"time"
)

// replyQueue is a connection's replies waiting to be written, and the
// buffers of the one worker writing them.
type replyQueue struct {
	// mu guards pending, writing and dead. After the first write error (or
	// a backend panic) dead is set and further replies are dropped.
	mu      sync.Mutex
	pending []*request // replies waiting for the writer
	writing bool       // a worker is writing replies
	dead    bool
	// Owned by the worker that is writing.
	batch []*request
	iovs  [][]byte // backing array of iov, 2 per request
	iov   net.Buffers
	// tls gathers the replies to a TLS client into records of up to
	// tlsRecordSize (nil for a plain one, whose writev gathers them).
	tls *bufio.Writer
	// gather, beneath the TLS session, makes one write of the records a
	// batch of replies fills.
	gather *recordGatherer
}

// reply queues the requests' simple replies and releases each once it is
// written. The first worker to find no write under way becomes the
// writer: it sends
// every queued reply (headers and read payloads) in one writev, and loops
// while more arrive, so replies that complete together share a syscall.
// Replies leave in completion order, not request order.
func (c *conn) reply(rs ...*request) {
	for _, r := range rs {
		be.PutUint32(r.hdr[0:], magicReply)
		be.PutUint32(r.hdr[4:], r.errno)
		be.PutUint64(r.hdr[8:], r.cookie)
	}

	c.replies.mu.Lock()
	c.replies.pending = append(c.replies.pending, rs...)
	if c.replies.writing {
		c.replies.mu.Unlock()
		return
	}
	c.replies.writing = true
	for len(c.replies.pending) > 0 {
		c.replies.batch, c.replies.pending = c.replies.pending, c.replies.batch[:0]
		dead := c.replies.dead
		c.replies.mu.Unlock()

		if !dead {
			c.replies.iov = c.replies.iovs[:0]
			for _, r := range c.replies.batch {
				c.replies.iov = append(c.replies.iov, r.hdr[:])
				if r.cmd == CmdRead && r.errno == 0 && len(r.data) > 0 {
					c.replies.iov = append(c.replies.iov, r.data)
				}
			}
			used := len(c.replies.iov)
			if c.srv.replyTimeout > 0 {
				c.nc.SetWriteDeadline(time.Now().Add(c.srv.replyTimeout))
			}
			if err := c.writeReplies(); err != nil {
				if errors.Is(err, os.ErrDeadlineExceeded) {
					c.srv.log.Warn("nbd: client not reading replies; dropping connection",
						"remote", c.remote(), "reply_timeout", c.srv.replyTimeout)
				}
				dead = true
				// Wake the reader: nobody is listening any more.
				c.nc.Close()
			}
			// Drop the references to payloads that go back to the pool.
			clear(c.replies.iovs[:used])
		}
		for i, r := range c.replies.batch {
			if c.srv.obs != nil {
				c.srv.obs.RequestDone(r.cmd, r.length, time.Since(r.start), r.errno)
			}
			c.release(r)
			c.replies.batch[i] = nil
		}

		c.replies.mu.Lock()
		c.replies.dead = c.replies.dead || dead
	}
	c.replies.writing = false
	c.replies.mu.Unlock()
}

// writeReplies writes iov, the replies' headers and payloads, in one
// writev on a plain socket; over TLS in as few records as they fill.
func (c *conn) writeReplies() error {
	q := &c.replies
	if q.tls == nil {
		_, err := q.iov.WriteTo(c.sock)
		return err
	}
	q.gather.start()
	_, err := q.iov.WriteTo(q.tls)
	if err == nil {
		err = q.tls.Flush()
	}
	if ferr := q.gather.flush(); err == nil {
		err = ferr
	}
	return err
}

// release recycles a finished request.
func (c *conn) release(r *request) {
	c.putRequest(r)
	c.inflight.Done()
}

// kill drops the connection after a fault: no more replies are written and
// the reader fails on its next read.
func (c *conn) kill() {
	c.replies.mu.Lock()
	c.replies.dead = true
	c.replies.mu.Unlock()
	c.nc.Close()
}
