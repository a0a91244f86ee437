// The NBD connections that are open, and which peer made each: how the
// daemon tells its own kernel device.

package swapctl

import (
	"net"
	"sync"

	"golang.org/x/sys/unix"
)

// Tracker remembers the NBD connections that are open, and for Unix
// sockets the pid of the process that connected. A kernel /dev/nbdN
// records in /sys/block/nbdN/pid the process that set it up (nbd-client,
// or gzramd itself), which is the process that dialled the socket: that is
// how the daemon tells whether its export is the kernel's swap device.
type Tracker struct {
	mu    sync.Mutex
	conns map[*trackedConn]struct{}
}

type trackedConn struct {
	net.Conn
	t       *Tracker
	peerPID int // 0 when unknown (TCP)
	once    sync.Once
}

// The NBD server unwraps connections through NetConn.
var _ interface{ NetConn() net.Conn } = (*trackedConn)(nil)

// NetConn returns the connection it tracks: the NBD server writes and
// reads through that one (with writev, which the wrapper would hide).
func (c *trackedConn) NetConn() net.Conn { return c.Conn }

func (c *trackedConn) Close() error {
	c.once.Do(func() {
		c.t.mu.Lock()
		delete(c.t.conns, c)
		c.t.mu.Unlock()
	})
	return c.Conn.Close()
}

type trackingListener struct {
	net.Listener
	t *Tracker
}

// Wrap returns l, tracking the connections it accepts.
func (t *Tracker) Wrap(l net.Listener) net.Listener {
	return &trackingListener{Listener: l, t: t}
}

func (l *trackingListener) Accept() (net.Conn, error) {
	nc, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	c := &trackedConn{Conn: nc, t: l.t, peerPID: peerPID(nc)}
	l.t.mu.Lock()
	if l.t.conns == nil {
		l.t.conns = make(map[*trackedConn]struct{})
	}
	l.t.conns[c] = struct{}{}
	l.t.mu.Unlock()
	return c, nil
}

// Peers returns the pids of the Unix-socket peers and the number of open
// connections whose peer is unknown (TCP).
func (t *Tracker) Peers() (pids map[int]bool, unknown int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	pids = make(map[int]bool)
	for c := range t.conns {
		if c.peerPID > 0 {
			pids[c.peerPID] = true
		} else {
			unknown++
		}
	}
	return pids, unknown
}

// Track tracks nc, a connection that came some other way than a
// listener (handed over by another process), as one from process peerPID.
func (t *Tracker) Track(nc net.Conn, peerPID int) net.Conn {
	c := &trackedConn{Conn: nc, t: t, peerPID: peerPID}
	t.mu.Lock()
	if t.conns == nil {
		t.conns = make(map[*trackedConn]struct{})
	}
	t.conns[c] = struct{}{}
	t.mu.Unlock()
	return c
}

// PeerOf returns the peer's pid of nc, a connection the tracker returned
// (0 when unknown, or not one of its own).
func (t *Tracker) PeerOf(nc net.Conn) int {
	if c, ok := nc.(*trackedConn); ok && c.t == t {
		return c.peerPID
	}
	return 0
}

// CountFrom returns the number of open connections whose peer is process
// pid (Unix sockets only).
func (t *Tracker) CountFrom(pid int) int {
	t.mu.Lock()
	defer t.mu.Unlock()
	n := 0
	for c := range t.conns {
		if c.peerPID == pid {
			n++
		}
	}
	return n
}

// Count returns the number of open connections.
func (t *Tracker) Count() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.conns)
}

func peerPID(nc net.Conn) int {
	if cred := PeerCred(nc); cred != nil {
		return int(cred.Pid)
	}
	return 0
}

// PeerCred returns the credentials of a Unix socket's peer, as of its
// connect (SO_PEERCRED); nil for other connections.
func PeerCred(nc net.Conn) *unix.Ucred {
	uc, ok := nc.(*net.UnixConn)
	if !ok {
		return nil
	}
	raw, err := uc.SyscallConn()
	if err != nil {
		return nil
	}
	var cred *unix.Ucred
	_ = raw.Control(func(fd uintptr) {
		cred, _ = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	})
	return cred
}
