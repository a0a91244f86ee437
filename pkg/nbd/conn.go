package nbd

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

var (
	errStopped = errors.New("server shutting down")
	errDisc    = errors.New("client sent NBD_CMD_DISC")
)

const (
	// drainTimeout bounds the writing of replies still in flight when a
	// client has disconnected.
	drainTimeout        = 30 * time.Second
	handshakeBufferSize = 512
	readBufferSize      = 64 << 10
	// maxRetainBytes bounds the idle payload buffers one connection keeps.
	maxRetainBytes = 16 << 20
)

// conn is one client connection. Its goroutine runs the handshake, then
// reads requests and hands them to a pool of MaxInFlight worker
// goroutines; each worker runs its request against the
// Backend and writes the reply as soon as it is done, so replies go out
// in completion order.
type conn struct {
	srv *Server
	nc  net.Conn
	// sock is nc without the wrappers that expose what they wrap (see
	// unwrap): replies go out through it, so that net.Buffers finds its
	// writev.
	sock     net.Conn
	br       *bufio.Reader
	stopping atomic.Bool
	// inHandshake is set while the handshake runs under a deadline on
	// writes too; stop wakes a handshake's blocked write, but never a
	// transmission-phase reply.
	inHandshake atomic.Bool

	backend Backend
	size    uint64

	// wmu guards the reply queue. After the first write error (or a
	// backend panic) dead is set and further replies are dropped.
	wmu     sync.Mutex
	pending []*request // replies waiting for the writer
	writing bool       // a worker is writing replies
	dead    bool
	// Owned by the worker that is writing.
	batch []*request
	iovs  [][]byte // backing array of iov, 2 per request
	iov   net.Buffers

	// The payload budgets: bytes of pooled buffers held by requests,
	// those served from the reserve (Options.ReserveBuffers) apart.
	budgetMu    sync.Mutex
	budgetCond  sync.Cond
	budgetUsed  int64
	reserveUsed int64
	// cache holds idle payload buffers by size class, up to retainBytes.
	cache       [numClasses][]*[]byte
	cached      int64
	retainBytes int64

	// held are requests run inline whose replies wait to go out together
	// (Options.Inline); only the reader touches it.
	held []*request
	// queued are requests read but not yet run, with inline helpers
	// (Options.InlineHelpers): they run together, in shares, before the
	// reader would wait. Only the reader touches it.
	queued  []*request
	shares  chan []*request
	sharing sync.WaitGroup
	helpers sync.WaitGroup

	work     chan *request
	working  atomic.Int32 // requests handed to the workers and not done
	free     chan *request
	inflight sync.WaitGroup
	workers  sync.WaitGroup
}

// request is one transmission request; requests are recycled through the
// connection's free list so the steady state allocates nothing.
type request struct {
	cmd    Command
	flags  uint16
	cookie uint64
	off    uint64
	length uint32
	errno  uint32 // set by the reader for requests refused before running
	start  time.Time

	buf      *[]byte // pooled payload buffer, nil for none
	data     []byte  // the payload: *buf cut to length
	reserved bool    // buf counts against the reserve's budget
	dropped  bool    // run found the Backend panicking and released it

	hdr [replyHeaderLen]byte
}

func newConn(s *Server, nc net.Conn) *conn {
	return &conn{srv: s, nc: nc, sock: unwrap(nc)}
}

// unwrap returns the connection beneath wrappers with a NetConn method (as
// crypto/tls.Conn has). A wrapper that embeds a *net.UnixConn hides its
// writev: net.Buffers would write each header and payload with a system
// call of its own.
func unwrap(nc net.Conn) net.Conn {
	for range 8 {
		w, ok := nc.(interface{ NetConn() net.Conn })
		if !ok {
			break
		}
		inner := w.NetConn()
		if inner == nil {
			break
		}
		nc = inner
	}
	return nc
}

