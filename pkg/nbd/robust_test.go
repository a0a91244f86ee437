package nbd

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/gzramd/gzramd/pkg/blockdev"
	"github.com/gzramd/gzramd/pkg/nbd/nbdtest"
)

// rawClient speaks the transmission phase byte by byte (nbdtest), to send
// what no well-behaved client would.
type rawClient struct {
	t    testing.TB
	nc   net.Conn
	info ExportInfo
}

func dialRaw(t testing.TB, ts *testServer, export string) *rawClient {
	t.Helper()
	nc, info, err := Dial(context.Background(), "unix", ts.sock, export)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nc.Close() })
	return &rawClient{t: t, nc: nc, info: info}
}

func (c *rawClient) send(cmd Command, flags uint16, cookie, off uint64, length uint32, payload []byte) {
	c.t.Helper()
	if err := nbdtest.NewConn(c.nc).Send(uint16(cmd), flags, cookie, off, length, payload); err != nil {
		c.t.Fatalf("sending %v: %v", cmd, err)
	}
}

// recv reads one simple reply header.
func (c *rawClient) recv() (errno uint32, cookie uint64) {
	c.t.Helper()
	c.nc.SetReadDeadline(time.Now().Add(10 * time.Second))
	errno, cookie, err := nbdtest.NewConn(c.nc).Reply()
	if err != nil {
		c.t.Fatalf("reading reply: %v", err)
	}
	return errno, cookie
}

func (c *rawClient) recvData(n int) []byte {
	c.t.Helper()
	b, err := nbdtest.NewConn(c.nc).Data(n)
	if err != nil {
		c.t.Fatalf("reading %d bytes of read reply: %v", n, err)
	}
	return b
}

// expect sends one request and checks its reply's error code.
func (c *rawClient) expect(want uint32, cmd Command, flags uint16, off uint64, length uint32, payload []byte) {
	c.t.Helper()
	c.send(cmd, flags, 77, off, length, payload)
	errno, cookie := c.recv()
	if errno != want || cookie != 77 {
		c.t.Fatalf("%v off %d len %d: errno %d cookie %d, want errno %d cookie 77", cmd, off, length, errno, cookie, want)
	}
	if cmd == CmdRead && errno == 0 {
		c.recvData(int(length))
	}
}

// roundTrip checks that the connection still serves a write and a read.
func (c *rawClient) roundTrip(off uint64) {
	c.t.Helper()
	data := bytes.Repeat([]byte{byte(off >> 12), 0x5a}, 2048)
	c.expect(0, CmdWrite, 0, off, 4096, data)
	c.send(CmdRead, 0, 78, off, 4096, nil)
	if errno, cookie := c.recv(); errno != 0 || cookie != 78 {
		c.t.Fatalf("read back: errno %d cookie %d", errno, cookie)
	}
	if got := c.recvData(4096); !bytes.Equal(got, data) {
		c.t.Fatal("read back differs")
	}
}

// expectClosed checks that the server dropped the connection.
func expectClosed(t testing.TB, nc net.Conn) {
	t.Helper()
	nc.SetReadDeadline(time.Now().Add(10 * time.Second))
	n, err := io.Copy(io.Discard, nc)
	if err != nil && !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("connection not closed by server (read %d bytes): %v", n, err)
	}
}

func TestBadRequests(t *testing.T) {
	base := runtime.NumGoroutine()
	mem := nbdtest.NewMemBackend(1 << 20)
	ts := startServer(t, []Export{{Name: "d", Backend: mem}}, Options{})
	c := dialRaw(t, ts, "d")
	if c.info.Size != 1<<20 || c.info.Flags != serverFlags || c.info.PreferredBlock != 4096 || c.info.MaxBlock != MaxPayload {
		t.Fatalf("negotiated %+v", c.info)
	}
	size := uint64(1 << 20)
	cases := []struct {
		name    string
		want    uint32
		cmd     Command
		flags   uint16
		off     uint64
		length  uint32
		payload []byte
	}{
		{"read past end", errnoInval, CmdRead, 0, size - 4095, 4096, nil},
		{"read at huge offset", errnoInval, CmdRead, 0, 1 << 63, 1, nil},
		{"read offset overflow", errnoInval, CmdRead, 0, ^uint64(0) - 10, 4096, nil},
		{"read over max payload", errnoInval, CmdRead, 0, 0, MaxPayload + 1, nil},
		{"write past end", errnoNoSpc, CmdWrite, 0, size - 100, 4096, make([]byte, 4096)},
		{"write at end", errnoNoSpc, CmdWrite, 0, size, 1, []byte{1}},
		{"trim past end", errnoInval, CmdTrim, 0, size, 4096, nil},
		{"zero past end", errnoNoSpc, CmdWriteZeroes, 0, size - 4096, 8192, nil},
		{"unknown command", errnoInval, Command(99), 0, 0, 4096, nil},
		{"cache (not advertised)", errnoInval, CmdCache, 0, 0, 4096, nil},
		{"block status (not negotiated)", errnoInval, CmdBlockStatus, 0, 0, 4096, nil},
		{"zero-length read", 0, CmdRead, 0, 0, 0, nil},
		{"zero-length write at end", 0, CmdWrite, 0, size, 0, nil},
		{"unaligned read at end", 0, CmdRead, 0, size - 1, 1, nil},
		{"write with unknown flags", 0, CmdWrite, 0xff00, 3 << 12, 3, []byte{1, 2, 3}},
	}
	for _, tc := range cases {
		c.expect(tc.want, tc.cmd, tc.flags, tc.off, tc.length, tc.payload)
		c.roundTrip(8192)
	}
	// A write beyond the maximum payload: its payload is skipped and the
	// connection stays usable.
	c.expect(errnoInval, CmdWrite, 0, 0, MaxPayload+4096, bytes.Repeat([]byte{0xcc}, MaxPayload+4096))
	c.roundTrip(4096)
	if got := mem.Snapshot(); got[0] != 0 {
		t.Error("oversized write reached the backend")
	}

	// Bad magic: the connection is dropped, the server carries on.
	bad := make([]byte, requestHeaderLen)
	copy(bad, "GARBAGE!")
	c.nc.Write(bad)
	expectClosed(t, c.nc)
	c2 := dialRaw(t, ts, "")
	c2.roundTrip(0)
	c2.send(CmdDisc, 0, 1, 0, 0, nil)
	expectClosed(t, c2.nc)
	ts.shutdown(t)
	checkGoroutines(t, base)
}

