// Writing replies: whoever finds no write under way sends every queued one in one writev.

package nbd

import (
	"errors"
	"os"
	"time"
)

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

	c.wmu.Lock()
	c.pending = append(c.pending, rs...)
	if c.writing {
		c.wmu.Unlock()
		return
	}
	c.writing = true
	for len(c.pending) > 0 {
		c.batch, c.pending = c.pending, c.batch[:0]
		dead := c.dead
		c.wmu.Unlock()

		if !dead {
			c.iov = c.iovs[:0]
			for _, r := range c.batch {
				c.iov = append(c.iov, r.hdr[:])
				if r.cmd == CmdRead && r.errno == 0 && len(r.data) > 0 {
					c.iov = append(c.iov, r.data)
				}
			}
			used := len(c.iov)
			if c.srv.replyTimeout > 0 {
				c.nc.SetWriteDeadline(time.Now().Add(c.srv.replyTimeout))
			}
			if _, err := c.iov.WriteTo(c.sock); err != nil {
				if errors.Is(err, os.ErrDeadlineExceeded) {
					c.srv.log.Warn("nbd: client not reading replies; dropping connection",
						"remote", c.remote(), "reply_timeout", c.srv.replyTimeout)
				}
				dead = true
				// Wake the reader: nobody is listening any more.
				c.nc.Close()
			}
			// Drop the references to payloads that go back to the pool.
			clear(c.iovs[:used])
		}
		for i, r := range c.batch {
			if c.srv.obs != nil {
				c.srv.obs.RequestDone(r.cmd, r.length, time.Since(r.start), r.errno)
			}
			c.release(r)
			c.batch[i] = nil
		}

		c.wmu.Lock()
		c.dead = c.dead || dead
	}
	c.writing = false
	c.wmu.Unlock()
}

// release recycles a finished request.
func (c *conn) release(r *request) {
	c.putRequest(r)
	c.inflight.Done()
}

// kill drops the connection after a fault: no more replies are written and
// the reader fails on its next read.
func (c *conn) kill() {
	c.wmu.Lock()
	c.dead = true
	c.wmu.Unlock()
	c.nc.Close()
}
