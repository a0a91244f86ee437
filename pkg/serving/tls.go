// TLS on the TCP listener (--tls-cert, --tls-key, --tls-ca), and which
// --tcp addresses may do without it.

package serving

import (
	"crypto/tls"
	"fmt"
	"net"
	"strings"

	"github.com/gzramd/gzramd/pkg/nbd"
)

// TLSFiles returns the credentials of the TCP listener, and whether TLS is
// configured (--tls-cert given).
func (c *Config) TLSFiles() (nbd.TLSFiles, bool) {
	return nbd.TLSFiles{Cert: c.TLSCert, Key: c.TLSKey, CA: c.TLSCA}, c.TLSCert != ""
}

// LoopbackTCP reports whether the --tcp address addr (HOST:PORT) is
// reached from this machine only: a loopback IP, localhost, or a bare
// :PORT (TCPAddr binds it to loopback). Any other name, and 0.0.0.0 or ::,
// may be reached from the network.
func LoopbackTCP(addr string) bool {
	host, _, err := net.SplitHostPort(TCPAddr(addr))
	if err != nil {
		return false
	}
	if strings.EqualFold(strings.TrimSuffix(host, "."), "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// loadTLS loads the TCP listener's TLS credentials: nil, and serve true,
// without TLS. Credentials that do not load are an error at a fresh start.
// A serving process that took the device over (after a crash, or at an
// upgrade) must serve it whatever the files hold now: it logs why and
// leaves the TCP listener off (serve false), the Unix socket, which the
// kernel device uses, serving on.
func (ls *listeners) loadTLS() (conf *tls.Config, serve bool, err error) {
	files, ok := ls.cfg.TLSFiles()
	if !ok {
		return nil, true, nil
	}
	conf, err = files.Config(ls.log)
	switch {
	case err == nil:
		return conf, true, nil
	case ls.recovered:
		ls.log.Error("the TCP listener is off: its TLS credentials do not load; fix them and upgrade (SIGHUP to the supervisor) to serve it again",
			"tcp", ls.cfg.TCP, "err", err)
		return nil, false, nil
	}
	return nil, false, fmt.Errorf("--tls-cert, --tls-key, --tls-ca: %w", err)
}

// serveNBD serves the NBD listener l until the server stops: in TLS-only
// mode when it is the TCP listener and TLS is configured.
func (ls *listeners) serveNBD(l net.Listener) error {
	if ls.tcpTLS != nil && l.Addr().Network() == "tcp" {
		return ls.srv.ServeTLS(l, ls.tcpTLS)
	}
	return ls.srv.Serve(l)
}