func TestTruncatedAndAbrupt(t *testing.T) {
	base := runtime.NumGoroutine()
	mem := nbdtest.NewMemBackend(1 << 20)
	ts := startServer(t, []Export{{Name: "d", Backend: mem}}, Options{})

	// A write whose payload never fully arrives changes nothing.
	c := dialRaw(t, ts, "d")
	c.send(CmdWrite, 0, 1, 0, 4096, bytes.Repeat([]byte{0xee}, 1000))
	c.nc.Close()

	// A header cut short.
	c = dialRaw(t, ts, "d")
	c.nc.Write([]byte{0x25, 0x60, 0x95})
	c.nc.Close()

	// Many requests in flight, then the client vanishes without reading.
	c = dialRaw(t, ts, "d")
	for i := range 200 {
		c.send(CmdRead, 0, uint64(i), uint64(i%256)*4096, 4096, nil)
	}
	c.nc.Close()

	// A reset connection (SO_LINGER 0 is TCP only; a unix socket just closes).
	c = dialRaw(t, ts, "d")
	c.send(CmdWrite, 0, 1, 0, 8192, make([]byte, 4096))
	c.nc.(*net.UnixConn).CloseWrite()
	expectClosed(t, c.nc)

	ok := dialRaw(t, ts, "d")
	ok.roundTrip(1 << 19)
	if got := mem.Snapshot(); got[0] != 0 {
		t.Error("a truncated write reached the backend")
	}
	ts.shutdown(t)
	checkGoroutines(t, base)
}

// handshakeConn dials and reads the server greeting.
func handshakeConn(t testing.TB, ts *testServer) net.Conn {
	t.Helper()
	nc, err := net.Dial("unix", ts.sock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nc.Close() })
	var g [18]byte
	nc.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.ReadFull(nc, g[:]); err != nil {
		t.Fatal(err)
	}
	if be.Uint64(g[:]) != magicInit || be.Uint64(g[8:]) != magicOption || be.Uint16(g[16:]) != flagFixedNewstyle|flagNoZeroes {
		t.Fatalf("greeting %x", g)
	}
	return nc
}

func option(opt uint32, data []byte) []byte {
	return append(appendOption(nil, opt, len(data)), data...)
}

func goData(name string, infos ...uint16) []byte {
	b := be.AppendUint32(nil, uint32(len(name)))
	b = append(b, name...)
	b = be.AppendUint16(b, uint16(len(infos)))
	for _, i := range infos {
		b = be.AppendUint16(b, i)
	}
	return b
}