// stop asks the connection to finish: its reader wakes up through an
// expired read deadline, and the requests already read still complete.
func (c *conn) stop() {
	c.stopping.Store(true)
	if c.inHandshake.Load() {
		c.nc.SetDeadline(time.Now())
	} else {
		c.nc.SetReadDeadline(time.Now())
	}
}

// remote names the peer for log lines; unix-socket clients are unnamed,
// so those are named by the socket they came in on.
func (c *conn) remote() string {
	if a := c.nc.RemoteAddr(); a != nil {
		if s := a.String(); s != "" && s != "@" {
			return s
		}
	}
	if a := c.nc.LocalAddr(); a != nil {
		return "unix:" + a.String()
	}
	return "unknown"
}

func (c *conn) serve() {
	defer c.srv.forget(c)
	defer c.nc.Close()
	defer func() {
		// The handshake and the reader run no Backend code but Size;
		// still, a panic here must not take the daemon down.
		if p := recover(); p != nil {
			c.srv.log.Error("nbd: panic serving connection; dropping it",
				"remote", c.remote(), "panic", p, "stack", string(debug.Stack()))
		}
	}()

	// The handshake gets a small buffer, so that many half-open
	// connections cost little, and a deadline on reads and writes alike
	// (a client that never reads must not hold a writer forever).
	c.br = bufio.NewReaderSize(c.nc, handshakeBufferSize)
	c.inHandshake.Store(true)
	c.nc.SetDeadline(time.Now().Add(c.srv.handshakeTimeout))
	if c.stopping.Load() {
		return
	}
	e, err := c.handshake()
	if err != nil {
		if !c.stopping.Load() && err != errAbort {
			c.srv.log.Info("nbd: handshake failed; dropping connection", "remote", c.remote(), "err", err)
		}
		return
	}
	c.inHandshake.Store(false)
	c.nc.SetDeadline(time.Time{})
	if c.stopping.Load() {
		return
	}
	// Bytes the client sent early (it should wait for our reply, but may
	// not) stay in front of the transmission-phase reader.
	if n := c.br.Buffered(); n > 0 {
		early, _ := c.br.Peek(n)
		c.br = bufio.NewReaderSize(io.MultiReader(bytes.NewReader(bytes.Clone(early)), c.sock), readBufferSize)
	} else {
		c.br = bufio.NewReaderSize(c.sock, readBufferSize)
	}
	c.backend = e.Backend
	c.size = uint64(e.Backend.Size())
	c.budgetCond.L = &c.budgetMu
	c.work = make(chan *request, c.srv.maxInFlight)
	c.free = make(chan *request, c.srv.maxInFlight)
	c.pending = make([]*request, 0, c.srv.maxInFlight)
	c.batch = make([]*request, 0, c.srv.maxInFlight)
	c.iovs = make([][]byte, 0, 2*c.srv.maxInFlight)
	// Twice the in-flight bound: a mix of sizes in flight changes over
	// time, and a cache that drops the buffers of one mix to keep those of
	// the last allocates all the while.
	c.retainBytes = min(2*c.srv.maxInFlightBytes, maxRetainBytes)
	// Every request struct and worker exists from the start, so that
	// serving (swap) I/O later allocates nothing, not even a stack.
	for range c.srv.maxInFlight {
		c.free <- new(request)
		c.workers.Add(1)
		go c.worker()
	}
	if c.srv.inline || c.srv.inlineAlone {
		c.held = make([]*request, 0, maxHeld)
	}
	if c.srv.inline {
		if n := c.srv.inlineHelpers; n > 0 {
			c.queued = make([]*request, 0, maxHeld)
			c.shares = make(chan []*request, n)
			for range n {
				c.helpers.Add(1)
				go c.helper()
			}
		}
	}
	c.reserveBuffers(c.srv.reserveBuffers)

	err = c.transmit()

	// Stop reading, let what was read finish and reply, then close. After
	// a protocol error the connection is dropped at once (the spec's hard
	// disconnect): nobody may be reading the replies. After a soft end
	// the replies still go out, within drainTimeout, so that a client
	// that stopped reading cannot hold the workers forever.
	switch {
	case c.stopping.Load():
	case err == errDisc || errors.Is(err, io.EOF):
		c.nc.SetWriteDeadline(time.Now().Add(drainTimeout))
	default:
		c.kill()
	}
	c.inflight.Wait()
	close(c.work)
	c.workers.Wait()
	if c.shares != nil {
		close(c.shares)
		c.helpers.Wait()
	}
	c.releaseCache()
	switch {
	case err == errDisc, c.stopping.Load(), errors.Is(err, io.EOF), errors.Is(err, net.ErrClosed):
	case errors.Is(err, syscall.ECONNRESET):
		c.srv.log.Info("nbd: connection reset", "remote", c.remote(), "export", e.Name)
	default:
		c.srv.log.Warn("nbd: dropping connection", "remote", c.remote(), "export", e.Name, "err", err)
	}
}

