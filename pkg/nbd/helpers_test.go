package nbd

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"syscall"
	"testing"
	"time"

	"github.com/gzramd/gzramd/internal/testneeds"
)

// testServer is a Server listening on a unix socket in a temp dir.
type testServer struct {
	srv  *Server
	sock string
	done chan error
}

// quietLogger discards logs unless the test runs with -v.
func quietLogger(t testing.TB) *slog.Logger {
	if testing.Verbose() {
		return slog.New(slog.NewTextHandler(testWriter{t}, nil))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

type testWriter struct{ t testing.TB }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(string(p))
	return len(p), nil
}

func startServer(t testing.TB, exports []Export, opts Options) *testServer {
	t.Helper()
	if opts.Logger == nil {
		opts.Logger = quietLogger(t)
	}
	// The Makefile runs the package a second time with every server
	// inline, so that each test covers both ways of running requests.
	if inlineTests {
		opts.Inline = true
	}
	if inlineHelperTests {
		opts.InlineHelpers = 3
	}
	srv, err := NewServer(exports, opts)
	if err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(t.TempDir(), "nbd.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	ts := &testServer{srv: srv, sock: sock, done: make(chan error, 1)}
	go func() { ts.done <- srv.Serve(l) }()
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
	if err := <-ts.done; !errors.Is(err, ErrServerClosed) {
		t.Errorf("Serve returned %v, want ErrServerClosed", err)
	}
	ts.done = nil
	if n := ts.srv.bufBytes.Load(); n != 0 {
		t.Errorf("%d bytes of payload buffers still held after Shutdown", n)
	}
}

func (ts *testServer) uri(name string) string {
	return "nbd+unix:///" + name + "?socket=" + ts.sock
}

// checkGoroutines fails the test if the goroutine count does not return to
// base (allowing the runtime a moment to reap exiting goroutines).
func checkGoroutines(t testing.TB, base int) {
	t.Helper()
	var n int
	for i := 0; i < 200; i++ {
		n = runtime.NumGoroutine()
		if n <= base {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	buf := make([]byte, 1<<20)
	buf = buf[:runtime.Stack(buf, true)]
	t.Errorf("goroutines: %d, want <= %d\n%s", n, base, buf)
}

var errInjected = syscall.ENOSPC

// inlineTests makes every test server run requests inline (see
// startServer): NBD_TEST_INLINE=1 on the reader alone, =helpers with
// inline helpers as well.
var (
	inlineTests       = os.Getenv("NBD_TEST_INLINE") == "1" || inlineHelperTests
	inlineHelperTests = os.Getenv("NBD_TEST_INLINE") == "helpers"
)

// needsConcurrency skips a test about requests running at once on one
// connection, which an inline server does not do.
func needsConcurrency(t *testing.T) {
	if inlineTests {
		testneeds.Skip(t, testneeds.KindOptIn, "", "NBD_TEST_INLINE unset (make test's pass without it runs this): with it, requests on one connection do not all run at once")
	}
}