func TestHandshakeBadInput(t *testing.T) {
	base := runtime.NumGoroutine()
	mem := nbdtest.NewMemBackend(1 << 20)
	ts := startServer(t, []Export{{Name: "d", Description: "desc", Backend: mem}}, Options{})

	expectReply := func(nc net.Conn, opt, want uint32) []byte {
		t.Helper()
		typ, data, err := readOptReply(nc, opt)
		if err != nil {
			t.Fatal(err)
		}
		if typ != want {
			t.Fatalf("option %d: reply %#x (%q), want %#x", opt, typ, data, want)
		}
		return data
	}

	// Garbage right after the greeting: unknown client flags.
	nc := handshakeConn(t, ts)
	nc.Write([]byte("GET / HTTP/1.1\r\n\r\n"))
	expectClosed(t, nc)

	// Bad option magic.
	nc = handshakeConn(t, ts)
	nc.Write(be.AppendUint32(nil, clientFlagFixed))
	nc.Write(bytes.Repeat([]byte{0xab}, 16))
	expectClosed(t, nc)

	// Option replies that keep the handshake going, then NBD_OPT_GO.
	nc = handshakeConn(t, ts)
	nc.Write(be.AppendUint32(nil, clientFlagFixed|clientFlagNoZeroes))
	nc.Write(option(99, []byte("junk")))
	expectReply(nc, 99, repErrUnsup)
	nc.Write(option(optStartTLS, nil))
	expectReply(nc, optStartTLS, repErrUnsup)
	nc.Write(option(optStructuredReply, nil))
	expectReply(nc, optStructuredReply, repErrUnsup)
	nc.Write(option(optList, []byte("x")))
	expectReply(nc, optList, repErrInvalid)
	nc.Write(option(optGo, []byte{0, 0, 0}))
	expectReply(nc, optGo, repErrInvalid)
	nc.Write(option(optGo, []byte{0xff, 0xff, 0xff, 0xff, 0, 0}))
	expectReply(nc, optGo, repErrInvalid)
	nc.Write(option(optInfo, append(goData("d"), 0))) // odd trailing byte
	expectReply(nc, optInfo, repErrInvalid)
	nc.Write(option(optGo, goData("nosuch")))
	expectReply(nc, optGo, repErrUnknown)
	nc.Write(option(77, make([]byte, maxOptionLen+1)))
	expectReply(nc, 77, repErrTooBig)
	nc.Write(option(optList, nil))
	if d := expectReply(nc, optList, repServer); !bytes.Equal(d, append(be.AppendUint32(nil, 1), "ddesc"...)) {
		t.Errorf("NBD_REP_SERVER %q", d)
	}
	expectReply(nc, optList, repAck)
	nc.Write(option(optInfo, goData("d", infoName, infoDescription, 1234)))
	var sawName, sawDesc, sawExport, sawBlock bool
	for {
		typ, d, err := readOptReply(nc, optInfo)
		if err != nil {
			t.Fatal(err)
		}
		if typ == repAck {
			break
		}
		switch be.Uint16(d) {
		case infoName:
			sawName = string(d[2:]) == "d"
		case infoDescription:
			sawDesc = string(d[2:]) == "desc"
		case infoExport:
			sawExport = be.Uint64(d[2:]) == 1<<20
		case infoBlockSize:
			sawBlock = be.Uint32(d[6:]) == 4096
		}
	}
	if !sawName || !sawDesc || !sawExport || !sawBlock {
		t.Errorf("NBD_OPT_INFO: name %v description %v export %v block size %v", sawName, sawDesc, sawExport, sawBlock)
	}
	// Into transmission with NBD_OPT_EXPORT_NAME and no zeroes.
	nc.Write(option(optExportName, []byte("d")))
	var ex [10]byte
	if _, err := io.ReadFull(nc, ex[:]); err != nil || be.Uint64(ex[:]) != 1<<20 || be.Uint16(ex[8:]) != serverFlags {
		t.Fatalf("NBD_OPT_EXPORT_NAME reply %x: %v", ex, err)
	}
	(&rawClient{t: t, nc: nc}).roundTrip(0)

	// NBD_OPT_EXPORT_NAME with zeroes; unknown name drops the connection.
	nc = handshakeConn(t, ts)
	nc.Write(be.AppendUint32(nil, clientFlagFixed))
	nc.Write(option(optExportName, nil))
	var ex2 [134]byte
	if _, err := io.ReadFull(nc, ex2[:]); err != nil || be.Uint64(ex2[:]) != 1<<20 || !bytes.Equal(ex2[10:], make([]byte, 124)) {
		t.Fatalf("NBD_OPT_EXPORT_NAME reply with zeroes %x: %v", ex2, err)
	}
	nc = handshakeConn(t, ts)
	nc.Write(be.AppendUint32(nil, clientFlagFixed))
	nc.Write(option(optExportName, []byte("nosuch")))
	expectClosed(t, nc)

	// NBD_OPT_ABORT is acknowledged, then the connection closes.
	nc = handshakeConn(t, ts)
	nc.Write(be.AppendUint32(nil, clientFlagFixed))
	nc.Write(option(optAbort, nil))
	expectReply(nc, optAbort, repAck)
	expectClosed(t, nc)

	// An option claiming more data than we will skip.
	nc = handshakeConn(t, ts)
	nc.Write(be.AppendUint32(nil, clientFlagFixed))
	nc.Write(appendOption(nil, 77, 1<<30))
	expectClosed(t, nc)

	ts.shutdown(t)
	checkGoroutines(t, base)
}

