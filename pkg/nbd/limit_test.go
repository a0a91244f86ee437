package nbd

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"runtime"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gzramd/gzramd/internal/testneeds"
	"github.com/gzramd/gzramd/pkg/nbd/nbdtest"
)

// logBuffer collects a server's log lines, for tests that count them.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *logBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

// count returns the number of lines that contain s.
func (b *logBuffer) count(s string) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return strings.Count(b.buf.String(), s)
}

// limitServer is a Server with opts on a Unix socket (whose clients in
// this process are its own) and on loopback TCP (whose clients are not).
type limitServer struct {
	*testServer
	tcp  string
	logs *logBuffer
}

func startLimitServer(t *testing.T, opts Options) *limitServer {
	t.Helper()
	logs := &logBuffer{}
	opts.Logger = slog.New(slog.NewTextHandler(logs, nil))
	ts := startServer(t, []Export{{Name: "d", Backend: nbdtest.NewMemBackend(8 << 20)}}, opts)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go ts.srv.Serve(l)
	return &limitServer{testServer: ts, tcp: l.Addr().String(), logs: logs}
}

func (ls *limitServer) dialTCP(t *testing.T) (*rawClient, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	nc, info, err := Dial(ctx, "tcp", ls.tcp, "d")
	if err != nil {
		return nil, err
	}
	nc.SetDeadline(time.Time{})
	t.Cleanup(func() { nc.Close() })
	return &rawClient{t: t, nc: nc, info: info}, nil
}

// others returns the connections the server counts against its limit.
func (s *Server) othersOpen() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.others
}

// waitFor polls cond, which the server's connection goroutines make true
// as they end: nothing signals that from outside.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// Connections past MaxConnections are closed at accept and counted, with
// one log line for the lot; those within go on serving, and the server's
// own connections (Unix peers in this process) are neither refused nor
// counted.
func TestMaxConnectionsRefusesThePast(t *testing.T) {
	const limit = 3
	ls := startLimitServer(t, Options{MaxConnections: limit, ReserveBuffers: 4 * ReserveBufferMax})
	var within []*rawClient
	for i := range limit {
		c, err := ls.dialTCP(t)
		if err != nil {
			t.Fatalf("connection %d of %d: %v", i+1, limit, err)
		}
		within = append(within, c)
	}
	const past = 5
	for i := range past {
		if c, err := ls.dialTCP(t); err == nil {
			c.nc.Close()
			t.Fatalf("connection %d past the limit of %d negotiated", i+1, limit)
		}
	}
	if n := ls.srv.ConnectionsRefused(); n != past {
		t.Errorf("ConnectionsRefused = %d, want %d", n, past)
	}
	if n := ls.logs.count("connection refused"); n != 1 {
		t.Errorf("%d log lines for %d refusals, want 1 (rate-limited)", n, past)
	}
	// The kernel device's connections come from this process: a full
	// limit must not keep them out.
	for i := range 2 * limit {
		dialRaw(t, ls.testServer, "d").roundTrip(uint64(i) << 12)
	}
	for i, c := range within {
		c.roundTrip(uint64(16+i) << 12)
	}
	if n := ls.srv.ConnectionsRefused(); n != past {
		t.Errorf("ConnectionsRefused = %d after own connections, want %d", n, past)
	}

	// A place freed is a place taken.
	within[0].nc.Close()
	waitFor(t, "the closed connection's place", func() bool { return ls.srv.othersOpen() == limit-1 })
	c, err := ls.dialTCP(t)
	if err != nil {
		t.Fatalf("a connection after one closed: %v", err)
	}
	c.roundTrip(0)
}

