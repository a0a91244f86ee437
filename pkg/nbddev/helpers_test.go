package nbddev

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/gzramd/gzramd/pkg/nbd"
)

// testServer is an NBD server on a unix socket in a temporary directory,
// for the kernel to be attached to.
type testServer struct {
	srv   *nbd.Server
	sock  string
	done  chan error
	conns *connSet // the server's side of each connection open
}

func startServer(t testing.TB, exports []nbd.Export, opts nbd.Options) *testServer {
	t.Helper()
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelWarn}))
	}
	srv, err := nbd.NewServer(exports, opts)
	if err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(t.TempDir(), "nbd.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	ts := &testServer{srv: srv, sock: sock, done: make(chan error, 1), conns: &connSet{m: map[*serverConn]bool{}}}
	go func() { ts.done <- srv.Serve(&trackingListener{l, ts.conns}) }()
	t.Cleanup(func() { ts.shutdown(t) })
	return ts
}

func (ts *testServer) shutdown(t testing.TB) {
	if ts.done == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := ts.srv.Shutdown(ctx); err != nil {
		t.Errorf("Shutdown: %v", err)
	}
	if err := <-ts.done; !errors.Is(err, nbd.ErrServerClosed) {
		t.Errorf("Serve returned %v, want ErrServerClosed", err)
	}
	ts.done = nil
}

type testWriter struct{ t testing.TB }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(string(p))
	return len(p), nil
}

// connSet is the server's connections that are open.
type connSet struct {
	mu sync.Mutex
	m  map[*serverConn]bool
}

// serverConn is the server's side of a connection, forgotten when closed.
type serverConn struct {
	net.Conn
	set  *connSet
	once sync.Once
}

// NetConn hands the server the connection beneath, whose writev the
// wrapper would hide.
func (c *serverConn) NetConn() net.Conn { return c.Conn }

func (c *serverConn) Close() error {
	c.once.Do(func() {
		c.set.mu.Lock()
		delete(c.set.m, c)
		c.set.mu.Unlock()
	})
	return c.Conn.Close()
}

type trackingListener struct {
	net.Listener
	set *connSet
}

func (l *trackingListener) Accept() (net.Conn, error) {
	nc, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	c := &serverConn{Conn: nc, set: l.set}
	l.set.mu.Lock()
	l.set.m[c] = true
	l.set.mu.Unlock()
	return c, nil
}

// dropServerConns closes the server's side of every connection but those
// in keep, as a server that loses its sockets would: the kernel reads
// end-of-file and marks the connections dead. It returns how many it
// closed.
func dropServerConns(ts *testServer, keep ...map[*serverConn]bool) int {
	var drop []*serverConn
	ts.conns.mu.Lock()
	for c := range ts.conns.m {
		if len(keep) == 0 || !keep[0][c] {
			drop = append(drop, c)
		}
	}
	ts.conns.mu.Unlock()
	for _, c := range drop {
		c.Close()
	}
	return len(drop)
}

// serverConns returns the server's connections now.
func serverConns(ts *testServer) map[*serverConn]bool {
	ts.conns.mu.Lock()
	defer ts.conns.mu.Unlock()
	m := make(map[*serverConn]bool, len(ts.conns.m))
	for c := range ts.conns.m {
		m[c] = true
	}
	return m
}
