// Package nbdtest speaks NBD's transmission phase byte by byte, for tests
// that must know exactly which requests were sent and acknowledged, or
// send what no well-behaved client would. It uses nothing of package nbd,
// so that it checks a server against the protocol (the NBD spec's
// proto.md), not against the server's own code.
package nbdtest

import (
	"encoding/binary"
	"fmt"
	"io"
	"net"
)

// Commands and their wire values.
const (
	CmdRead  uint16 = 0
	CmdWrite uint16 = 1
)

const (
	requestMagic = 0x25609513
	replyMagic   = 0x67446698 // a simple reply
	requestLen   = 28
	replyLen     = 16
)

// Conn is a connection in the transmission phase (negotiated already, as
// nbd.Dial leaves one). It is not safe for concurrent use.
type Conn struct {
	NC     net.Conn
	cookie uint64
}

// NewConn takes over nc, in the transmission phase.
func NewConn(nc net.Conn) *Conn { return &Conn{NC: nc} }

// AppendRequest appends a request header and its payload to b.
func AppendRequest(b []byte, cmd, flags uint16, cookie, off uint64, length uint32, payload []byte) []byte {
	var h [requestLen]byte
	binary.BigEndian.PutUint32(h[0:], requestMagic)
	binary.BigEndian.PutUint16(h[4:], flags)
	binary.BigEndian.PutUint16(h[6:], cmd)
	binary.BigEndian.PutUint64(h[8:], cookie)
	binary.BigEndian.PutUint64(h[16:], off)
	binary.BigEndian.PutUint32(h[24:], length)
	return append(append(b, h[:]...), payload...)
}

// Send sends one request as given.
func (c *Conn) Send(cmd, flags uint16, cookie, off uint64, length uint32, payload []byte) error {
	_, err := c.NC.Write(AppendRequest(nil, cmd, flags, cookie, off, length, payload))
	return err
}

// Reply reads one simple reply's header.
func (c *Conn) Reply() (errno uint32, cookie uint64, err error) {
	var h [replyLen]byte
	if _, err := io.ReadFull(c.NC, h[:]); err != nil {
		return 0, 0, err
	}
	if m := binary.BigEndian.Uint32(h[:]); m != replyMagic {
		return 0, 0, fmt.Errorf("nbdtest: reply magic %#x, want %#x", m, replyMagic)
	}
	return binary.BigEndian.Uint32(h[4:]), binary.BigEndian.Uint64(h[8:]), nil
}

// Data reads the n bytes a read's reply carries after its header.
func (c *Conn) Data(n int) ([]byte, error) {
	b := make([]byte, n)
	_, err := io.ReadFull(c.NC, b)
	return b, err
}

// Write sends one write of data at off and waits for its reply: the NBD
// error code, or an error when the connection failed first.
func (c *Conn) Write(off uint64, data []byte) (errno uint32, err error) {
	c.cookie++
	if err := c.Send(CmdWrite, 0, c.cookie, off, uint32(len(data)), data); err != nil {
		return 0, err
	}
	return c.reply()
}

// Read sends one read of n bytes at off and returns them, or the NBD
// error code.
func (c *Conn) Read(off uint64, n int) (data []byte, errno uint32, err error) {
	c.cookie++
	if err := c.Send(CmdRead, 0, c.cookie, off, uint32(n), nil); err != nil {
		return nil, 0, err
	}
	if errno, err := c.reply(); err != nil || errno != 0 {
		return nil, errno, err
	}
	data, err = c.Data(n)
	return data, 0, err
}

// reply reads the reply to the last request sent, which must carry its
// cookie.
func (c *Conn) reply() (uint32, error) {
	errno, cookie, err := c.Reply()
	if err != nil {
		return 0, err
	}
	if cookie != c.cookie {
		return 0, fmt.Errorf("nbdtest: reply to cookie %d, want %d", cookie, c.cookie)
	}
	return errno, nil
}