func TestHalfOpenConnections(t *testing.T) {
	base := runtime.NumGoroutine()
	mem := nbdtest.NewMemBackend(1 << 20)
	ts := startServer(t, []Export{{Name: "d", Backend: mem}}, Options{HandshakeTimeout: 300 * time.Millisecond})
	n := 300
	if testing.Short() {
		n = 100
	}
	conns := make([]net.Conn, 0, n)
	for i := range n {
		nc, err := net.Dial("unix", ts.sock)
		if err != nil {
			t.Fatalf("conn %d: %v", i, err)
		}
		if i%2 == 0 {
			nc.Write([]byte{0, 0}) // half of the client flags
		}
		conns = append(conns, nc)
	}
	// A real client still gets through while they hang.
	c := dialRaw(t, ts, "d")
	c.roundTrip(0)
	for _, nc := range conns {
		expectClosed(t, nc)
		nc.Close()
	}
	c.roundTrip(4096)
	ts.shutdown(t)
	checkGoroutines(t, base)
}

func TestBackendPanicAndErrors(t *testing.T) {
	base := runtime.NumGoroutine()
	mem := nbdtest.NewMemBackend(1 << 20)
	mem.Hook = func(op string, off int64) error {
		switch off {
		case 200 * 4096:
			panic("backend bug")
		case 28 * 4096:
			return fmt.Errorf("store full: %w", syscall.ENOSPC)
		case 5 * 4096:
			return errors.New("opaque failure")
		case 95 * 4096:
			return syscall.EOPNOTSUPP
		case 3 * 4096:
			return syscall.EBADF // not an NBD error code
		}
		return nil
	}
	ts := startServer(t, []Export{{Name: "d", Backend: mem}}, Options{})
	good := dialRaw(t, ts, "d")
	victim := dialRaw(t, ts, "d")
	good.expect(errnoNoSpc, CmdWrite, 0, 28*4096, 4096, make([]byte, 4096))
	good.expect(errnoIO, CmdRead, 0, 5*4096, 4096, nil)
	good.expect(errnoNotSup, CmdTrim, 0, 95*4096, 4096, nil)
	good.expect(errnoIO, CmdWriteZeroes, 0, 3*4096, 4096, nil)

	// Requests in flight on the victim when its backend call panics.
	for i := range 20 {
		victim.send(CmdRead, 0, uint64(i), uint64(i)*4096+100*4096, 4096, nil)
	}
	victim.send(CmdRead, 0, 99, 200*4096, 4096, nil)
	expectClosed(t, victim.nc)

	good.roundTrip(0)
	late := dialRaw(t, ts, "d")
	late.roundTrip(4096)
	ts.shutdown(t)
	checkGoroutines(t, base)
}

// blockingBackend holds every write until released, to test shutdown.
type blockingBackend struct {
	*nbdtest.MemBackend
	entered chan struct{}
	release chan struct{}
}

func (b *blockingBackend) WriteAt(ctx context.Context, p []byte, off int64, fua bool) error {
	b.entered <- struct{}{}
	<-b.release
	return b.MemBackend.WriteAt(ctx, p, off, fua)
}

func TestShutdownFinishesInFlight(t *testing.T) {
	needsConcurrency(t)
	base := runtime.NumGoroutine()
	bb := &blockingBackend{MemBackend: nbdtest.NewMemBackend(1 << 20), entered: make(chan struct{}, 8), release: make(chan struct{})}
	ts := startServer(t, []Export{{Name: "d", Backend: bb}}, Options{})
	c := dialRaw(t, ts, "d")
	idle := handshakeConn(t, ts) // a connection still in its handshake
	for i := range 4 {
		c.send(CmdWrite, 0, uint64(i), uint64(i)*4096, 4096, bytes.Repeat([]byte{byte(i + 1)}, 4096))
	}
	for range 4 {
		<-bb.entered
	}
	var wg sync.WaitGroup
	var shutdownErr error
	wg.Go(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		shutdownErr = ts.srv.Shutdown(ctx)
	})
	expectClosed(t, idle)
	close(bb.release)
	seen := map[uint64]bool{}
	for range 4 {
		errno, cookie := c.recv()
		if errno != 0 {
			t.Errorf("write %d: errno %d", cookie, errno)
		}
		seen[cookie] = true
	}
	expectClosed(t, c.nc)
	wg.Wait()
	if shutdownErr != nil || len(seen) != 4 {
		t.Fatalf("Shutdown: %v; replies %v", shutdownErr, seen)
	}
	for i := range 4 {
		if got := bb.Snapshot()[i*4096]; got != byte(i+1) {
			t.Errorf("write %d not held: %d", i, got)
		}
	}
	if err := <-ts.done; !errors.Is(err, ErrServerClosed) {
		t.Errorf("Serve: %v", err)
	}
	ts.done = nil
	if _, err := net.Dial("unix", ts.sock); err == nil {
		t.Error("still accepting after Shutdown")
	}
	checkGoroutines(t, base)
}

func TestShutdownDeadline(t *testing.T) {
	needsConcurrency(t)
	base := runtime.NumGoroutine()
	bb := &blockingBackend{MemBackend: nbdtest.NewMemBackend(1 << 20), entered: make(chan struct{}, 1), release: make(chan struct{})}
	ts := startServer(t, []Export{{Name: "d", Backend: bb}}, Options{})
	c := dialRaw(t, ts, "d")
	c.send(CmdWrite, 0, 1, 0, 4096, make([]byte, 4096))
	<-bb.entered
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- ts.srv.Shutdown(ctx) }()
	expectClosed(t, c.nc) // forced closed once ctx expires
	close(bb.release)
	if err := <-done; !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Shutdown: %v, want deadline exceeded", err)
	}
	<-ts.done
	ts.done = nil
	checkGoroutines(t, base)
}

