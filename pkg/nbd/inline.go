// Running requests on the connection's reader, and on its helpers, with replies held back to go out together.

package nbd

import (
	"bufio"
	"sync"
)

const (
	// maxHeld bounds the replies an inline connection sends in one write.
	maxHeld = 64
	// maxInlineBytes is the largest request an inline connection runs on
	// its reader; larger ones go to the workers, where several run at once
	// and a hand-off costs little next to the work.
	maxInlineBytes = 64 << 10
)

// inlineRunner runs requests on the connection's reader, and on its
// helpers, holding their replies back to go out together
// (Options.Inline); only the reader touches held and queued. It is set
// up with the transmission phase (start) and needs of the connection
// only run, the reply queue and the reader's buffer.
type inlineRunner struct {
	// held are requests run whose replies wait to go out together.
	held []*request
	// queued are requests read but not yet run, with helpers
	// (Options.InlineHelpers): they run together, in shares, before the
	// reader would wait.
	queued  []*request
	shares  chan []*request
	sharing sync.WaitGroup
	helpers sync.WaitGroup

	run     func(*request) bool
	replies *replyQueue
	br      *bufio.Reader
}

// start makes the held replies' room and starts n helpers.
func (in *inlineRunner) start(n int, run func(*request) bool, replies *replyQueue, br *bufio.Reader) {
	in.run, in.replies, in.br = run, replies, br
	in.held = make([]*request, 0, maxHeld)
	if n <= 0 {
		return
	}
	in.queued = make([]*request, 0, maxHeld)
	in.shares = make(chan []*request, n)
	for range n {
		in.helpers.Add(1)
		go in.helper()
	}
}

// stop ends the helpers, once every request has run.
func (in *inlineRunner) stop() {
	if in.shares != nil {
		close(in.shares)
		in.helpers.Wait()
	}
}

// pending reports whether requests ran, or wait to run, whose replies
// have not gone out.
func (in *inlineRunner) pending() bool {
	return len(in.held) > 0 || len(in.queued) > 0
}

// runInline runs r on the reader goroutine and holds its reply back, to
// go out with the replies of the requests read after it without waiting.
// With helpers, r only joins the queue: the queue runs, in shares, when
// the replies are about to go out (flushHeld).
func (in *inlineRunner) runInline(r *request) {
	if in.shares != nil {
		in.queued = append(in.queued, r)
		if len(in.queued)+len(in.held) >= maxHeld {
			in.flushHeld()
		}
		return
	}
	if !in.run(r) {
		return
	}
	in.held = append(in.held, r)
	if len(in.held) == maxHeld {
		in.flushHeld()
	}
}

// runQueued runs the queued requests, a share each on the helpers and
// the rest on the reader, and holds the replies of those that ran.
func (in *inlineRunner) runQueued() {
	q := in.queued
	if len(q) == 0 {
		return
	}
	n := min(cap(in.shares)+1, len(q))
	per := (len(q) + n - 1) / n
	for lo := per; lo < len(q); lo += per {
		in.sharing.Add(1)
		in.shares <- q[lo:min(lo+per, len(q))]
	}
	in.runShare(q[:per])
	in.sharing.Wait()
	for _, r := range q {
		if !r.dropped {
			in.held = append(in.held, r)
		}
	}
	clear(in.queued)
	in.queued = in.queued[:0]
}

// runShare runs the requests of one share; a request whose Backend
// panicked was released by run and is marked dropped.
func (in *inlineRunner) runShare(rs []*request) {
	for _, r := range rs {
		r.dropped = false
		if !in.run(r) {
			r.dropped = true
		}
	}
}

// helper runs the shares of queued requests the reader hands it.
func (in *inlineRunner) helper() {
	defer in.helpers.Done()
	for rs := range in.shares {
		in.runShare(rs)
		in.sharing.Done()
	}
}

// flushUnless sends the held replies unless the next n bytes are already
// buffered: the reader is about to wait for the client, which may be
// waiting for them. (Taking in what the socket holds first, without
// waiting, held replies back longer but cost a failed read each time:
// random writes at queue depth 32 fell to 0.81x, at depth 1 to 0.90x.)
func (in *inlineRunner) flushUnless(n int) {
	if (len(in.held) > 0 || len(in.queued) > 0) && in.br.Buffered() < n {
		in.flushHeld()
	}
}

// flushHeld runs the queued requests and sends the held replies in one
// write.
func (in *inlineRunner) flushHeld() {
	in.runQueued()
	if len(in.held) == 0 {
		return
	}
	in.replies.reply(in.held...)
	clear(in.held)
	in.held = in.held[:0]
}
