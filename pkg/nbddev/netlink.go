// The kernel NBD driver's generic-netlink family: the messages that
// connect, reconfigure, query and disconnect a device.

package nbddev

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"syscall"

	"golang.org/x/sys/unix"
)

// Generic-netlink constants of the kernel's "nbd" family
// (include/uapi/linux/nbd-netlink.h).
const (
	nbdGenlFamily  = "nbd"
	nbdGenlVersion = 1

	nbdCmdConnect     = 1
	nbdCmdDisconnect  = 2
	nbdCmdReconfigure = 3

	nbdAttrIndex           = 1
	nbdAttrSizeBytes       = 2
	nbdAttrBlockSizeBytes  = 3
	nbdAttrTimeout         = 4
	nbdAttrServerFlags     = 5
	nbdAttrClientFlags     = 6
	nbdAttrSockets         = 7
	nbdAttrDeadConnTimeout = 8
	// Linux 5.14; older kernels ignore it (their policy ends at 9 and
	// the family does not validate strictly).
	nbdAttrBackendIdentifier = 10

	nbdSockItem = 1
	nbdSockFD   = 1
)

// Netlink speaks the host's byte order.
var ne = binary.NativeEndian

const (
	nlmsgHdrLen   = unix.SizeofNlMsghdr // 16
	genlHdrLen    = 4                   // struct genlmsghdr: cmd, version, reserved
	nlattrHdrLen  = unix.SizeofNlAttr   // 4
	nlRecvBufSize = 64 << 10
)

func nlAlign(n int) int { return (n + 3) &^ 3 }

// appendAttr appends one netlink attribute, padded to 4 bytes.
func appendAttr(b []byte, typ uint16, payload []byte) []byte {
	b = ne.AppendUint16(b, uint16(nlattrHdrLen+len(payload)))
	b = ne.AppendUint16(b, typ)
	b = append(b, payload...)
	for len(b)%4 != 0 {
		b = append(b, 0)
	}
	return b
}

func appendU32Attr(b []byte, typ uint16, v uint32) []byte {
	return appendAttr(b, typ, ne.AppendUint32(nil, v))
}

func appendU64Attr(b []byte, typ uint16, v uint64) []byte {
	return appendAttr(b, typ, ne.AppendUint64(nil, v))
}

func appendNested(b []byte, typ uint16, inner []byte) []byte {
	return appendAttr(b, typ|unix.NLA_F_NESTED, inner)
}

// connectRequest describes one NBD_CMD_CONNECT.
type connectRequest struct {
	index     int // -1: let the kernel choose
	size      uint64
	blockSize uint64
	// Both timeouts are always sent (0: none). A device keeps its
	// queue's request timer from its previous connection unless
	// NBD_ATTR_TIMEOUT resets it (nbd_config_put clears only the tag
	// set's timeout), so leaving the attribute out does not give the
	// kernel's default.
	timeoutSec  uint64
	deadConnSec uint64
	serverFlags uint64
	clientFlags uint64
	backendID   string // "": omitted
	fds         []int
}

// connectAttrs encodes the attributes of NBD_CMD_CONNECT.
func connectAttrs(r connectRequest) []byte {
	var b []byte
	if r.index >= 0 {
		b = appendU32Attr(b, nbdAttrIndex, uint32(r.index))
	}
	b = appendU64Attr(b, nbdAttrSizeBytes, r.size)
	b = appendU64Attr(b, nbdAttrBlockSizeBytes, r.blockSize)
	b = appendU64Attr(b, nbdAttrServerFlags, r.serverFlags)
	if r.clientFlags != 0 {
		b = appendU64Attr(b, nbdAttrClientFlags, r.clientFlags)
	}
	b = appendU64Attr(b, nbdAttrTimeout, r.timeoutSec)
	b = appendU64Attr(b, nbdAttrDeadConnTimeout, r.deadConnSec)
	if r.backendID != "" {
		b = appendAttr(b, nbdAttrBackendIdentifier, append([]byte(r.backendID), 0))
	}
	return appendSockets(b, r.fds)
}

