// The server: options, listeners, connections, shutdown.

package nbd

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gzramd/gzramd/pkg/blockdev"
)

// ErrServerClosed is returned by Serve once Shutdown has been called.
var ErrServerClosed = errors.New("nbd: server closed")

// Export is one named block device served by a Server.
type Export struct {
	Name        string
	Description string
	Backend     blockdev.Backend
}

// Observer receives every completed request, for metrics. It is called on
// the request path, so it must be cheap and must not allocate.
type Observer interface {
	// RequestDone reports one request: its command, its length field,
	// the time from its header being read to its reply being written,
	// and the NBD error code sent (0 for success).
	RequestDone(cmd Command, length uint32, d time.Duration, errno uint32)
}

// Recorder receives the requests the server accepts, for a trace of the
// workload. It is called on the connection's reader once a request's
// header (and a write's payload) has been read and checked, before the
// request runs; requests refused as invalid are not recorded. The reader
// reads nothing more until it returns, and it is on the path that stores
// swapped-out pages: it must be cheap, and must neither allocate nor
// block.
type Recorder interface {
	RecordRequest(cmd Command, offset uint64, length uint32)
}

// Options tune a Server. The zero value is usable.
type Options struct {
	// Logger receives connection-level events; nil means slog.Default().
	Logger *slog.Logger
	// Observer, if set, is told about each completed request.
	Observer Observer
	// Recorder, if set, is told about each valid request as it arrives,
	// in the order each connection sent them.
	Recorder Recorder
	// MaxInFlight bounds the requests one connection has in flight (read
	// but not yet replied to); the reader stops reading at the bound, which
	// pushes back on the client. Each connection starts this many worker
	// goroutines once its handshake is done, so that serving allocates
	// nothing later. Default 128 (the kernel's queue depth per socket).
	MaxInFlight int
	// MaxInFlightBytes bounds the payload buffers (write data read ahead,
	// read data not yet sent) one connection holds, so that a client
	// cannot make the daemon allocate without limit. A request larger
	// than the whole budget still runs, alone. Default 64 MiB. Connections
	// other than the process's own (Own) get at most 8 MiB, and send
	// requests of at most that (see otherMaxPayload).
	MaxInFlightBytes int64
	// ReplyTimeout, if positive, drops a connection whose replies make no
	// progress for this long: a client that stops reading would otherwise
	// hold its requests (up to MaxInFlight, MaxInFlightBytes) for as long
	// as it stays connected. Zero means no limit, which suits the kernel:
	// timing it out would turn a slow swap-in into an I/O error.
	ReplyTimeout time.Duration
	// HandshakeTimeout bounds the whole handshake of one connection, so
	// that half-open connections cannot pile up. Default 10s.
	HandshakeTimeout time.Duration
	// Inline runs each request of up to 64 KiB on its connection's reader
	// goroutine and sends the replies of the requests that arrived
	// together in one write: no hand-off between goroutines and fewer
	// system calls, but one such request at a time per connection
	// (connections still run in parallel; larger requests still go to the
	// workers). It suits a Backend that completes requests without waiting
	// for others (gzramd compressing on the CPU), not one that gathers a
	// connection's requests in flight into batches.
	Inline bool
	// InlineHelpers, with Inline, lets each connection run the requests
	// it read together on this many goroutines besides its reader, the
	// reader taking a share: a connection's requests then use more than
	// one CPU, at the price of waking the helpers once per such group. It
	// pays where CPUs would otherwise idle; with as many busy threads as
	// CPUs it only adds the wake-ups. At most MaxInlineHelpers; 0 means
	// none.
	InlineHelpers int
	// ReserveBuffers is the payload buffer memory each connection
	// allocates, writes and keeps from its handshake on, in buffers of
	// ReserveBufferMax. Requests of up to that size are served from the
	// reserve and bounded by it (not by MaxInFlightBytes): they never
	// allocate. A swap device's requests then find their buffers
	// resident instead of faulting in fresh memory while the kernel is
	// short of it. The reserve lives outside the Go heap and goes back to
	// the system as the connection closes. At most 64 MiB; 0 means none.
	ReserveBuffers int64
	// MaxConnections bounds the connections open at once that are not
	// the process's own (Own), from accept to close, the handshake
	// included: each costs goroutines, request structures and its
	// ReserveBuffers, which a client could otherwise multiply until the
	// machine runs out. A connection accepted beyond it is closed at once,
	// counted (ConnectionsRefused) and logged with its client, at most
	// once per client per refusalLogEvery with the count since
	// (clientLogLimiter). Connections handed over
	// (Adopt) are never refused, but those not the process's own take
	// their place within it. 0 means no limit.
	MaxConnections int
	// Own reports whether nc, as a listener accepted it or as Adopt was
	// given it, is one of the process's own connections: the kernel
	// device's, which must never be starved, and which count against no
	// limit. nil means a Unix socket whose peer (SO_PEERCRED) is this
	// process. A TCP peer cannot be told apart: it is never own by
	// default.
	Own func(nc net.Conn) bool
}