func TestNewServerValidates(t *testing.T) {
	m := nbdtest.NewMemBackend(4096)
	for _, tc := range []struct {
		name    string
		exports []Export
		opts    Options
	}{
		{"no exports", nil, Options{}},
		{"nil backend", []Export{{Name: "a"}}, Options{}},
		{"duplicate", []Export{{Name: "a", Backend: m}, {Name: "a", Backend: m}}, Options{}},
		{"long name", []Export{{Name: string(make([]byte, 5000)), Backend: m}}, Options{}},
		{"negative in flight", []Export{{Name: "a", Backend: m}}, Options{MaxInFlight: -1}},
	} {
		if _, err := NewServer(tc.exports, tc.opts); err == nil {
			t.Errorf("%s: no error", tc.name)
		}
	}
}

func TestMultipleListeners(t *testing.T) {
	base := runtime.NumGoroutine()
	mem := nbdtest.NewMemBackend(1 << 20)
	ts := startServer(t, []Export{{Name: "d", Backend: mem}}, Options{})
	tl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	tcpDone := make(chan error, 1)
	go func() { tcpDone <- ts.srv.Serve(tl) }()
	nc, info, err := Dial(context.Background(), "tcp", tl.Addr().String(), "d")
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	tc := &rawClient{t: t, nc: nc, info: info}
	tc.roundTrip(0)
	uc := dialRaw(t, ts, "d")
	uc.expect(0, CmdFlush, 0, 0, 0, nil)
	// Both see the same device.
	uc.send(CmdRead, 0, 5, 0, 4096, nil)
	uc.recv()
	if got := uc.recvData(4096); got[1] != 0x5a {
		t.Error("unix connection does not see the tcp connection's write")
	}
	ts.shutdown(t)
	if err := <-tcpDone; !errors.Is(err, ErrServerClosed) {
		t.Errorf("tcp Serve: %v", err)
	}
	checkGoroutines(t, base)
}

// countingBackend records how many writes run at once.
type countingBackend struct {
	*nbdtest.MemBackend
	mu        sync.Mutex
	cur, peak int
	entered   chan struct{}
	release   chan struct{}
}

func (b *countingBackend) WriteAt(ctx context.Context, p []byte, off int64, fua bool) error {
	b.mu.Lock()
	b.cur++
	b.peak = max(b.peak, b.cur)
	b.mu.Unlock()
	b.entered <- struct{}{}
	<-b.release
	b.mu.Lock()
	b.cur--
	b.mu.Unlock()
	return b.MemBackend.WriteAt(ctx, p, off, fua)
}

func TestInFlightByteBudget(t *testing.T) {
	needsConcurrency(t)
	base := runtime.NumGoroutine()
	cb := &countingBackend{MemBackend: nbdtest.NewMemBackend(1 << 20), entered: make(chan struct{}, 16), release: make(chan struct{})}
	ts := startServer(t, []Export{{Name: "d", Backend: cb}}, Options{MaxInFlightBytes: 64 << 10})
	c := dialRaw(t, ts, "d")
	// The writes outgrow the socket buffer once the server stops reading,
	// so they are sent from their own goroutine.
	var sender sync.WaitGroup
	sender.Go(func() {
		for i := range 8 {
			c.send(CmdWrite, 0, uint64(i), uint64(i)*(32<<10), 32<<10, bytes.Repeat([]byte{byte(i + 1)}, 32<<10))
		}
	})
	<-cb.entered
	<-cb.entered
	// Give a broken budget the chance to let a third write in.
	time.Sleep(50 * time.Millisecond)
	close(cb.release)
	for range 8 {
		if errno, cookie := c.recv(); errno != 0 {
			t.Errorf("write %d: errno %d", cookie, errno)
		}
	}
	sender.Wait()
	cb.mu.Lock()
	peak := cb.peak
	cb.mu.Unlock()
	if peak > 2 {
		t.Errorf("%d writes of 32 KiB held at once under a 64 KiB budget", peak)
	}
	// A request larger than the whole budget still runs.
	c.expect(0, CmdRead, 0, 0, 256<<10, nil)
	ts.shutdown(t)
	checkGoroutines(t, base)
}