func appendSockets(b []byte, fds []int) []byte {
	var socks []byte
	for _, fd := range fds {
		socks = appendNested(socks, nbdSockItem, appendU32Attr(nil, nbdSockFD, uint32(fd)))
	}
	return appendNested(b, nbdAttrSockets, socks)
}

// reconfigureRequest describes one NBD_CMD_RECONFIGURE. It carries no
// size and no client flags on purpose: a size resizes the device under
// its users, and client flags are rewritten whole, not merged.
type reconfigureRequest struct {
	index int
	// Both timeouts are always sent (0: none), so that the device ends
	// up with exactly these whatever it had.
	timeoutSec  uint64
	deadConnSec uint64
	backendID   string // must repeat the one given at connect, if any
	fds         []int
}

// reconfigureAttrs encodes the attributes of NBD_CMD_RECONFIGURE. The
// kernel applies the timeouts before it looks at the sockets, so a
// socket it keeps already has the new request timeout as its send
// timeout (which is how Reconnect tells kept sockets from dropped ones).
func reconfigureAttrs(r reconfigureRequest) []byte {
	b := appendU32Attr(nil, nbdAttrIndex, uint32(r.index))
	b = appendU64Attr(b, nbdAttrTimeout, r.timeoutSec)
	b = appendU64Attr(b, nbdAttrDeadConnTimeout, r.deadConnSec)
	if r.backendID != "" {
		b = appendAttr(b, nbdAttrBackendIdentifier, append([]byte(r.backendID), 0))
	}
	if len(r.fds) > 0 {
		b = appendSockets(b, r.fds)
	}
	return b
}

// genlMessage frames a generic-netlink request.
func genlMessage(family uint16, seq uint32, cmd, version uint8, attrs []byte) []byte {
	n := nlmsgHdrLen + genlHdrLen + len(attrs)
	b := make([]byte, 0, n)
	b = ne.AppendUint32(b, uint32(n))
	b = ne.AppendUint16(b, family)
	b = ne.AppendUint16(b, unix.NLM_F_REQUEST|unix.NLM_F_ACK)
	b = ne.AppendUint32(b, seq)
	b = ne.AppendUint32(b, 0) // port id: the kernel fills it in
	b = append(b, cmd, version, 0, 0)
	return append(b, attrs...)
}

// nlAttr is one parsed attribute.
type nlAttr struct {
	typ  uint16 // without the nested/byte-order bits
	data []byte
}

func parseAttrs(b []byte) ([]nlAttr, error) {
	var attrs []nlAttr
	for len(b) >= nlattrHdrLen {
		l := int(ne.Uint16(b))
		if l < nlattrHdrLen || l > len(b) {
			return nil, fmt.Errorf("netlink attribute length %d with %d bytes left", l, len(b))
		}
		attrs = append(attrs, nlAttr{typ: ne.Uint16(b[2:]) &^ (unix.NLA_F_NESTED | unix.NLA_F_NET_BYTEORDER), data: b[nlattrHdrLen:l]})
		b = b[min(nlAlign(l), len(b)):]
	}
	return attrs, nil
}

// genlConn is a generic-netlink socket.
type genlConn struct {
	fd  int
	seq uint32
	buf []byte // for receiving; allocated on first use, then reused
}

func dialGenl() (*genlConn, error) {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_GENERIC)
	if err != nil {
		return nil, fmt.Errorf("netlink socket: %w", err)
	}
	if err := unix.Bind(fd, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("netlink bind: %w", err)
	}
	return &genlConn{fd: fd}, nil
}

func (g *genlConn) Close() error { return unix.Close(g.fd) }

// request sends one request and returns the attributes of every reply
// message before the kernel's acknowledgement. A negative acknowledgement
// becomes a syscall.Errno.
func (g *genlConn) request(family uint16, cmd, version uint8, attrs []byte) ([][]nlAttr, error) {
	g.seq++
	msg := genlMessage(family, g.seq, cmd, version, attrs)
	if err := unix.Sendto(g.fd, msg, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return nil, fmt.Errorf("netlink send: %w", err)
	}
	if g.buf == nil {
		g.buf = make([]byte, nlRecvBufSize)
	}
	return collectReplies(g.seq, g.buf, func(buf []byte) (int, error) {
		for {
			n, _, err := unix.Recvfrom(g.fd, buf, 0)
			if !errors.Is(err, unix.EINTR) {
				return n, err
			}
		}
	})
}