// MaxInlineHelpers bounds Options.InlineHelpers.
const MaxInlineHelpers = 16

// AutoInlineHelpers is the InlineHelpers that suits a machine of cpus
// CPUs: one helper per 4 CPUs beyond the first 4, at most 3. Helpers pay
// where CPUs idle: on 16 CPUs, 4 connections' random writes ran at 0.81x
// nbdkit's rate on their readers alone. On 2 CPUs, where the client and
// the server already keep both busy, they would only add wake-ups. They
// cost CPU: on 16 CPUs, replaying a swap trace, none spent 5-13 % less
// CPU per GB than 3 and moved 4-17 % less.
func AutoInlineHelpers(cpus int) int { return min(max(cpus/4-1, 0), 3) }

const (
	defaultMaxInFlight      = 128
	defaultMaxInFlightBytes = 64 << 20
	defaultHandshakeTimeout = 10 * time.Second
	// refusalLogEvery spaces the log lines for refused connections and
	// handshake timeouts: a flood of them must not flood the log too.
	refusalLogEvery = 10 * time.Second
)

// Server serves NBD exports on any number of listeners.
type Server struct {
	exports          []Export
	log              *slog.Logger
	obs              Observer
	rec              Recorder
	maxInFlight      int
	maxInFlightBytes int64
	inline           bool
	inlineHelpers    int
	reserveBuffers   int64
	handshakeTimeout time.Duration
	replyTimeout     time.Duration
	// handed collects the connections HandOver stopped (under mu).
	handed []HandedConn
	bufs   *bufferPool
	// bufBytes counts the pooled payload bytes held by requests across
	// all connections: zero whenever nothing is in flight.
	bufBytes atomic.Int64

	maxConns int
	own      func(net.Conn) bool
	// refused and handshakeTimeouts count connections closed unserved:
	// past MaxConnections, and idle through their handshake.
	refused, handshakeTimeouts atomic.Int64
	refusedLog                 clientLogLimiter
	timeoutLog                 logLimiter

	// ctx is handed to every Backend call; it is cancelled only when a
	// Shutdown gives up waiting.
	ctx    context.Context
	cancel context.CancelFunc

	mu        sync.Mutex
	closing   bool
	listeners map[net.Listener]struct{}
	conns     map[*conn]struct{}
	// others counts the open connections that are not the process's own
	// (Options.Own): those MaxConnections bounds.
	others int
	connWG sync.WaitGroup
}