// A client that sends its requests right behind NBD_OPT_GO, before the
// server's replies, is served all the same.
func TestPipelinedHandshake(t *testing.T) {
	mem := nbdtest.NewMemBackend(1 << 20)
	ts := startServer(t, []Export{{Name: "d", Backend: mem}}, Options{})
	nc, err := net.Dial("unix", ts.sock)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	msg := be.AppendUint32(nil, clientFlagFixed|clientFlagNoZeroes)
	msg = append(msg, option(optGo, goData("d"))...)
	msg = append(msg, reqBytes(CmdWrite, 0, 1, 4096, 5, []byte("hello"))...)
	msg = append(msg, reqBytes(CmdRead, 0, 2, 4096, 5, nil)...)
	if _, err := nc.Write(msg); err != nil {
		t.Fatal(err)
	}
	c := &rawClient{t: t, nc: nc}
	var g [18]byte
	io.ReadFull(nc, g[:])
	for {
		typ, _, err := readOptReply(nc, optGo)
		if err != nil {
			t.Fatal(err)
		}
		if typ == repAck {
			break
		}
	}
	// Both requests are in flight at once; their replies may come in
	// either order.
	got := map[uint64]bool{}
	for range 2 {
		errno, cookie := c.recv()
		if errno != 0 {
			t.Fatalf("request %d: errno %d", cookie, errno)
		}
		if cookie == 2 {
			if d := c.recvData(5); string(d) != "hello" && string(d) != "\x00\x00\x00\x00\x00" {
				t.Fatalf("read %q", d)
			}
		}
		got[cookie] = true
	}
	if !got[1] || !got[2] {
		t.Fatalf("replies %v", got)
	}
}

// A client that floods options without reading the replies is dropped at
// the handshake deadline, even with the server blocked writing to it.
func TestHandshakeClientNeverReads(t *testing.T) {
	base := runtime.NumGoroutine()
	mem := nbdtest.NewMemBackend(1 << 20)
	names := make([]Export, 50)
	for i := range names {
		names[i] = Export{Name: fmt.Sprintf("export-%02d-%s", i, bytes.Repeat([]byte("x"), 3000)), Backend: mem}
	}
	ts := startServer(t, names, Options{HandshakeTimeout: 300 * time.Millisecond})
	nc := handshakeConn(t, ts)
	nc.Write(be.AppendUint32(nil, clientFlagFixed))
	// Each NBD_OPT_LIST asks for ~150 KiB of replies.
	var flood []byte
	for range 100 {
		flood = append(flood, option(optList, nil)...)
	}
	nc.Write(flood)
	ok := dialRaw(t, ts, "")
	ok.roundTrip(0)
	ts.shutdown(t)
	nc.Close()
	checkGoroutines(t, base)
}

// countObserver counts completed requests per command and error.
type countObserver struct {
	mu     sync.Mutex
	byCmd  map[Command]int
	errors map[uint32]int
	bytes  uint64
}

func (o *countObserver) RequestDone(cmd Command, length uint32, d time.Duration, errno uint32) {
	o.mu.Lock()
	o.byCmd[cmd]++
	o.errors[errno]++
	o.bytes += uint64(length)
	o.mu.Unlock()
}

func TestObserver(t *testing.T) {
	obs := &countObserver{byCmd: map[Command]int{}, errors: map[uint32]int{}}
	ts := startServer(t, []Export{{Name: "d", Backend: nbdtest.NewMemBackend(1 << 20)}}, Options{Observer: obs})
	c := dialRaw(t, ts, "d")
	c.roundTrip(0)
	c.expect(0, CmdFlush, 0, 0, 0, nil)
	c.expect(0, CmdTrim, 0, 0, 8192, nil)
	c.expect(errnoInval, CmdRead, 0, 1<<20, 1, nil)
	c.send(CmdDisc, 0, 9, 0, 0, nil)
	expectClosed(t, c.nc)
	ts.shutdown(t)
	obs.mu.Lock()
	defer obs.mu.Unlock()
	if obs.byCmd[CmdWrite] != 1 || obs.byCmd[CmdRead] != 2 || obs.byCmd[CmdFlush] != 1 || obs.byCmd[CmdTrim] != 1 || obs.byCmd[CmdDisc] != 0 {
		t.Errorf("observed %v", obs.byCmd)
	}
	if obs.errors[0] != 4 || obs.errors[errnoInval] != 1 || obs.bytes != 4096+4096+8192+1 {
		t.Errorf("observed errors %v bytes %d", obs.errors, obs.bytes)
	}
}