// collectReplies receives messages into buf with recv until the kernel's
// acknowledgement of request seq, and returns the attributes of each reply
// before it. A negative acknowledgement becomes a syscall.Errno.
func collectReplies(seq uint32, buf []byte, recv func([]byte) (int, error)) ([][]nlAttr, error) {
	var replies [][]nlAttr
	for {
		n, err := recv(buf)
		if err != nil {
			return nil, fmt.Errorf("netlink receive: %w", err)
		}
		// Replies keep slices of what was received: copy it out of
		// buf, which the next receive (the acknowledgement) reuses.
		msgs, err := parseNetlinkMessages(bytes.Clone(buf[:n]))
		if err != nil {
			return nil, err
		}
		for _, m := range msgs {
			if m.seq != seq {
				continue
			}
			switch m.typ {
			case unix.NLMSG_ERROR:
				if len(m.data) < 4 {
					return nil, errors.New("netlink: short NLMSG_ERROR")
				}
				if code := int32(ne.Uint32(m.data)); code != 0 {
					return replies, syscall.Errno(-code)
				}
				return replies, nil
			case unix.NLMSG_DONE:
				return replies, nil
			default:
				if len(m.data) < genlHdrLen {
					return nil, errors.New("netlink: reply shorter than its genl header")
				}
				a, err := parseAttrs(m.data[genlHdrLen:])
				if err != nil {
					return nil, err
				}
				replies = append(replies, a)
			}
		}
	}
}

type nlMessage struct {
	typ  uint16
	seq  uint32
	data []byte
}

func parseNetlinkMessages(b []byte) ([]nlMessage, error) {
	var msgs []nlMessage
	for len(b) >= nlmsgHdrLen {
		l := int(ne.Uint32(b))
		if l < nlmsgHdrLen || l > len(b) {
			return nil, fmt.Errorf("netlink message length %d with %d bytes left", l, len(b))
		}
		msgs = append(msgs, nlMessage{typ: ne.Uint16(b[4:]), seq: ne.Uint32(b[8:]), data: b[nlmsgHdrLen:l]})
		b = b[min(nlAlign(l), len(b)):]
	}
	return msgs, nil
}

// errNoNetlinkFamily means the kernel has no "nbd" generic-netlink family:
// the nbd module is not loaded, or the kernel predates netlink control.
var errNoNetlinkFamily = errors.New(`no "nbd" generic-netlink family`)

// resolveFamily looks up a generic-netlink family id by name.
func (g *genlConn) resolveFamily(name string) (uint16, error) {
	attrs := appendAttr(nil, unix.CTRL_ATTR_FAMILY_NAME, append([]byte(name), 0))
	replies, err := g.request(unix.GENL_ID_CTRL, unix.CTRL_CMD_GETFAMILY, 1, attrs)
	if errors.Is(err, unix.ENOENT) {
		return 0, errNoNetlinkFamily
	}
	if err != nil {
		return 0, fmt.Errorf("CTRL_CMD_GETFAMILY %q: %w", name, err)
	}
	for _, r := range replies {
		for _, a := range r {
			if a.typ == unix.CTRL_ATTR_FAMILY_ID && len(a.data) >= 2 {
				// Ids below NLMSG_MIN_TYPE are netlink's own control
				// messages, which the kernel acknowledges and ignores.
				if id := ne.Uint16(a.data); id >= unix.NLMSG_MIN_TYPE {
					return id, nil
				}
			}
		}
	}
	return 0, fmt.Errorf("CTRL_CMD_GETFAMILY %q: no family id in reply", name)
}