// NewServer returns a Server for exports; the first export is the default
// one, reached by the empty name.
func NewServer(exports []Export, opts Options) (*Server, error) {
	if len(exports) == 0 {
		return nil, errors.New("nbd: no exports")
	}
	seen := make(map[string]bool, len(exports))
	for i, e := range exports {
		if e.Backend == nil {
			return nil, fmt.Errorf("nbd: export %q: nil backend", e.Name)
		}
		if len(e.Name) > maxNameLen {
			return nil, fmt.Errorf("nbd: export %d: name longer than %d bytes", i, maxNameLen)
		}
		if seen[e.Name] {
			return nil, fmt.Errorf("nbd: export %q listed twice", e.Name)
		}
		seen[e.Name] = true
		if size := e.Backend.Size(); size < 0 {
			return nil, fmt.Errorf("nbd: export %q: negative size %d", e.Name, size)
		}
	}
	if opts.MaxInFlight < 0 {
		return nil, fmt.Errorf("nbd: MaxInFlight %d: want >= 0 (0 means %d)", opts.MaxInFlight, defaultMaxInFlight)
	}
	if opts.MaxInFlightBytes < 0 {
		return nil, fmt.Errorf("nbd: MaxInFlightBytes %d: want >= 0 (0 means %d)", opts.MaxInFlightBytes, defaultMaxInFlightBytes)
	}
	if opts.MaxInFlightBytes == 0 {
		opts.MaxInFlightBytes = defaultMaxInFlightBytes
	}
	if opts.MaxConnections < 0 {
		return nil, fmt.Errorf("nbd: MaxConnections %d: want >= 0 (0 means no limit)", opts.MaxConnections)
	}
	if opts.MaxInFlight == 0 {
		opts.MaxInFlight = defaultMaxInFlight
	}
	if opts.HandshakeTimeout <= 0 {
		opts.HandshakeTimeout = defaultHandshakeTimeout
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	ctx, cancel := context.WithCancel(context.Background())
	return &Server{
		exports:          append([]Export(nil), exports...),
		log:              opts.Logger,
		obs:              opts.Observer,
		rec:              opts.Recorder,
		maxInFlight:      opts.MaxInFlight,
		maxInFlightBytes: opts.MaxInFlightBytes,
		inline:           opts.Inline,
		inlineHelpers:    min(max(opts.InlineHelpers, 0), MaxInlineHelpers),
		bufs:             newBufferPool(),
		reserveBuffers:   min(max(opts.ReserveBuffers, 0), maxReserveBytes),
		handshakeTimeout: opts.HandshakeTimeout,
		replyTimeout:     opts.ReplyTimeout,
		maxConns:         opts.MaxConnections,
		own:              opts.Own,
		ctx:              ctx,
		cancel:           cancel,
		listeners:        make(map[net.Listener]struct{}),
		conns:            make(map[*conn]struct{}),
	}, nil
}

// workers is how many worker goroutines each connection starts. With a
// reserve, requests that hold a payload buffer are bounded by the
// reserve's buffers (Options.ReserveBuffers), so more workers than
// buffers would only wait, each with a stack that grows under load: in
// fresh memory, on a swap device's request path (TestServingDoesNotFault
// counted 120 faults with 128 workers a connection and an 8 MiB heap
// reserve). Requests that hold none (trims, flushes) queue for a worker.
func (s *Server) workers() int {
	if s.reserveBuffers <= 0 {
		return s.maxInFlight
	}
	return min(s.maxInFlight, max(1, int(s.reserveBuffers/ReserveBufferMax)))
}

// lookup finds an export by name; the empty name is the default export.
func (s *Server) lookup(name string) *Export {
	for i := range s.exports {
		if s.exports[i].Name == name {
			return &s.exports[i]
		}
	}
	if name == "" {
		return &s.exports[0]
	}
	return nil
}

// Serve accepts connections on l until Shutdown, serving each on its own
// goroutines. It may be called for several listeners at once. It always
// returns a non-nil error: ErrServerClosed after Shutdown.
func (s *Server) Serve(l net.Listener) error { return s.serve(l, nil) }

// serve is Serve, and with tlsConfig ServeTLS.
func (s *Server) serve(l net.Listener, tlsConfig *tls.Config) error {
	s.mu.Lock()
	if s.closing {
		s.mu.Unlock()
		return ErrServerClosed
	}
	s.listeners[l] = struct{}{}
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.listeners, l)
		s.mu.Unlock()
	}()

	var backoff time.Duration
	for {
		nc, err := l.Accept()
		if err != nil {
			if s.isClosing() {
				return ErrServerClosed
			}
			if errors.Is(err, net.ErrClosed) {
				return err
			}
			// Out of file descriptors and the like: wait and retry, as
			// net/http does, rather than give up serving.
			backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
			s.log.Warn("nbd: accept failed; retrying", "listener", l.Addr().String(), "err", err, "after", backoff)
			time.Sleep(backoff)
			continue
		}
		backoff = 0
		c := newConn(s, nc)
		c.other = !s.isOwn(c)
		c.tlsConfig = tlsConfig
		s.mu.Lock()
		if s.closing {
			s.mu.Unlock()
			nc.Close()
			return ErrServerClosed
		}
		if c.other && s.maxConns > 0 && s.others >= s.maxConns {
			s.mu.Unlock()
			s.refuse(c)
			continue
		}
		s.add(c)
		s.mu.Unlock()
		go c.serve()
	}
}