// waitNoConns waits until the server holds no connections.
func waitNoConns(t *testing.T, srv *Server) {
	t.Helper()
	for range 1000 {
		srv.mu.Lock()
		n := len(srv.conns)
		srv.mu.Unlock()
		if n == 0 {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatal("connections still open after 10s")
}

// A client that breaks the protocol while replies are stuck behind its
// full socket (it never reads) is dropped at once, not kept waiting.
func TestProtocolErrorWithUnreadReplies(t *testing.T) {
	// Inline, the reader is the one writing the unread replies: it reaches
	// the bad magic only once the client reads.
	needsConcurrency(t)
	mem := nbdtest.NewMemBackend(16 << 20)
	ts := startServer(t, []Export{{Name: "d", Backend: mem}}, Options{})
	c := dialRaw(t, ts, "d")
	// 100 reads of 64 KiB: more reply data than a socket holds, fewer
	// requests than MaxInFlight, so the reader reaches the bad magic.
	var msg []byte
	for i := range 100 {
		msg = append(msg, reqBytes(CmdRead, 0, uint64(i), uint64(i)*65536, 65536, nil)...)
	}
	msg = append(msg, make([]byte, requestHeaderLen)...) // bad magic
	if _, err := c.nc.Write(msg); err != nil {
		t.Fatal(err)
	}
	waitNoConns(t, ts.srv)
}

// With ReplyTimeout, a client that keeps MaxInFlight requests waiting on
// replies it never reads is dropped.
func TestReplyTimeout(t *testing.T) {
	mem := nbdtest.NewMemBackend(16 << 20)
	ts := startServer(t, []Export{{Name: "d", Backend: mem}}, Options{ReplyTimeout: 200 * time.Millisecond, MaxInFlight: 16})
	c := dialRaw(t, ts, "d")
	var msg []byte
	for i := range 200 {
		msg = append(msg, reqBytes(CmdRead, 0, uint64(i), uint64(i)*65536, 65536, nil)...)
	}
	go c.nc.Write(msg) // blocks once the server stops reading
	waitNoConns(t, ts.srv)
	ok := dialRaw(t, ts, "d")
	ok.roundTrip(0)
}

// With ReserveBuffers, requests of every size up to ReserveBufferMax are
// served from the buffers the connection made at its handshake, however
// they mix, and however many larger requests came before.
func TestReserveBuffersServeWithoutAllocating(t *testing.T) {
	const reserve = 2 << 20
	mem := nbdtest.NewMemBackend(32 << 20)
	ts := startServer(t, []Export{{Name: "d", Backend: mem}}, Options{ReserveBuffers: reserve})
	c := dialRaw(t, ts, "d")
	// Large writes first, which allocate and fill the connection's cache
	// with their buffers: the reserve must not make way for them.
	const large = 24
	for i := range uint64(large) {
		c.send(CmdWrite, 0, 1000+i, i<<20, 1<<20, bytes.Repeat([]byte{byte(i)}, 1<<20))
	}
	for range large {
		if errno, got := c.recv(); errno != 0 {
			t.Fatalf("request %d: errno %d", got, errno)
		}
	}
	made0 := ts.srv.bufs.made.Load()
	rng := rand.New(rand.NewPCG(1, 2))
	lengths := map[uint64]uint32{}
	cookie := uint64(0)
	for round := range 40 {
		cmd := CmdWrite
		if round%2 == 1 {
			cmd = CmdRead
		}
		// Up to 16 requests in flight, of 4 KiB to 128 KiB each: never
		// more than the reserve.
		n := 1 + rng.IntN(16)
		for range n {
			cookie++
			length := uint32(4096) << rng.IntN(6)
			off := uint64(rng.IntN(8<<20-int(length))) &^ 4095
			var payload []byte
			if cmd == CmdWrite {
				payload = bytes.Repeat([]byte{byte(cookie)}, int(length))
			}
			lengths[cookie] = length
			c.send(cmd, 0, cookie, off, length, payload)
		}
		for range n {
			errno, got := c.recv()
			if errno != 0 {
				t.Fatalf("request %d: errno %d", got, errno)
			}
			if cmd == CmdRead {
				c.recvData(int(lengths[got]))
			}
		}
	}
	if made := ts.srv.bufs.made.Load() - made0; made != 0 {
		t.Errorf("%d payload buffers allocated for requests of up to %d bytes; want all from the reserve", made, ReserveBufferMax)
	}
}

// wrappedConn stands for a listener's wrapper around the socket, such as
// the daemon's connection tracker: it embeds the connection, so Write is
// promoted but writev is not.
type wrappedConn struct {
	net.Conn
	writes atomic.Int64
}

func (c *wrappedConn) Write(p []byte) (int, error) {
	c.writes.Add(1)
	return c.Conn.Write(p)
}

func (c *wrappedConn) NetConn() net.Conn { return c.Conn }

type wrappingListener struct {
	net.Listener
	conns chan *wrappedConn
}

func (l *wrappingListener) Accept() (net.Conn, error) {
	nc, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	w := &wrappedConn{Conn: nc}
	l.conns <- w
	return w, nil
}

// Replies go out through the socket beneath a wrapper that names it
// (NetConn), in one writev for a header and its payload (or for several
// replies), not through the wrapper's Write, a system call for each.
func TestRepliesBypassConnWrapper(t *testing.T) {
	ts := startServer(t, []Export{{Name: "d", Backend: nbdtest.NewMemBackend(1 << 20)}}, Options{})
	l, err := net.Listen("unix", filepath.Join(t.TempDir(), "w.sock"))
	if err != nil {
		t.Fatal(err)
	}
	wl := &wrappingListener{Listener: l, conns: make(chan *wrappedConn, 1)}
	done := make(chan error, 1)
	go func() { done <- ts.srv.Serve(wl) }()
	nc, info, err := Dial(context.Background(), "unix", l.Addr().String(), "d")
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	w := <-wl.conns
	handshake := w.writes.Load()
	c := &rawClient{t: t, nc: nc, info: info}
	for i := range 8 {
		c.roundTrip(uint64(i) << 12)
	}
	if n := w.writes.Load() - handshake; n != 0 {
		t.Errorf("%d replies written through the wrapper's Write, want none", n)
	}
	ts.shutdown(t)
	if err := <-done; !errors.Is(err, ErrServerClosed) {
		t.Errorf("Serve: %v", err)
	}
}

// With inline helpers, requests that arrive together run at once, a share
// on each helper and one on the reader, and every reply still comes back
// with the right data.
func TestInlineHelpersRunSharesAtOnce(t *testing.T) {
	const helpers, n = 3, 32
	b := &countingBackend{MemBackend: nbdtest.NewMemBackend(1 << 20), entered: make(chan struct{}, n), release: make(chan struct{})}
	ts := startServer(t, []Export{{Name: "d", Backend: b}}, Options{Inline: true, InlineHelpers: helpers})
	c := dialRaw(t, ts, "d")
	// All n writes in one send, so that the reader finds them together.
	var batch []byte
	for i := range n {
		batch = nbdtest.AppendRequest(batch, uint16(CmdWrite), 0, uint64(i), uint64(i)*4096, 4096, bytes.Repeat([]byte{byte(i + 1)}, 4096))
	}
	if _, err := c.nc.Write(batch); err != nil {
		t.Fatal(err)
	}
	// helpers+1 shares run at once: wait until that many writes are in.
	for range helpers + 1 {
		select {
		case <-b.entered:
		case <-time.After(10 * time.Second):
			t.Fatalf("fewer than %d writes running at once", helpers+1)
		}
	}
	close(b.release)
	seen := map[uint64]bool{}
	for range n {
		errno, cookie := c.recv()
		if errno != 0 || cookie >= n || seen[cookie] {
			t.Fatalf("reply errno %d cookie %d", errno, cookie)
		}
		seen[cookie] = true
	}
	b.mu.Lock()
	peak := b.peak
	b.mu.Unlock()
	if peak != helpers+1 {
		t.Errorf("%d writes at once, want %d (a share each on %d helpers and the reader)", peak, helpers+1, helpers)
	}
	for i := range n {
		c.send(CmdRead, 0, 1000, uint64(i)*4096, 4096, nil)
		if errno, _ := c.recv(); errno != 0 {
			t.Fatalf("read %d: errno %d", i, errno)
		}
		if got := c.recvData(4096); got[0] != byte(i+1) || got[4095] != byte(i+1) {
			t.Fatalf("page %d reads %d, want %d", i, got[0], i+1)
		}
	}
}

// stackBackend records, for each write, whether it ran on the
// connection's reader (transmit) or on a worker; it receives payloads
// itself (WriteReceiver) for writes at offsets in receive.
type stackBackend struct {
	*nbdtest.MemBackend
	receive  func(off int64) bool
	mu       sync.Mutex
	onReader []bool
}

func (b *stackBackend) record() {
	st := string(debug.Stack())
	b.mu.Lock()
	b.onReader = append(b.onReader, strings.Contains(st, "(*conn).transmit"))
	b.mu.Unlock()
}

func (b *stackBackend) WriteAt(ctx context.Context, p []byte, off int64, fua bool) error {
	b.record()
	return b.MemBackend.WriteAt(ctx, p, off, fua)
}

func (b *stackBackend) ReceiveWrite(off int64, length int) (blockdev.Receipt, bool) {
	if !b.receive(off) {
		return nil, false
	}
	return &testReceipt{off: off, bufs: [][]byte{make([]byte, length), nil}}, true
}

func (b *stackBackend) CompleteWrite(ctx context.Context, rc blockdev.Receipt, fua bool) error {
	b.record()
	r := rc.(*testReceipt)
	return b.MemBackend.WriteAt(ctx, r.bufs[0], r.off, fua)
}

func (b *stackBackend) AbortWrite(blockdev.Receipt) {}

// An inline connection runs a write its Backend received itself on the
// reader whatever its size (storing it is cheap), and an ordinary write
// over 64 KiB on a worker.
func TestReceivedWritesRunOnTheReader(t *testing.T) {
	b := &stackBackend{MemBackend: nbdtest.NewMemBackend(1 << 20), receive: func(off int64) bool { return off == 0 }}
	ts := startServer(t, []Export{{Name: "d", Backend: b}}, Options{Inline: true})
	c := dialRaw(t, ts, "d")
	big := bytes.Repeat([]byte{0x77}, 128<<10)
	c.expect(0, CmdWrite, 0, 0, uint32(len(big)), big)
	c.expect(0, CmdWrite, 0, 256<<10, uint32(len(big)), big)
	b.mu.Lock()
	defer b.mu.Unlock()
	if !slices.Equal(b.onReader, []bool{true, false}) {
		t.Errorf("128 KiB writes on the reader: %v, want the received one only", b.onReader)
	}
	if !bytes.Equal(b.Snapshot()[256<<10:384<<10], big) || !bytes.Equal(b.Snapshot()[:128<<10], big) {
		t.Error("a 128 KiB write did not arrive")
	}
}
