// Running requests on the connection's reader, and on its helpers, with replies held back to go out together.

package nbd

const (
	// maxHeld bounds the replies an inline connection sends in one write.
	maxHeld = 64
	// maxInlineBytes is the largest request an inline connection runs on
	// its reader; larger ones go to the workers, where several run at once
	// and a hand-off costs little next to the work.
	maxInlineBytes = 64 << 10
)

// runInline runs r on the reader goroutine and holds its reply back, to
// go out with the replies of the requests read after it without waiting.
// With helpers, r only joins the queue: the queue runs, in shares, when
// the replies are about to go out (flushHeld).
func (c *conn) runInline(r *request) {
	if c.shares != nil {
		c.queued = append(c.queued, r)
		if len(c.queued)+len(c.held) >= maxHeld {
			c.flushHeld()
		}
		return
	}
	if !c.run(r) {
		return
	}
	c.held = append(c.held, r)
	if len(c.held) == maxHeld {
		c.flushHeld()
	}
}

// runQueued runs the queued requests, a share each on the helpers and
// the rest on the reader, and holds the replies of those that ran.
func (c *conn) runQueued() {
	q := c.queued
	if len(q) == 0 {
		return
	}
	n := min(cap(c.shares)+1, len(q))
	per := (len(q) + n - 1) / n
	for lo := per; lo < len(q); lo += per {
		c.sharing.Add(1)
		c.shares <- q[lo:min(lo+per, len(q))]
	}
	c.runShare(q[:per])
	c.sharing.Wait()
	for _, r := range q {
		if !r.dropped {
			c.held = append(c.held, r)
		}
	}
	clear(c.queued)
	c.queued = c.queued[:0]
}

// runShare runs the requests of one share; a request whose Backend
// panicked was released by run and is marked dropped.
func (c *conn) runShare(rs []*request) {
	for _, r := range rs {
		r.dropped = false
		if !c.run(r) {
			r.dropped = true
		}
	}
}

// helper runs the shares of queued requests the reader hands it.
func (c *conn) helper() {
	defer c.helpers.Done()
	for rs := range c.shares {
		c.runShare(rs)
		c.sharing.Done()
	}
}

// flushUnless sends the held replies unless the next n bytes are already
// buffered: the reader is about to wait for the client, which may be
// waiting for them. (Taking in what the socket holds first, without
// waiting, held replies back longer but cost a failed read each time:
// random writes at queue depth 32 fell to 0.81x, at depth 1 to 0.90x.)
func (c *conn) flushUnless(n int) {
	if (len(c.held) > 0 || len(c.queued) > 0) && c.br.Buffered() < n {
		c.flushHeld()
	}
}

// flushHeld runs the queued requests and sends the held replies in one
// write.
func (c *conn) flushHeld() {
	c.runQueued()
	if len(c.held) == 0 {
		return
	}
	c.reply(c.held...)
	clear(c.held)
	c.held = c.held[:0]
}