// add registers c, under s.mu.
func (s *Server) add(c *conn) {
	s.conns[c] = struct{}{}
	if c.other {
		s.others++
	}
	s.connWG.Add(1)
}

// refuse closes c, a connection past MaxConnections, before it costs
// anything: no goroutine, no handshake. The client sees the connection
// close before the greeting. The log line names the client: a line per
// client per refusalLogEvery at most (see clientLogLimiter).
func (s *Server) refuse(c *conn) {
	n := s.refused.Add(1)
	c.nc.Close()
	ok, since, client := s.refusedLog.allow(time.Now(), c.refusalKey())
	if !ok {
		return
	}
	args := []any{"client", client, "remote", c.remote()}
	if c.peerUID >= 0 {
		args = append(args, "peer_pid", c.peerPID, "peer_uid", c.peerUID)
	}
	args = append(args, "limit", s.maxConns, "refused_since_last_line", since, "refused_total", n)
	s.log.Warn("nbd: connection refused: the limit on connections other than the kernel device's is reached", args...)
}

// refusalKey names the client of a connection refused at accept, for its
// log line and its share of them: the peer's address without its port
// over TCP (a TLS client's certificate is not known before the
// handshake), the peer's user on a Unix socket.
func (c *conn) refusalKey() string {
	if c.peerUID >= 0 {
		return "uid " + strconv.Itoa(c.peerUID)
	}
	remote := c.remote()
	if host, _, err := net.SplitHostPort(remote); err == nil {
		return host
	}
	return remote
}

// clientLogLimiter is a logLimiter per client, for the first
// refusalLogClients clients refused in a refusalLogEvery; the refusals of
// any other client share one more (client "other"), so that clients of
// many addresses get no more lines than that.
type clientLogLimiter struct {
	mu      sync.Mutex
	clients map[string]*logLimiter
}

// refusalLogClients bounds the clients a refusal log line each per
// refusalLogEvery.
const refusalLogClients = 16

// allow is logLimiter.allow for client's events, and the client the
// count is of: client, or "other" for one past the bound.
func (l *clientLogLimiter) allow(now time.Time, client string) (bool, int64, string) {
	l.mu.Lock()
	if l.clients == nil {
		l.clients = make(map[string]*logLimiter)
	}
	ll := l.clients[client]
	if ll == nil && len(l.clients) >= refusalLogClients {
		// Forget the clients that had no line for a period: the refusals
		// they had since stay in refused_total, not in a line of theirs.
		for k, c := range l.clients {
			c.mu.Lock()
			if now.Sub(c.last) >= refusalLogEvery {
				delete(l.clients, k)
			}
			c.mu.Unlock()
		}
	}
	if ll == nil && len(l.clients) >= refusalLogClients {
		client = "other"
		ll = l.clients[client]
	}
	if ll == nil {
		ll = &logLimiter{}
		l.clients[client] = ll
	}
	l.mu.Unlock()
	ok, since := ll.allow(now)
	return ok, since, client
}

// ConnectionsRefused counts the connections closed at accept because
// MaxConnections other connections were open.
func (s *Server) ConnectionsRefused() int64 { return s.refused.Load() }

// HandshakeTimeouts counts the connections closed because their handshake
// did not finish within Options.HandshakeTimeout.
func (s *Server) HandshakeTimeouts() int64 { return s.handshakeTimeouts.Load() }

// logLimiter lets one log line through per refusalLogEvery, and counts
// the events it held back meanwhile.
type logLimiter struct {
	mu      sync.Mutex
	last    time.Time
	pending int64
}

// allow reports whether the event at now gets a log line, and how many
// events had none since the last that did (this one included).
func (l *logLimiter) allow(now time.Time) (bool, int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.pending++
	if !l.last.IsZero() && now.Sub(l.last) < refusalLogEvery {
		return false, 0
	}
	n := l.pending
	l.last, l.pending = now, 0
	return true, n
}

