package nbd

import (
	"bytes"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/gzramd/gzramd/pkg/nbd/nbdtest"
)

// scriptConn is a net.Conn that reads a fixed script and records what is
// written, so the fuzzers drive a real conn without sockets.
type scriptConn struct {
	r      *bytes.Reader
	mu     sync.Mutex
	out    bytes.Buffer
	closed bool
}

func (s *scriptConn) Read(p []byte) (int, error) {
	s.mu.Lock()
	closed := s.closed
	s.mu.Unlock()
	if closed {
		return 0, net.ErrClosed
	}
	return s.r.Read(p)
}

func (s *scriptConn) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return 0, net.ErrClosed
	}
	return s.out.Write(p)
}

func (s *scriptConn) Close() error {
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
	return nil
}

func (s *scriptConn) LocalAddr() net.Addr                { return &net.UnixAddr{Name: "fuzz", Net: "unix"} }
func (s *scriptConn) RemoteAddr() net.Addr               { return &net.UnixAddr{Name: "fuzz", Net: "unix"} }
func (s *scriptConn) SetDeadline(t time.Time) error      { return nil }
func (s *scriptConn) SetReadDeadline(t time.Time) error  { return nil }
func (s *scriptConn) SetWriteDeadline(t time.Time) error { return nil }

// serveScript runs one connection of srv over input and returns what the
// server wrote.
func serveScript(srv *Server, input []byte) []byte {
	sc := &scriptConn{r: bytes.NewReader(input)}
	c := newConn(srv, sc)
	srv.mu.Lock()
	srv.conns[c] = struct{}{}
	srv.connWG.Add(1)
	srv.mu.Unlock()
	c.serve()
	if n := srv.bufBytes.Load(); n != 0 {
		panic(fmt.Sprintf("%d bytes of payload buffers held after the connection ended", n))
	}
	return sc.out.Bytes()
}

func fuzzServer(t testing.TB) *Server {
	srv, err := NewServer([]Export{
		{Name: "d", Description: "fuzz", Backend: nbdtest.NewMemBackend(1 << 20)},
		{Name: "e", Backend: nbdtest.NewMemBackend(4096)},
	}, Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), MaxInFlight: 8})
	if err != nil {
		t.Fatal(err)
	}
	return srv
}

// checkReplies parses a transmission-phase reply stream: every reply must
// carry the reply magic, and a successful read reply is followed by the
// request's length of data.
func checkReplies(t *testing.T, out []byte, reads map[uint64]uint32) {
	for len(out) > 0 {
		if len(out) < replyHeaderLen {
			t.Fatalf("trailing %d bytes", len(out))
		}
		if m := be.Uint32(out); m != magicReply {
			t.Fatalf("reply magic %#x", m)
		}
		errno, cookie := be.Uint32(out[4:]), be.Uint64(out[8:])
		out = out[replyHeaderLen:]
		if n, ok := reads[cookie]; ok && errno == 0 {
			if uint32(len(out)) < n {
				t.Fatalf("read reply %d: %d bytes of %d", cookie, len(out), n)
			}
			out = out[n:]
		}
	}
}

var goPrefix = func() []byte {
	b := be.AppendUint32(nil, clientFlagFixed|clientFlagNoZeroes)
	return append(b, option(optGo, goData("d"))...)
}()

func reqBytes(cmd Command, flags uint16, cookie, off uint64, length uint32, payload []byte) []byte {
	b := be.AppendUint32(nil, magicRequest)
	b = be.AppendUint16(b, flags)
	b = be.AppendUint16(b, uint16(cmd))
	b = be.AppendUint64(b, cookie)
	b = be.AppendUint64(b, off)
	b = be.AppendUint32(b, length)
	return append(b, payload...)
}

func FuzzHandshake(f *testing.F) {
	f.Add(goPrefix)
	f.Add(append(be.AppendUint32(nil, clientFlagFixed), option(optList, nil)...))
	f.Add(append(be.AppendUint32(nil, clientFlagFixed), option(optExportName, []byte("e"))...))
	f.Add(append(be.AppendUint32(nil, clientFlagFixed), option(optInfo, goData("d", 0, 1, 2, 3))...))
	f.Add(append(be.AppendUint32(nil, 0), option(optAbort, nil)...))
	f.Add([]byte("\x00\x00\x00\x03IHAVEOPT\x00\x00\x00\x07\xff\xff\xff\xff"))
	srv := fuzzServer(f)
	f.Fuzz(func(t *testing.T, in []byte) {
		out := serveScript(srv, in)
		if len(out) < 18 || be.Uint64(out) != magicInit {
			t.Fatalf("no greeting: %x", out)
		}
		// Every option reply is well formed.
		out = out[18:]
		for len(out) >= 20 && be.Uint64(out) == magicOptionReply {
			n := be.Uint32(out[16:])
			if uint32(len(out)-20) < n {
				t.Fatalf("option reply claims %d bytes, %d left", n, len(out)-20)
			}
			out = out[20+n:]
		}
	})
}

func FuzzRequests(f *testing.F) {
	seeds := [][]byte{
		reqBytes(CmdWrite, cmdFlagFUA, 1, 0, 4, []byte("abcd")),
		append(reqBytes(CmdWrite, 0, 1, 4095, 2, []byte("xy")), reqBytes(CmdRead, 0, 2, 4094, 4, nil)...),
		reqBytes(CmdRead, 0, 3, 1<<20-1, 2, nil),
		reqBytes(CmdTrim, 0, 4, 0, 8192, nil),
		reqBytes(CmdWriteZeroes, cmdFlagNoHole, 5, 100, 100, nil),
		reqBytes(CmdFlush, 0, 6, 0, 0, nil),
		reqBytes(Command(42), 0, 7, 0, 0, nil),
		reqBytes(CmdWrite, 0, 8, 0, MaxPayload+1, nil),
		reqBytes(CmdDisc, 0, 9, 0, 0, nil),
		[]byte("\x25\x60\x95\x13garbage"),
	}
	for _, s := range seeds {
		f.Add(s)
	}
	srv := fuzzServer(f)
	f.Fuzz(func(t *testing.T, in []byte) {
		// Note the read requests so their replies can be parsed.
		reads := map[uint64]uint32{}
		seen := map[uint64]bool{}
		for p := in; len(p) >= requestHeaderLen; {
			if be.Uint32(p) != magicRequest {
				break
			}
			cmd, cookie, length := Command(be.Uint16(p[6:])), be.Uint64(p[8:]), be.Uint32(p[24:])
			p = p[requestHeaderLen:]
			if seen[cookie] {
				return // replies to a reused cookie are ambiguous; not a server bug
			}
			seen[cookie] = true
			switch cmd {
			case CmdRead:
				reads[cookie] = length
			case CmdWrite:
				if length > MaxPayload || uint64(length) > uint64(len(p)) {
					p = nil
					break
				}
				p = p[length:]
			}
		}
		out := serveScript(srv, append(append([]byte(nil), goPrefix...), in...))
		// Skip greeting and the NBD_OPT_GO replies (up to the ACK).
		out = out[18:]
		for {
			if len(out) < 20 {
				t.Fatalf("handshake did not complete")
			}
			typ, n := be.Uint32(out[12:]), be.Uint32(out[16:])
			out = out[20+n:]
			if typ == repAck {
				break
			}
		}
		checkReplies(t, out, reads)
	})
}