// netlinkConnect runs NBD_CMD_CONNECT and returns the device index the
// kernel used.
func netlinkConnect(r connectRequest) (int, error) {
	g, err := dialGenl()
	if err != nil {
		return 0, err
	}
	defer g.Close()
	family, err := g.resolveFamily(nbdGenlFamily)
	if err != nil {
		return 0, err
	}
	replies, err := g.request(family, nbdCmdConnect, nbdGenlVersion, connectAttrs(r))
	if err != nil {
		return 0, fmt.Errorf("NBD_CMD_CONNECT (index %d, %d sockets, %d bytes): %w%s",
			r.index, len(r.fds), r.size, err, connectHint(err))
	}
	for _, rep := range replies {
		for _, a := range rep {
			if a.typ == nbdAttrIndex && len(a.data) >= 4 {
				return int(ne.Uint32(a.data)), nil
			}
		}
	}
	if r.index >= 0 {
		return r.index, nil
	}
	return 0, errors.New("NBD_CMD_CONNECT: kernel reply carries no device index")
}

func connectHint(err error) string {
	switch {
	case errors.Is(err, unix.EBUSY):
		return " (device already connected)"
	case errors.Is(err, unix.EPERM):
		return " (needs CAP_SYS_ADMIN)"
	case errors.Is(err, unix.EINVAL):
		return " (kernel refused an attribute: block size, size or socket)"
	}
	return ""
}

// netlinkDisconnect runs NBD_CMD_DISCONNECT for a device index.
func netlinkDisconnect(index int) error {
	g, err := dialGenl()
	if err != nil {
		return err
	}
	defer g.Close()
	family, err := g.resolveFamily(nbdGenlFamily)
	if err != nil {
		return err
	}
	if _, err := g.request(family, nbdCmdDisconnect, nbdGenlVersion, appendU32Attr(nil, nbdAttrIndex, uint32(index))); err != nil {
		return fmt.Errorf("NBD_CMD_DISCONNECT /dev/nbd%d: %w", index, err)
	}
	return nil
}

// nbdGenl is a generic-netlink socket with the nbd family resolved, for a
// caller that sends many requests (Takeover, polling for dead
// connections).
type nbdGenl struct {
	g      *genlConn
	family uint16
}

func dialNBDGenl() (*nbdGenl, error) {
	g, err := dialGenl()
	if err != nil {
		return nil, err
	}
	family, err := g.resolveFamily(nbdGenlFamily)
	if err != nil {
		g.Close()
		return nil, err
	}
	return &nbdGenl{g: g, family: family}, nil
}

func (n *nbdGenl) Close() error { return n.g.Close() }

// reconfigure runs NBD_CMD_RECONFIGURE. Success says little about the
// sockets: the kernel drops, without an error, every socket for which it
// has no dead connection slot (see Takeover).
func (n *nbdGenl) reconfigure(r reconfigureRequest) error {
	if _, err := n.g.request(n.family, nbdCmdReconfigure, nbdGenlVersion, reconfigureAttrs(r)); err != nil {
		return fmt.Errorf("NBD_CMD_RECONFIGURE /dev/nbd%d (%d sockets): %w%s", r.index, len(r.fds), err, reconfigureHint(err))
	}
	return nil
}

// netlinkReconfigure runs one NBD_CMD_RECONFIGURE on a socket of its own.
func netlinkReconfigure(r reconfigureRequest) error {
	n, err := dialNBDGenl()
	if err != nil {
		return err
	}
	defer n.Close()
	return n.reconfigure(r)
}

func reconfigureHint(err error) string {
	switch {
	case errors.Is(err, unix.EINVAL):
		return " (device not connected through netlink, or its backend identifier differs)"
	case errors.Is(err, unix.EPERM):
		return " (needs CAP_SYS_ADMIN)"
	}
	return ""
}

// isNetlinkUnavailable reports whether err means netlink control of nbd
// cannot be used at all (so the ioctl interface is worth a try).
func isNetlinkUnavailable(err error) bool {
	return errors.Is(err, errNoNetlinkFamily) || errors.Is(err, unix.EPROTONOSUPPORT) ||
		errors.Is(err, unix.EAFNOSUPPORT) || errors.Is(err, os.ErrNotExist)
}