// transmit reads requests until the client disconnects or breaks the
// protocol, and dispatches them to the workers.
func (c *conn) transmit() error {
	// Replies held back must go out whatever ends the loop: the requests
	// ran, and the drain waits for them.
	defer c.flushHeld()
	var h [requestHeaderLen]byte
	for {
		c.flushUnless(requestHeaderLen)
		if _, err := io.ReadFull(c.br, h[:]); err != nil {
			if errors.Is(err, io.ErrUnexpectedEOF) {
				return fmt.Errorf("truncated request header: %w", err)
			}
			return err
		}
		if m := be.Uint32(h[0:]); m != magicRequest {
			// Nothing after a bad magic can be trusted to be a
			// request boundary: the spec leaves only a hard disconnect.
			return fmt.Errorf("bad request magic %#08x", m)
		}
		cmd := Command(be.Uint16(h[6:]))
		if cmd == CmdDisc {
			return errDisc
		}
		if len(c.free) == 0 {
			c.flushHeld()
		}
		r := <-c.free
		r.flags = be.Uint16(h[4:])
		r.cmd = cmd
		r.cookie = be.Uint64(h[8:])
		r.off = be.Uint64(h[16:])
		r.length = be.Uint32(h[24:])
		r.errno = 0
		if c.srv.obs != nil {
			r.start = time.Now()
		}
		if err := c.readPayload(r); err != nil {
			c.putRequest(r)
			return err
		}
		if c.srv.rec != nil && r.errno == 0 {
			c.srv.rec.RecordRequest(r.cmd, r.off, r.length)
		}
		c.inflight.Add(1)
		if r.length <= maxInlineBytes && (c.srv.inline || c.srv.inlineAlone && c.alone()) {
			c.runInline(r)
			continue
		}
		c.working.Add(1)
		c.work <- r
	}
}

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

// readPayload validates r and reads a write's payload into a pooled
// buffer (and takes one for a read's reply). Requests that are invalid get
// r.errno set and are answered without reaching the Backend.
func (c *conn) readPayload(r *request) error {
	switch r.cmd {
	case CmdWrite:
		if r.length > MaxPayload {
			// Skip the payload so the stream stays in step and the
			// connection stays usable.
			if _, err := io.CopyN(io.Discard, c.br, int64(r.length)); err != nil {
				return fmt.Errorf("write of %d bytes beyond the maximum: skipping payload: %w", r.length, err)
			}
			r.errno = errnoInval
			return nil
		}
		if r.length > 0 {
			c.takeBuffer(r)
			c.flushUnless(int(r.length))
			if _, err := io.ReadFull(c.br, r.data); err != nil {
				return fmt.Errorf("truncated write payload (%d bytes at %d): %w", r.length, r.off, err)
			}
		}
		r.errno = c.checkRange(r, errnoNoSpc)
	case CmdRead:
		if r.length > MaxPayload {
			r.errno = errnoInval
			return nil
		}
		r.errno = c.checkRange(r, errnoInval)
		if r.errno == 0 && r.length > 0 {
			c.takeBuffer(r)
		}
	case CmdTrim:
		r.errno = c.checkRange(r, errnoInval)
	case CmdWriteZeroes:
		r.errno = c.checkRange(r, errnoNoSpc)
	case CmdFlush:
	default:
		// CACHE, BLOCK_STATUS and unknown commands: not advertised, and
		// none of them carries a payload the stream would have to skip.
		r.errno = errnoInval
	}
	return nil
}

