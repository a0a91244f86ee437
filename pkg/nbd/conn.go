// A connection: its handshake, its reader, and running a request against the Backend.

package nbd

import (
	"bufio"
	"bytes"
	"crypto/tls"
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

	"github.com/gzramd/gzramd/pkg/blockdev"
)

var (
	errStopped    = errors.New("server shutting down")
	errDisc       = errors.New("client sent NBD_CMD_DISC")
	errHandedOver = errors.New("connection handed over")
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
	// unwrap), or the TLS connection once the client started TLS: the
	// handshake's replies and the transmission phase's replies and
	// requests go through it, so that net.Buffers finds the socket's
	// writev. Deadlines and closing go to nc, which is the same socket.
	sock net.Conn
	br   *bufio.Reader
	// tlsConfig, set at accept on a listener served with ServeTLS (nil on
	// others), makes the handshake require TLS. tls is the session once
	// NBD_OPT_STARTTLS succeeded, and client the name its certificate
	// gives the client, for log lines.
	tlsConfig *tls.Config
	tls       *tls.Conn
	// client is written under srv.mu (Server.Connections reads it there).
	client   string
	stopping atomic.Bool
	// other is set for a connection that is not the process's own
	// (Options.Own): it counts against MaxConnections. Set before the
	// connection is added, then only read.
	other bool
	// since, transport and the Unix socket peer's credentials
	// (SO_PEERCRED; peerUID -1 when unknown) describe the connection in
	// Server.Connections. Set before the connection is added, then only
	// read.
	since            time.Time
	transport        string
	peerPID, peerUID int
	adopted          bool
	// inHandshake is set while the handshake runs under a deadline on
	// writes too; stop wakes a handshake's blocked write, but never a
	// transmission-phase reply.
	inHandshake atomic.Bool

	handover handoverGate
	// export and unread, once the reader stopped for a handover: the
	// export negotiated and the bytes read beyond the boundary.
	export string
	unread []byte

	backend blockdev.Backend
	recv    blockdev.WriteReceiver // backend, if it receives payloads itself
	size    uint64

	replies replyQueue

	payload payloadBudget

	inline inlineRunner

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

	buf      *[]byte          // pooled payload buffer, nil for none
	data     []byte           // the payload: *buf cut to length
	rcpt     blockdev.Receipt // a write's payload, received by the Backend; nil for none
	reserved bool             // buf counts against the reserve's budget
	dropped  bool             // run found the Backend panicking and released it

	hdr [replyHeaderLen]byte
}

func newConn(s *Server, nc net.Conn) *conn {
	c := &conn{srv: s, nc: nc, sock: unwrap(nc), since: time.Now(), peerUID: -1}
	c.handover.nc = nc
	if a := c.sock.LocalAddr(); a != nil {
		c.transport = a.Network()
	}
	if cred := peerCred(c.sock); cred != nil {
		c.peerPID, c.peerUID = int(cred.Pid), int(cred.Uid)
	}
	return c
}

