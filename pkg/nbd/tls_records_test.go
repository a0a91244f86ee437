package nbd

import (
	"bytes"
	"net"
	"slices"
	"sync"
	"testing"
)

// recordCounter is a listener whose connections count the server's
// writes, each one system call on the socket beneath, and the TLS records
// that each carries.
type recordCounter struct {
	net.Listener
	mu     sync.Mutex
	writes []int // records begun in each write since the last reset
}

func (l *recordCounter) Accept() (net.Conn, error) {
	nc, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &recordConn{Conn: nc, l: l}, nil
}

// reset forgets the writes so far and returns them.
func (l *recordCounter) reset() []int {
	l.mu.Lock()
	defer l.mu.Unlock()
	w := l.writes
	l.writes = nil
	return w
}

// recordConn hides the socket's NetConn (so the server writes through it)
// and counts the TLS records in each write, before making it: once the
// client has read a reply, its writes are all counted. crypto/tls writes
// whole records, so a write that does not end at a record's end counts -1.
type recordConn struct {
	net.Conn
	l *recordCounter
}

func (c *recordConn) Write(p []byte) (int, error) {
	records := 0
	b := p
	for len(b) >= 5 {
		n := 5 + int(be.Uint16(b[3:]))
		if n > len(b) {
			break
		}
		records++
		b = b[n:]
	}
	if len(b) > 0 {
		records = -1
	}
	c.l.mu.Lock()
	c.l.writes = append(c.l.writes, records)
	c.l.mu.Unlock()
	return c.Conn.Write(p)
}

// A read's reply over TLS leaves in as few records as its size allows,
// all in one write: a 4 KiB reply is one record in one system call, from
// a connection's first reply on (crypto/tls would otherwise start a
// connection with records of a TCP segment's size, and make each record
// a system call of its own).
func TestTLSReplyRecords(t *testing.T) {
	p := newPKI(t)
	s := startTLSServer(t, p.files, Options{})
	conf, err := p.files.Config(nil)
	if err != nil {
		t.Fatal(err)
	}
	tcp, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l := &recordCounter{Listener: tcp}
	go s.srv.ServeTLS(l, conf)
	s.addr = tcp.Addr().String()
	c, err := s.dialTLS(t, p.clientConf())
	if err != nil {
		t.Fatal(err)
	}
	data := bytes.Repeat([]byte("records!"), 128<<10/8)
	c.expect(0, CmdWrite, 0, 0, uint32(len(data)), data)

	for _, tc := range []struct {
		size    uint32
		records int
	}{
		{16<<10 - replyHeaderLen, 1},
		{4096, 1},
		{64 << 10, 5},
		{128 << 10, 9},
	} {
		l.reset()
		c.send(CmdRead, 0, 1, 0, tc.size, nil)
		if errno, _ := c.recv(); errno != 0 {
			t.Fatalf("read of %d bytes: errno %d", tc.size, errno)
		}
		if !bytes.Equal(c.recvData(int(tc.size)), data[:tc.size]) {
			t.Fatalf("read of %d bytes: data differs", tc.size)
		}
		w := l.reset()
		want := []int{tc.records}
		if !slices.Equal(w, want) {
			t.Errorf("a %d-byte read's reply: records in each write %v, want %v", tc.size, w, want)
		}
	}
}
