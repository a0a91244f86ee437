// The daemon's listeners: NBD's (--socket, --tcp) and the HTTP endpoint's.

package serving

import (
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/gzramd/gzramd/pkg/metrics"
	"github.com/gzramd/gzramd/pkg/nbd"
	"github.com/gzramd/gzramd/pkg/swapctl"
)

// listeners owns the daemon's listening sockets, from listen until the
// daemon closes them: the NBD ones, the TCP one's TLS, and the HTTP
// server of --metrics, which a stop or a handover shuts down.
type listeners struct {
	cfg *Config
	log *slog.Logger
	srv *nbd.Server
	// diedAt is when the serving process before this one died (zero
	// without a death), and recovered whether this one took the device
	// over: both change what a listener that fails to open means.
	diedAt    time.Time
	recovered bool

	nbd    []net.Listener
	tcpTLS *tls.Config // the TCP listener's, with --tls-cert
	http   *http.Server
}

// serve opens the listeners and serves NBD on each, its connections
// tracked by tracker; /metrics serves reg and /status status. The channel
// gets the error that ends serving on one.
func (ls *listeners) serve(tracker *swapctl.Tracker, reg *prometheus.Registry, status http.HandlerFunc) (<-chan error, error) {
	if err := ls.listen(reg, status); err != nil {
		return nil, err
	}
	errc := make(chan error, len(ls.nbd))
	for _, l := range ls.nbd {
		l := tracker.Wrap(l)
		go func() {
			if err := ls.serveNBD(l); err != nil && !errors.Is(err, nbd.ErrServerClosed) {
				errc <- fmt.Errorf("serving on %s: %w", l.Addr(), err)
			}
		}()
		ls.log.Info("serving NBD", "addr", l.Addr().String(), "network", l.Addr().Network(), "export", ls.cfg.Export,
			"tls", ls.tcpTLS != nil && l.Addr().Network() == "tcp")
	}
	return errc, nil
}

// close closes the NBD listeners.
func (ls *listeners) close() {
	for _, l := range ls.nbd {
		l.Close()
	}
}

// listen opens the listeners the configuration asks for, and starts the
// HTTP endpoint on its own.
func (ls *listeners) listen(reg *prometheus.Registry, status http.HandlerFunc) error {
	cfg := ls.cfg
	if cfg.Socket != "" {
		l, err := ls.retryListen(func() (net.Listener, error) { return listenUnix(cfg.Socket) })
		if err != nil {
			return err
		}
		ls.nbd = append(ls.nbd, l)
	}
	if cfg.TCP != "" {
		conf, serve, err := ls.loadTLS()
		if err != nil {
			return err
		}
		if serve {
			addr := TCPAddr(cfg.TCP)
			l, err := ls.retryListen(func() (net.Listener, error) { return net.Listen("tcp", addr) })
			if err != nil {
				return fmt.Errorf("listening on --tcp %s: %w", addr, err)
			}
			if ip := l.Addr().(*net.TCPAddr).IP; !ip.IsLoopback() && conf == nil {
				ls.log.Warn("serving NBD beyond loopback without TLS (--tcp-insecure): anyone who can reach this address can read and write the device", "addr", l.Addr())
			}
			ls.tcpTLS = conf
			ls.nbd = append(ls.nbd, l)
		}
	}
	if cfg.Metrics != "" {
		l, err := ls.retryListen(func() (net.Listener, error) { return net.Listen("tcp", cfg.Metrics) })
		if err != nil {
			return fmt.Errorf("listening on --metrics %s: %w", cfg.Metrics, err)
		}
		mux := http.NewServeMux()
		mux.Handle("GET /metrics", metrics.Handler(reg, ls.log))
		mux.HandleFunc("GET /status", status)
		ls.http = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
		go func() {
			if err := ls.http.Serve(l); err != nil && !errors.Is(err, http.ErrServerClosed) {
				ls.log.Error("metrics endpoint stopped", "err", err)
			}
		}()
		ls.log.Info("serving metrics", "url", "http://"+l.Addr().String()+"/metrics")
	}
	return nil
}

// takeoverListenWait bounds how long a process taking the device over
// after a death waits for the dead one's addresses: its listeners stay
// open until its teardown ends, which a CUDA context's makes 100 ms or
// more, and the supervisor cannot always shut them first (issue 35's
// takeovers that found the metrics port taken).
const takeoverListenWait = 10 * time.Second

// errServedThere is listenUnix's answer for a socket some process
// accepts on.
var errServedThere = errors.New("another daemon is already serving there")

// retryListen returns listen's listener. In a process that takes the
// device over after a death, it tries again while the address is taken,
// for up to takeoverListenWait: failing would leave the kernel device
// without a server for another start.
func (ls *listeners) retryListen(listen func() (net.Listener, error)) (net.Listener, error) {
	start := time.Now()
	wait := time.Millisecond
	for {
		l, err := listen()
		taken := errors.Is(err, syscall.EADDRINUSE) || errors.Is(err, errServedThere)
		if err == nil || !taken || ls.diedAt.IsZero() || time.Since(start) > takeoverListenWait {
			if wait > time.Millisecond {
				ls.log.Info("waited for an address the process before still held", "took", time.Since(start).Round(time.Millisecond), "err", err)
			}
			return l, err
		}
		time.Sleep(wait)
		wait = min(2*wait, 100*time.Millisecond)
	}
}

// listenUnix listens on path with mode 0600, replacing a stale socket left
// by a daemon that died, but never a live one. Its directory is there
// already: cmd/gzramd creates the default's, and only that.
func listenUnix(path string) (net.Listener, error) {
	if c, err := net.Dial("unix", path); err == nil {
		c.Close()
		return nil, fmt.Errorf("--socket %s: %w", path, errServedThere)
	}
	if fi, err := os.Lstat(path); err == nil {
		if fi.Mode()&os.ModeSocket == 0 {
			return nil, fmt.Errorf("--socket %s exists and is not a socket", path)
		}
		os.Remove(path)
	}
	old := syscall.Umask(0o177)
	l, err := net.Listen("unix", path)
	syscall.Umask(old)
	if err != nil {
		return nil, fmt.Errorf("listening on --socket %s: %w", path, err)
	}
	l.(*net.UnixListener).SetUnlinkOnClose(true)
	return l, nil
}