// checkRange returns errno when r reaches past the end of the export.
func (c *conn) checkRange(r *request, errno uint32) uint32 {
	if r.off > c.size || uint64(r.length) > c.size-r.off {
		return errno
	}
	return 0
}

// takeBuffer gives r a payload buffer of r.length bytes, from the
// connection's own cache where it can, waiting while the connection's
// buffers exceed its budget.
func (c *conn) takeBuffer(r *request) {
	class := sizeClass(r.length)
	// Requests the reserve's buffers can serve count against the reserve
	// alone: within it, they never wait for a buffer to be allocated.
	used, limit := &c.budgetUsed, c.srv.maxInFlightBytes
	r.reserved = c.srv.reserveBuffers > 0 && r.length <= ReserveBufferMax
	if r.reserved {
		used, limit = &c.reserveUsed, c.srv.reserveBuffers
	}
	var b *[]byte
	var n int64
	c.budgetMu.Lock()
	for {
		// The smallest free buffer that fits, so that a reserve of
		// large buffers serves every size up to theirs. The budget
		// counts the buffer's size, not the request's.
		k := class
		for k < numClasses && len(c.cache[k]) == 0 {
			k++
		}
		if k == numClasses {
			k = class // none cached: a new one of the request's size
		}
		n = 1 << (k + minClassShift)
		if *used == 0 || *used+n <= limit {
			if l := c.cache[k]; len(l) > 0 {
				b = l[len(l)-1]
				l[len(l)-1] = nil
				c.cache[k] = l[:len(l)-1]
				c.cached -= n
			}
			break
		}
		if len(c.held) > 0 || len(c.queued) > 0 {
			// Inline: the buffers to wait for are our own held replies'.
			c.budgetMu.Unlock()
			c.flushHeld()
			c.budgetMu.Lock()
			continue
		}
		c.budgetCond.Wait()
	}
	*used += n
	c.budgetMu.Unlock()
	c.srv.bufBytes.Add(n)
	if b == nil {
		b = c.srv.bufs.get(class)
	}
	r.buf, r.data = b, (*b)[:r.length]
}

// putRequest recycles r and its buffer. The connection keeps up to
// retainBytes of buffers for itself: sync.Pool drops its contents at every
// garbage collection, and a swap device under memory pressure is exactly
// where allocating a fresh buffer for each request must not happen.
func (c *conn) putRequest(r *request) {
	if b := r.buf; b != nil {
		r.buf, r.data = nil, nil
		n := int64(cap(*b))
		c.srv.bufBytes.Add(-n)
		c.budgetMu.Lock()
		if r.reserved {
			c.reserveUsed -= n
		} else {
			c.budgetUsed -= n
		}
		// A reserve buffer always goes back to the reserve (reserved
		// requests never allocate, so these are never more than it).
		keep := c.cached+n <= c.retainBytes || r.reserved && n == ReserveBufferMax
		if keep {
			class := sizeClass(uint32(n))
			c.cache[class] = append(c.cache[class], b)
			c.cached += n
		}
		c.budgetMu.Unlock()
		c.budgetCond.Signal()
		if !keep {
			c.srv.bufs.put(b)
		}
	}
	c.free <- r
}

// ReserveBufferMax is the size of the buffers of Options.ReserveBuffers,
// and so the largest request they serve.
const ReserveBufferMax = 128 << 10

