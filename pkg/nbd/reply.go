// Writing replies: whoever finds no write under way sends every queued one in one writev.

package nbd

import (
	"bufio"
	"errors"
	"log/slog"
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

	// What writing needs of the connection, set as its transmission
	// starts: sock to write to (plain connections), nc for the write
	// deadline and to close it when a write fails, done to release each
	// request once its reply is out, and the server's timeout, log and
	// observer with remote, which names the client in log lines.
	sock, nc net.Conn
	done     func(*request)
	timeout  time.Duration
	log      *slog.Logger
	obs      Observer
	remote   func() string
}

// reply queues the requests' simple replies and releases each once it is
// written. The first worker to find no write under way becomes the
// writer: it sends
// every queued reply (headers and read payloads) in one writev, and loops
// while more arrive, so replies that complete together share a syscall.
// Replies leave in completion order, not request order.
func (q *replyQueue) reply(rs ...*request) {
	for _, r := range rs {
		be.PutUint32(r.hdr[0:], magicReply)
		be.PutUint32(r.hdr[4:], r.errno)
		be.PutUint64(r.hdr[8:], r.cookie)
	}

	q.mu.Lock()
	q.pending = append(q.pending, rs...)
	if q.writing {
		q.mu.Unlock()
		return
	}
	q.writing = true
	for len(q.pending) > 0 {
		q.batch, q.pending = q.pending, q.batch[:0]
		dead := q.dead
		q.mu.Unlock()

		if !dead {
			q.iov = q.iovs[:0]
			for _, r := range q.batch {
				q.iov = append(q.iov, r.hdr[:])
				if r.cmd == CmdRead && r.errno == 0 && len(r.data) > 0 {
					q.iov = append(q.iov, r.data)
				}
			}
			used := len(q.iov)
			if q.timeout > 0 {
				q.nc.SetWriteDeadline(time.Now().Add(q.timeout))
			}
			if err := q.writeReplies(); err != nil {
				if errors.Is(err, os.ErrDeadlineExceeded) {
					q.log.Warn("nbd: client not reading replies; dropping connection",
						"remote", q.remote(), "reply_timeout", q.timeout)
				}
				dead = true
				// Wake the reader: nobody is listening any more.
				q.nc.Close()
			}
			// Drop the references to payloads that go back to the pool.
			clear(q.iovs[:used])
		}
		for i, r := range q.batch {
			if q.obs != nil {
				q.obs.RequestDone(r.cmd, r.length, time.Since(r.start), r.errno)
			}
			q.done(r)
			q.batch[i] = nil
		}

		q.mu.Lock()
		q.dead = q.dead || dead
	}
	q.writing = false
	q.mu.Unlock()
}

// writeReplies writes iov, the replies' headers and payloads, in one
// writev on a plain socket; over TLS in as few records as they fill.
func (q *replyQueue) writeReplies() error {
	if q.tls == nil {
		_, err := q.iov.WriteTo(q.sock)
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

// putRequest recycles r: a write's payload the Backend was to receive is
// given up, and r's buffer goes back to the connection's.
func (c *conn) putRequest(r *request) {
	if r.rcpt != nil {
		c.recv.AbortWrite(r.rcpt)
		r.rcpt = nil
	}
	c.payload.put(r)
	c.free <- r
}

// release recycles a finished request.
func (c *conn) release(r *request) {
	c.putRequest(r)
	c.inflight.Done()
}

// kill drops the connection after a fault: no more replies are written and
// the reader fails on its next read.
func (q *replyQueue) kill() {
	q.mu.Lock()
	q.dead = true
	q.mu.Unlock()
	q.nc.Close()
}