// Connections handed over (Adopt) are never refused; another client's
// still takes its place within the limit, so that upgrades cannot let
// more in each time.
func TestAdoptNeverRefused(t *testing.T) {
	ls := startLimitServer(t, Options{MaxConnections: 1})
	first, err := ls.dialTCP(t)
	if err != nil {
		t.Fatal(err)
	}
	// A TCP pair stands for a client's connection handed over.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	client, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	server, err := l.Accept()
	if err != nil {
		t.Fatal(err)
	}
	if err := ls.srv.Adopt(server, "d", nil); err != nil {
		t.Fatalf("Adopt past the limit: %v", err)
	}
	adopted := &rawClient{t: t, nc: client}
	adopted.roundTrip(0)
	first.roundTrip(4096)
	if n := ls.srv.othersOpen(); n != 2 {
		t.Errorf("%d connections counted, want 2: the adopted one takes a place", n)
	}
	if _, err := ls.dialTCP(t); err == nil {
		t.Error("a new connection negotiated while the adopted one holds a place")
	}
}

// The limit tells the process's own connections from another process's
// by the Unix socket's peer: a client in a child process is counted.
func TestMaxConnectionsForeignProcess(t *testing.T) {
	const limit = 2
	ls := startLimitServer(t, Options{MaxConnections: limit})
	// Own connections first: they take no place.
	for i := range 3 {
		dialRaw(t, ls.testServer, "d").roundTrip(uint64(i) << 12)
	}
	stdout, end := startChild(t, "TestForeignClientChild",
		"NBD_TEST_FOREIGN_SOCKET="+ls.sock, "NBD_TEST_FOREIGN_CONNS="+strconv.Itoa(limit+2))
	var got []string
	sc := bufio.NewScanner(stdout)
	for sc.Scan() {
		line := sc.Text()
		if line == "done" {
			break
		}
		if line == "ok" || line == "refused" {
			got = append(got, line)
		}
	}
	want := []string{"ok", "ok", "refused", "refused"}
	if !slices.Equal(got, want) {
		t.Fatalf("child's connections: %v, want %v", got, want)
	}
	if n := ls.srv.ConnectionsRefused(); n != 2 {
		t.Errorf("ConnectionsRefused = %d, want 2", n)
	}
	// While the child holds the limit, this process still gets in.
	dialRaw(t, ls.testServer, "d").roundTrip(8 << 12)
	if err := end(); err != nil {
		t.Errorf("child: %v", err)
	}
}

// TestForeignClientChild is the client of another process that
// TestMaxConnectionsForeignProcess starts: it dials the socket
// NBD_TEST_FOREIGN_CONNS times, prints ok or refused for each, then
// "done", and holds its connections until its stdin closes.
func TestForeignClientChild(t *testing.T) {
	sock := os.Getenv("NBD_TEST_FOREIGN_SOCKET")
	if sock == "" {
		testneeds.Helper(t, "TestMaxConnectionsForeignProcess")
	}
	n, _ := strconv.Atoi(os.Getenv("NBD_TEST_FOREIGN_CONNS"))
	var held []net.Conn
	for i := range n {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		nc, _, err := Dial(ctx, "unix", sock, "d")
		cancel()
		if err != nil {
			fmt.Println("refused")
			continue
		}
		c := &rawClient{t: t, nc: nc}
		nc.SetDeadline(time.Time{})
		c.roundTrip(uint64(32+i) << 12)
		held = append(held, nc)
		fmt.Println("ok")
	}
	fmt.Println("done")
	io.Copy(io.Discard, os.Stdin)
	for _, nc := range held {
		nc.Close()
	}
}

// A handshake that stalls is closed at the timeout, counted, and logged
// once for the lot; meanwhile it held a place within the limit, which it
// then gives back.
func TestHandshakeTimeoutCounted(t *testing.T) {
	const stalled = 4
	ls := startLimitServer(t, Options{MaxConnections: stalled, HandshakeTimeout: 200 * time.Millisecond})
	var conns []net.Conn
	for i := range stalled {
		nc, err := net.Dial("tcp", ls.tcp)
		if err != nil {
			t.Fatal(err)
		}
		defer nc.Close()
		if i%2 == 1 {
			nc.Write([]byte{0, 0}) // half of the client flags
		}
		conns = append(conns, nc)
	}
	for _, nc := range conns {
		expectClosed(t, nc)
	}
	if n := ls.srv.HandshakeTimeouts(); n != stalled {
		t.Errorf("HandshakeTimeouts = %d, want %d", n, stalled)
	}
	if n := ls.logs.count("handshake timed out"); n != 1 {
		t.Errorf("%d log lines for %d handshake timeouts, want 1 (rate-limited)", n, stalled)
	}
	waitFor(t, "the stalled connections' places", func() bool { return ls.srv.othersOpen() == 0 })
	c, err := ls.dialTCP(t)
	if err != nil {
		t.Fatalf("a connection after the stalled ones closed: %v", err)
	}
	c.roundTrip(0)
	if n := ls.srv.ConnectionsRefused(); n != 0 {
		t.Errorf("ConnectionsRefused = %d, want 0", n)
	}
}