// reserveBuffers fills the connection's buffer cache with n bytes of
// buffers of ReserveBufferMax, written so that they are resident (locked,
// under mlockall). One serves a request of any size up to its own, and
// the reserve's budget counts it whole, so such requests never need a
// buffer the reserve does not have.
func (c *conn) reserveBuffers(n int64) {
	if n <= 0 {
		return
	}
	c.retainBytes += n
	class := sizeClass(ReserveBufferMax)
	c.budgetMu.Lock()
	defer c.budgetMu.Unlock()
	for range max(1, n/ReserveBufferMax) {
		b := make([]byte, ReserveBufferMax)
		for i := 0; i < len(b); i += 4096 {
			b[i] = 0
		}
		c.cache[class] = append(c.cache[class], &b)
		c.cached += ReserveBufferMax
	}
}

// releaseCache hands the connection's cached buffers to the server pool.
func (c *conn) releaseCache() {
	c.budgetMu.Lock()
	defer c.budgetMu.Unlock()
	for class, l := range c.cache {
		for _, b := range l {
			c.srv.bufs.put(b)
		}
		c.cache[class] = nil
	}
	c.cached = 0
}

func (c *conn) worker() {
	defer c.workers.Done()
	for r := range c.work {
		c.handle(r)
		c.working.Add(-1)
	}
}

// alone reports whether the request just read is the connection's only
// one (Options.InlineAlone).
func (c *conn) alone() bool {
	return c.working.Load() == 0 && len(c.held) == 0 && c.br.Buffered() < requestHeaderLen
}

func (c *conn) handle(r *request) {
	if c.run(r) {
		c.reply(r)
	}
}

// run executes r against the Backend unless the reader refused it. A
// Backend panic drops the connection and releases r; run then reports
// false and r must not be replied to.
func (c *conn) run(r *request) (ok bool) {
	defer func() {
		if p := recover(); p != nil {
			c.srv.log.Error("nbd: backend panicked; dropping connection",
				"remote", c.remote(), "cmd", r.cmd.String(), "offset", r.off, "length", r.length,
				"panic", p, "stack", string(debug.Stack()))
			c.kill()
			c.release(r)
			ok = false
		}
	}()
	if r.errno == 0 {
		r.errno = c.exec(r)
	}
	return true
}

func (c *conn) exec(r *request) uint32 {
	ctx := c.srv.ctx
	off := int64(r.off)
	var err error
	switch r.cmd {
	case CmdRead:
		if len(r.data) > 0 {
			err = c.backend.ReadAt(ctx, r.data, off)
		}
	case CmdWrite:
		if len(r.data) > 0 {
			err = c.backend.WriteAt(ctx, r.data, off, r.flags&cmdFlagFUA != 0)
		}
	case CmdFlush:
		err = c.backend.Flush(ctx)
	case CmdTrim:
		if r.length > 0 {
			err = c.backend.Trim(ctx, off, int64(r.length))
		}
	case CmdWriteZeroes:
		if r.length > 0 {
			err = c.backend.WriteZeroes(ctx, off, int64(r.length), r.flags&cmdFlagNoHole != 0)
		}
	}
	if err == nil {
		return 0
	}
	errno := errnoOf(err)
	if errno == errnoIO {
		c.srv.log.Error("nbd: request failed", "remote", c.remote(), "cmd", r.cmd.String(),
			"offset", r.off, "length", r.length, "err", err)
	}
	return errno
}

// errnoOf maps a Backend error to the NBD error code sent for it.
func errnoOf(err error) uint32 {
	var en syscall.Errno
	if errors.As(err, &en) {
		switch uint32(en) {
		case errnoPerm, errnoIO, errnoNoMem, errnoInval, errnoNoSpc, errnoOverflow, errnoNotSup, errnoShutdown:
			return uint32(en)
		case uint32(syscall.EROFS):
			return errnoPerm
		case uint32(syscall.EDQUOT):
			return errnoNoSpc
		}
		return errnoIO
	}
	if errors.Is(err, os.ErrDeadlineExceeded) {
		return errnoIO
	}
	if errors.Is(err, errStopped) {
		return errnoShutdown
	}
	return errnoIO
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