// unwrap returns the connection beneath wrappers with a NetConn method. A
// wrapper that embeds a *net.UnixConn hides its writev: net.Buffers would
// write each header and payload with a system call of its own. A
// *tls.Conn has a NetConn method too, but what it wraps carries ciphertext:
// unwrap stops there.
func unwrap(nc net.Conn) net.Conn {
	for range 8 {
		if _, ok := nc.(*tls.Conn); ok {
			break
		}
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
	defer c.closeTLS()
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
		switch {
		case c.stopping.Load(), err == errAbort:
		case isTimeout(err):
			// Stalled clients may come by the thousand: a line for each
			// would drown the log.
			n := c.srv.handshakeTimeouts.Add(1)
			if ok, since := c.srv.timeoutLog.allow(time.Now()); ok {
				c.srv.log.Warn("nbd: handshake timed out; connection closed", "remote", c.remote(),
					"timeout", c.srv.handshakeTimeout, "timed_out_since_last_line", since, "timed_out_total", n, "err", err)
			}
		default:
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
	var early []byte
	if n := c.br.Buffered(); n > 0 {
		b, _ := c.br.Peek(n)
		early = bytes.Clone(b)
	}
	c.transmission(e, early)
}

// transmission serves the transmission phase of export e, the client's
// first bytes being early (then the socket's), and returns once the
// connection is done with: closed, or stopped for a handover.
func (c *conn) transmission(e *Export, early []byte) {
	c.startTransmission(e, early)
	err := c.transmit()
	c.endTransmission(e, err)
}

// startTransmission makes what serving export e needs: the reader, the
// request structs, the workers and helpers, the reserved buffers.
func (c *conn) startTransmission(e *Export, early []byte) {
	if len(early) > 0 {
		c.br = bufio.NewReaderSize(io.MultiReader(bytes.NewReader(early), c.sock), readBufferSize)
	} else {
		c.br = bufio.NewReaderSize(c.sock, readBufferSize)
	}
	c.export = e.Name
	c.backend = e.Backend
	c.recv, _ = e.Backend.(blockdev.WriteReceiver)
	c.size = uint64(e.Backend.Size())
	c.work = make(chan *request, c.srv.maxInFlight)
	c.free = make(chan *request, c.srv.maxInFlight)
	c.replies.pending = make([]*request, 0, c.srv.maxInFlight)
	c.replies.batch = make([]*request, 0, c.srv.maxInFlight)
	c.replies.iovs = make([][]byte, 0, 2*c.srv.maxInFlight)
	c.replies.sock, c.replies.nc, c.replies.done = c.sock, c.nc, c.release
	c.replies.timeout, c.replies.log, c.replies.obs, c.replies.remote = c.srv.replyTimeout, c.srv.log, c.srv.obs, c.remote
	if c.tls != nil {
		c.replies.tls = bufio.NewWriterSize(c.tls, tlsRecordSize)
		c.replies.gather.buf = make([]byte, 0, tlsGatherSize)
	}
	c.payload.start(c.srv, c.other, &c.inline, c.remote)
	// Every request struct and worker exists from the start, so that
	// serving (swap) I/O later allocates nothing, not even a stack.
	for range c.srv.maxInFlight {
		c.free <- new(request)
	}
	for range c.srv.workers() {
		c.workers.Add(1)
		go c.worker()
	}
	if c.srv.inline {
		c.inline.start(c.srv.inlineHelpers, c.run, &c.replies, c.br)
	}
	c.payload.reserve(c.srv.reserveBuffers)
}

// endTransmission winds the connection down after transmit returned err,
// and logs why it ended where that is news.
func (c *conn) endTransmission(e *Export, err error) {
	// Stop reading, let what was read finish and reply, then close. After
	// a protocol error the connection is dropped at once (the spec's hard
	// disconnect): nobody may be reading the replies. After a soft end
	// the replies still go out, within drainTimeout, so that a client
	// that stopped reading cannot hold the workers forever.
	switch {
	case c.stopping.Load(), err == errHandedOver:
	case err == errDisc || errors.Is(err, io.EOF):
		c.nc.SetWriteDeadline(time.Now().Add(drainTimeout))
	default:
		c.replies.kill()
	}
	c.inflight.Wait()
	close(c.work)
	c.workers.Wait()
	c.inline.stop()
	c.payload.release()
	if err == errHandedOver {
		c.srv.handedOver(c)
		return
	}
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
	defer c.inline.flushHeld()
	var h [requestHeaderLen]byte
	for {
		c.inline.flushUnless(requestHeaderLen)
		if !c.handover.waitHeader() {
			c.stopAtBoundary(nil)
			return errHandedOver
		}
		n, err := io.ReadFull(c.br, h[:])
		if c.handover.gotHeader() && err != nil && isTimeout(err) {
			c.stopAtBoundary(h[:n])
			return errHandedOver
		}
		if err != nil {
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
			c.inline.flushHeld()
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
		// A write the Backend received itself is only stored now: cheap
		// whatever its size.
		small := r.length <= maxInlineBytes || r.rcpt != nil
		if small && c.srv.inline {
			c.inline.runInline(r)
			continue
		}
		c.working.Add(1)
		c.work <- r
	}
}

// readPayload validates r and reads a write's payload into a pooled
// buffer (and takes one for a read's reply). Requests that are invalid get
// r.errno set and are answered without reaching the Backend.
func (c *conn) readPayload(r *request) error {
	switch r.cmd {
	case CmdWrite:
		if r.length > c.maxPayload() {
			// Skip the payload so the stream stays in step and the
			// connection stays usable: the protocol asks a server not
			// to drop a client for a payload of up to 32 MiB, even
			// beyond the maximum it advertised.
			if _, err := io.CopyN(io.Discard, c.br, int64(r.length)); err != nil {
				return fmt.Errorf("write of %d bytes beyond the maximum: skipping payload: %w", r.length, err)
			}
			r.errno = errnoInval
			return nil
		}
		r.errno = c.checkRange(r, errnoNoSpc)
		if r.length == 0 {
			return nil
		}
		if r.errno == 0 && c.recv != nil {
			if rc, ok := c.recv.ReceiveWrite(int64(r.off), int(r.length)); ok {
				r.rcpt = rc
				c.inline.flushUnless(int(r.length))
				for _, b := range rc.Buffers() {
					if _, err := io.ReadFull(c.br, b); err != nil {
						return fmt.Errorf("truncated write payload (%d bytes at %d): %w", r.length, r.off, err)
					}
				}
				return nil
			}
		}
		c.payload.take(r)
		c.inline.flushUnless(int(r.length))
		if _, err := io.ReadFull(c.br, r.data); err != nil {
			return fmt.Errorf("truncated write payload (%d bytes at %d): %w", r.length, r.off, err)
		}
	case CmdRead:
		if r.length > c.maxPayload() {
			r.errno = errnoInval
			return nil
		}
		r.errno = c.checkRange(r, errnoInval)
		if r.errno == 0 && r.length > 0 {
			c.payload.take(r)
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

func (c *conn) worker() {
	defer c.workers.Done()
	for r := range c.work {
		c.handle(r)
		c.working.Add(-1)
	}
}

func (c *conn) handle(r *request) {
	if c.run(r) {
		c.replies.reply(r)
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
			c.replies.kill()
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
		if rc := r.rcpt; rc != nil {
			r.rcpt = nil
			err = c.recv.CompleteWrite(ctx, rc, r.flags&cmdFlagFUA != 0)
		} else if len(r.data) > 0 {
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