// vmRSS is this process's resident memory, the Go heap's free pages
// given back first: what the heap does meanwhile (other tests' garbage)
// moves it by several MiB, as much as the reserves measured.
func vmRSS(t *testing.T) int64 {
	t.Helper()
	debug.FreeOSMemory()
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		testneeds.Machine(t, "no /proc/self/status: %v", err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			if err != nil {
				t.Fatalf("VmRSS %q: %v", v, err)
			}
			return kb << 10
		}
	}
	t.Fatal("no VmRSS in /proc/self/status")
	return 0
}

// Closed connections give their reserve back to the system at once: it
// is no heap memory the runtime keeps (and, locked, could never return).
func TestClosedConnectionsGiveReserveBack(t *testing.T) {
	if raceEnabled {
		t.Skip("resident memory under -race counts the detector's shadow memory, never given back; the run without -race checks this")
	}
	const (
		reserve = 4 << 20
		n       = 12
	)
	ts := startServer(t, []Export{{Name: "d", Backend: nbdtest.NewMemBackend(1 << 20)}}, Options{ReserveBuffers: reserve})
	// One connection first, so that what every connection allocates on
	// the heap the first time (and keeps for the next) is in before.
	dialRaw(t, ts, "d").roundTrip(0)
	before := vmRSS(t)
	var conns []*rawClient
	for i := range n {
		c := dialRaw(t, ts, "d")
		c.roundTrip(uint64(i) << 12) // its transmission phase, reserve and all, has begun
		conns = append(conns, c)
	}
	during := vmRSS(t)
	for _, c := range conns {
		c.nc.Close()
	}
	waitFor(t, "the connections to end", func() bool {
		ts.srv.mu.Lock()
		defer ts.srv.mu.Unlock()
		return len(ts.srv.conns) == 1
	})
	after := vmRSS(t)
	t.Logf("resident: %d MiB before, %d MiB with %d more connections, %d MiB after they closed",
		before>>20, during>>20, n, after>>20)
	if grew := during - before; grew < n*reserve*3/4 {
		t.Errorf("resident memory grew %d MiB with %d connections of a %d MiB reserve: the reserve is not resident", grew>>20, n, reserve>>20)
	}
	if kept := after - before; kept > 2*reserve {
		t.Errorf("resident memory %d MiB above where it was after the connections closed: their reserve stayed", kept>>20)
	}
}

// Refusals are logged a line per client per refusalLogEvery, for the
// first refusalLogClients clients; the rest share the lines of "other".
func TestRefusalLogPerClient(t *testing.T) {
	var l clientLogLimiter
	now := time.Now()
	for i := range refusalLogClients {
		client := fmt.Sprintf("10.0.0.%d", i)
		if ok, n, c := l.allow(now, client); !ok || n != 1 || c != client {
			t.Fatalf("first refusal of %s: logged %v, count %d, client %q", client, ok, n, c)
		}
		if ok, _, _ := l.allow(now, client); ok {
			t.Fatalf("second refusal of %s logged within the period", client)
		}
	}
	if ok, n, c := l.allow(now, "10.0.1.1"); !ok || n != 1 || c != "other" {
		t.Errorf("a client past the bound: logged %v, count %d, client %q; want a line for \"other\"", ok, n, c)
	}
	if ok, _, c := l.allow(now, "10.0.1.2"); ok || c != "other" {
		t.Errorf("another client past the bound: logged %v as %q; want it counted in \"other\"'s next line", ok, c)
	}
	// A period on, the first client's held-back refusal is in its next
	// line; the clients that had no line for a period are forgotten, and
	// a new one gets lines of its own.
	later := now.Add(refusalLogEvery)
	if ok, n, _ := l.allow(later, "10.0.0.0"); !ok || n != 2 {
		t.Errorf("10.0.0.0 a period later: logged %v, count %d; want a line counting 2", ok, n)
	}
	if ok, n, c := l.allow(later, "10.0.1.3"); !ok || n != 1 || c != "10.0.1.3" {
		t.Errorf("a new client a period later: logged %v, count %d, client %q; want a line of its own", ok, n, c)
	}
	if len(l.clients) != 2 {
		t.Errorf("%d clients remembered, want 2", len(l.clients))
	}
}

