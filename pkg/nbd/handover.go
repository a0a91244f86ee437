// Handing live connections to another process at a request boundary (an upgrade), and taking them on.

package nbd

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// HandedConn is a connection in the transmission phase that a server
// stopped at a request boundary (HandOver), for another process to go on
// serving (Adopt): its client never sees a disconnect.
type HandedConn struct {
	// File is the socket, a duplicate the caller must close.
	File *os.File
	// Export is the export the client negotiated.
	Export string
	// Pending are bytes read from the socket beyond the boundary: the
	// start of the requests the client sent next. They go in front of
	// the socket's.
	Pending []byte
	// Conn is the connection as the listener accepted it (closed now),
	// for the caller to recognize its wrappers.
	Conn net.Conn
}

// HandOver stops the server as Shutdown does, but for the connections in
// the transmission phase: each stops reading at a request boundary, has
// its requests in flight answered, and is returned open instead of
// closed. Connections still negotiating are closed, and so are those of a
// listener served with ServeTLS: their session's keys must not leave the
// process. If ctx ends first, the connections not yet stopped are closed,
// and what was handed over so far is returned with ctx's error.
func (s *Server) HandOver(ctx context.Context) ([]HandedConn, error) {
	s.mu.Lock()
	s.closing = true
	for l := range s.listeners {
		l.Close()
	}
	var closedTLS int
	for c := range s.conns {
		switch {
		case c.tlsConfig != nil:
			closedTLS++
			c.stop()
		case c.inHandshake.Load():
			c.stop()
		default:
			c.handover.handOver()
		}
	}
	s.mu.Unlock()
	if closedTLS > 0 {
		s.log.Info("nbd: closing the TLS connections instead of handing them over: their keys stay in this process; the clients reconnect",
			"connections", closedTLS)
	}
	err := s.drain(ctx)
	s.mu.Lock()
	defer s.mu.Unlock()
	handed := s.handed
	s.handed = nil
	return handed, err
}

// handedOver records connection c, stopped at a request boundary with its
// replies written, as handed over: its socket is duplicated (the
// connection's own descriptor closes as it ends).
func (s *Server) handedOver(c *conn) {
	f, err := SocketFile(c.sock)
	if err != nil {
		s.log.Error("nbd: handing a connection over; dropping it", "remote", c.remote(), "err", err)
		return
	}
	s.mu.Lock()
	s.handed = append(s.handed, HandedConn{File: f, Export: c.export, Pending: c.unread, Conn: c.nc})
	s.mu.Unlock()
}

// Adopt serves nc, a connection another server handed over (HandOver), in
// the transmission phase of export, reading pending before the socket.
func (s *Server) Adopt(nc net.Conn, export string, pending []byte) error {
	e := s.lookup(export)
	if e == nil {
		return fmt.Errorf("nbd: adopting a connection to export %q: no such export", export)
	}
	c := newConn(s, nc)
	c.adopted = true
	// Never refused: its client was admitted by the process before, and
	// for the kernel's a refusal would fail swap I/O. Another client's
	// still takes its place within MaxConnections, or every upgrade
	// would let as many more in.
	c.other = !s.isOwn(c)
	s.mu.Lock()
	if s.closing {
		s.mu.Unlock()
		return ErrServerClosed
	}
	s.add(c)
	s.mu.Unlock()
	go func() {
		defer s.forget(c)
		defer c.nc.Close()
		c.transmission(e, pending)
	}()
	return nil
}

// handoverGate orders handing a connection over (Server.HandOver) with
// its reader: handing asks the reader to stop at the next request
// boundary; idle says it waits for a request header, the only read a
// deadline may then interrupt. mu orders the two, so that no deadline
// cuts a payload short. nc is the connection's socket, whose read
// deadline wakes an idle reader.
type handoverGate struct {
	mu      sync.Mutex
	handing bool
	idle    bool
	nc      net.Conn
}

// handOver asks the connection's reader to stop at the next request
// boundary: at once if it waits for a header.
func (g *handoverGate) handOver() {
	g.mu.Lock()
	g.handing = true
	if g.idle {
		g.nc.SetReadDeadline(time.Now())
	}
	g.mu.Unlock()
}

// waitHeader is the reader's step before it reads a request header: false
// means stop here, for a handover.
func (g *handoverGate) waitHeader() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.handing {
		return false
	}
	g.idle = true
	return true
}

// gotHeader is the reader's step once the header read returned; true
// means a handover began meanwhile (its deadline, now cleared, may have
// cut the read short).
func (g *handoverGate) gotHeader() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.idle = false
	if !g.handing {
		return false
	}
	g.nc.SetReadDeadline(time.Time{})
	return true
}

// stopAtBoundary keeps what the reader read beyond the boundary: part of
// a header, and whatever it buffered after.
func (c *conn) stopAtBoundary(partial []byte) {
	c.unread = append(c.unread[:0], partial...)
	if n := c.br.Buffered(); n > 0 {
		b, _ := c.br.Peek(n)
		c.unread = append(c.unread, b...)
	}
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// SocketFile returns a blocking duplicate of c's socket: for the kernel,
// which reads and writes it itself, or for handing the connection over.
func SocketFile(c net.Conn) (*os.File, error) {
	fc, ok := c.(interface{ File() (*os.File, error) })
	if !ok {
		return nil, fmt.Errorf("%T has no file descriptor", c)
	}
	f, err := fc.File()
	if err != nil {
		return nil, fmt.Errorf("socket file descriptor: %w", err)
	}
	// The kernel reads and writes the socket itself; nbd-client hands
	// it over blocking, and so do we.
	if err := unix.SetNonblock(int(f.Fd()), false); err != nil {
		f.Close()
		return nil, fmt.Errorf("clearing O_NONBLOCK: %w", err)
	}
	return f, nil
}