// isOwn reports whether c is one of the process's own connections
// (Options.Own): by default, a Unix socket whose peer is this process, as
// the kernel device's connections are: gzramd dials them itself and hands
// them to the kernel.
func (s *Server) isOwn(c *conn) bool {
	if s.own != nil {
		return s.own(c.nc)
	}
	return c.peerPID == os.Getpid()
}

// peerCred returns the credentials of a Unix socket's peer as of its
// connect (SO_PEERCRED); nil for other connections. One getsockopt, at
// accept.
func peerCred(nc net.Conn) *unix.Ucred {
	uc, ok := nc.(*net.UnixConn)
	if !ok {
		return nil
	}
	raw, err := uc.SyscallConn()
	if err != nil {
		return nil
	}
	var cred *unix.Ucred
	var cerr error
	if err := raw.Control(func(fd uintptr) {
		cred, cerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil || cerr != nil {
		return nil
	}
	return cred
}

// ConnInfo describes one open connection, for status reports and
// metrics (Server.Connections).
type ConnInfo struct {
	// Transport is the network it came in on: "unix" or "tcp".
	Transport string
	// Remote is the peer's address; for a Unix socket, whose peers are
	// unnamed, the socket it came in on ("unix:PATH").
	Remote string
	// Client names a TLS client by its certificate (its subject's common
	// name, "anonymous" without a certificate), once its TLS handshake is
	// done; "" for connections without TLS.
	Client string
	// TLS says the connection came in on a listener that requires TLS.
	TLS bool
	// PeerPID and PeerUID are a Unix socket peer's, as of its connect
	// (SO_PEERCRED); PeerUID is -1 when unknown (TCP), PeerPID 0 then
	// and for a peer in a pid namespace this process cannot see.
	PeerPID, PeerUID int
	// Own says it is one of the process's own connections (Options.Own):
	// the kernel device's.
	Own bool
	// Adopted says another server handed it over (Adopt).
	Adopted bool
	// Since is when it was accepted, or adopted.
	Since time.Time
}

// Connections describes the connections open now, refused ones never
// among them, oldest first. It takes the server's lock, never the
// connections' own: what it reports is what accept, the TLS handshake
// and close recorded.
func (s *Server) Connections() []ConnInfo {
	s.mu.Lock()
	out := make([]ConnInfo, 0, len(s.conns))
	for c := range s.conns {
		out = append(out, ConnInfo{
			Transport: c.transport, Remote: c.remote(), Client: c.client, TLS: c.tlsConfig != nil,
			PeerPID: c.peerPID, PeerUID: c.peerUID, Own: !c.other, Adopted: c.adopted, Since: c.since,
		})
	}
	s.mu.Unlock()
	slices.SortFunc(out, func(a, b ConnInfo) int { return a.Since.Compare(b.Since) })
	return out
}

func (s *Server) isClosing() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.closing
}

func (s *Server) forget(c *conn) {
	s.mu.Lock()
	delete(s.conns, c)
	if c.other {
		s.others--
	}
	s.mu.Unlock()
	s.connWG.Done()
}

// Shutdown stops accepting connections, stops reading new requests, lets
// the requests in flight finish and be replied to, then closes every
// connection. If ctx ends first, the Backend context is cancelled, every
// connection is closed at once, and ctx's error is returned once the
// connections' goroutines are gone.
func (s *Server) Shutdown(ctx context.Context) error {
	s.mu.Lock()
	s.closing = true
	for l := range s.listeners {
		l.Close()
	}
	for c := range s.conns {
		c.stop()
	}
	s.mu.Unlock()
	return s.drain(ctx)
}

// drain waits for the connections to end, and ends them if ctx ends
// first.
func (s *Server) drain(ctx context.Context) error {
	done := make(chan struct{})
	go func() {
		s.connWG.Wait()
		close(done)
	}()
	select {
	case <-done:
		s.cancel()
		return nil
	case <-ctx.Done():
	}
	s.cancel()
	s.mu.Lock()
	for c := range s.conns {
		c.nc.Close()
	}
	s.mu.Unlock()
	<-done
	return ctx.Err()
}

// PayloadBuffersAllocated counts the payload buffers the server has
// allocated since it started: the reserve made at start, then any a
// request needed beyond it (a request path that allocates, which a swap
// device should not: see Options.ReserveBuffers).
func (s *Server) PayloadBuffersAllocated() int64 { return s.bufs.made.Load() }