// startChild runs this test binary's test named run in another process,
// with env added to its environment, and returns its stdout and end, which
// closes its stdin (telling it to end) and waits for it. A test that does
// not call end has it called at cleanup.
func startChild(t *testing.T, run string, env ...string) (io.Reader, func() error) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^"+run+"$")
	cmd.Env = append(os.Environ(), env...)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	end := sync.OnceValue(func() error {
		stdin.Close()
		return cmd.Wait()
	})
	t.Cleanup(func() { end() })
	return stdout, end
}

// Connections that are not the kernel device's are told a maximum payload
// of otherMaxPayload, get an error for more (the stream kept in step), and
// hold at most that of payload buffers beyond their reserve: 8 of them
// that each asked for four 32 MiB reads and four of otherMaxPayload, and
// read no reply, held 8 × otherMaxPayload (with MaxPayload for all they
// held 512 MiB). Meanwhile the kernel device's connection is told
// MaxPayload and served requests of that size.
func TestOthersPayloadBounded(t *testing.T) {
	const others = 8
	ts := startServer(t, []Export{{Name: "d", Backend: nbdtest.NewMemBackend(MaxPayload)}},
		Options{MaxConnections: others, ReserveBuffers: 4 << 20})
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go ts.srv.Serve(l)
	ls := &limitServer{testServer: ts, tcp: l.Addr().String()}

	// The limits, on a connection of its own: one whose client has read
	// 8 MiB has a receive window the kernel grew to take several replies
	// of that size unread, so its requests would not stay stalled.
	probe, err := ls.dialTCP(t)
	if err != nil {
		t.Fatal(err)
	}
	if probe.info.MaxBlock != otherMaxPayload {
		t.Fatalf("another client was told a maximum payload of %d, want %d", probe.info.MaxBlock, otherMaxPayload)
	}
	probe.expect(errnoInval, CmdRead, 0, 0, otherMaxPayload+1, nil)
	probe.expect(errnoInval, CmdWrite, 0, 0, otherMaxPayload+4096, make([]byte, otherMaxPayload+4096))
	probe.expect(0, CmdWrite, 0, 0, otherMaxPayload, make([]byte, otherMaxPayload))
	probe.expect(0, CmdRead, 0, 0, otherMaxPayload, nil)
	probe.nc.Close()
	waitFor(t, "the probe's connection to close", func() bool {
		ts.srv.mu.Lock()
		defer ts.srv.mu.Unlock()
		return len(ts.srv.conns) == 0
	})

	for i := range others {
		c, err := ls.dialTCP(t)
		if err != nil {
			t.Fatalf("connection %d: %v", i, err)
		}
		for j := range 4 {
			c.send(CmdRead, 0, uint64(j), 0, MaxPayload, nil)
		}
		for j := range 4 {
			c.send(CmdRead, 0, uint64(4+j), uint64(j)*otherMaxPayload, otherMaxPayload, nil)
		}
	}
	const bound = others * otherMaxPayload
	waitFor(t, "the stalled reads' buffers", func() bool { return ts.srv.bufBytes.Load() >= bound })
	// Give a broken budget the time to let more in.
	time.Sleep(200 * time.Millisecond)
	n := ts.srv.bufBytes.Load()
	t.Logf("%d connections of other clients, each with four reads of %d MiB and four of %d MiB unread, hold %d MiB of payload buffers", others, MaxPayload>>20, otherMaxPayload>>20, n>>20)
	if n > bound {
		t.Errorf("%d connections of other clients hold %d MiB of payload buffers, want at most %d MiB", others, n>>20, bound>>20)
	}
	ts.srv.mu.Lock()
	for c := range ts.srv.conns {
		c.payload.mu.Lock()
		if c.payload.used > otherMaxPayload || c.payload.cached-c.srv.reserveBuffers > otherMaxPayload {
			t.Errorf("a connection holds %d bytes of buffers and keeps %d idle beyond its reserve, want at most %d each", c.payload.used, c.payload.cached-c.srv.reserveBuffers, otherMaxPayload)
		}
		c.payload.mu.Unlock()
	}
	ts.srv.mu.Unlock()

	own := dialRaw(t, ts, "d")
	if own.info.MaxBlock != MaxPayload {
		t.Errorf("the kernel device's connection was told a maximum payload of %d, want %d", own.info.MaxBlock, MaxPayload)
	}
	data := bytes.Repeat([]byte{0x5a}, MaxPayload)
	own.expect(0, CmdWrite, 0, 0, MaxPayload, data)
	own.send(CmdRead, 0, 1, 0, MaxPayload, nil)
	if errno, _ := own.recv(); errno != 0 {
		t.Fatalf("the kernel device's read of %d bytes: errno %d", MaxPayload, errno)
	}
	if got := own.recvData(MaxPayload); !bytes.Equal(got, data) {
		t.Error("the kernel device's read differs from its write")
	}
	// The reply reaches the client before its buffer is put back.
	deadline := time.Now().Add(5 * time.Second)
	n = ts.srv.bufBytes.Load()
	for n != bound && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
		n = ts.srv.bufBytes.Load()
	}
	if n != bound {
		t.Errorf("%d MiB of payload buffers held once the kernel's requests ended, want the others' %d MiB", n>>20, bound>>20)
	}
}

// Payload buffers are mappings of their own, unmapped once no connection
// keeps them: a burst of large requests leaves nothing behind on the Go
// heap, where under mlockall it would stay resident for ever. 8 clients
// each with four 8 MiB reads in flight hold up to 64 MiB at once; the
// heap grows by none of it.
func TestPayloadBuffersLeaveNoHeap(t *testing.T) {
	const others, reads = 8, 4
	ts := startServer(t, []Export{{Name: "d", Backend: nbdtest.NewMemBackend(MaxPayload)}},
		Options{MaxConnections: others})
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go ts.srv.Serve(l)
	ls := &limitServer{testServer: ts, tcp: l.Addr().String()}

	var before runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	made := ts.srv.PayloadBuffersAllocated()
	var conns []*rawClient
	for i := range others {
		c, err := ls.dialTCP(t)
		if err != nil {
			t.Fatalf("connection %d: %v", i, err)
		}
		for j := range reads {
			c.send(CmdRead, 0, uint64(j), uint64(j)*otherMaxPayload, otherMaxPayload, nil)
		}
		conns = append(conns, c)
	}
	for _, c := range conns {
		for range reads {
			if errno, _ := c.recv(); errno != 0 {
				t.Fatalf("a read of %d MiB: errno %d", otherMaxPayload>>20, errno)
			}
			c.recvData(otherMaxPayload)
		}
		c.nc.Close()
	}
	waitFor(t, "the connections to close", func() bool {
		ts.srv.mu.Lock()
		defer ts.srv.mu.Unlock()
		return len(ts.srv.conns) == 0
	})
	var after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&after)
	grew := int64(after.HeapSys) - int64(before.HeapSys)
	t.Logf("%d payload buffers made for %d clients' %d reads of %d MiB; the heap grew by %.1f MiB",
		ts.srv.PayloadBuffersAllocated()-made, others, reads, otherMaxPayload>>20, float64(grew)/(1<<20))
	if ts.srv.PayloadBuffersAllocated() == made {
		t.Fatal("no payload buffer was made: the test measured nothing")
	}
	if grew > otherMaxPayload {
		t.Errorf("the Go heap grew by %d MiB over a burst of %d MiB in flight, want the buffers off it", grew>>20, others*otherMaxPayload>>20)
	}
}
