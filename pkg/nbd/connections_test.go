package nbd

import (
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// Connections lists who is connected: each connection's transport and
// peer, the Unix peer's pid and uid, the TLS client's certificate name
// once its handshake is done, and whether it is the process's own; a
// connection refused at the limit or closed is not listed.
func TestConnectionsListed(t *testing.T) {
	p := newPKI(t)
	p.files.CA = filepath.Join(p.dir, "ca.pem")
	start := time.Now()
	s := startTLSServer(t, p.files, Options{MaxConnections: 2})
	plain, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go s.srv.Serve(plain)

	own := dialRaw(t, s.testServer, "d")
	own.roundTrip(0)
	tlsClient, err := s.dialTLS(t, p.clientConf(clientCert(t, p.ca, "host-a")))
	if err != nil {
		t.Fatal(err)
	}
	tlsClient.roundTrip(4096)
	tcp, err := net.Dial("tcp", plain.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer tcp.Close()
	waitFor(t, "three connections", func() bool { return len(s.srv.Connections()) == 3 })
	// Past the limit: refused, never listed.
	refused, err := net.Dial("tcp", plain.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer refused.Close()
	expectClosed(t, refused)

	conns := s.srv.Connections()
	if len(conns) != 3 {
		t.Fatalf("%d connections listed, want 3: %+v", len(conns), conns)
	}
	for i, c := range conns {
		if c.Since.Before(start) || c.Since.After(time.Now()) || i > 0 && c.Since.Before(conns[i-1].Since) {
			t.Errorf("connection %d since %v: not in order, or not between the test's start and now", i, c.Since)
		}
	}
	u, tl, pl := conns[0], conns[1], conns[2]
	if u.Transport != "unix" || !u.Own || u.PeerPID != os.Getpid() || u.PeerUID != os.Getuid() ||
		u.Client != "" || u.TLS || !strings.HasPrefix(u.Remote, "unix:") {
		t.Errorf("the own Unix connection is listed as %+v", u)
	}
	if tl.Transport != "tcp" || tl.Own || !tl.TLS || tl.Client != "host-a" || tl.PeerPID != 0 || tl.PeerUID != -1 ||
		tl.Remote != tlsClient.nc.LocalAddr().String() {
		t.Errorf("the TLS connection is listed as %+v", tl)
	}
	if pl.Transport != "tcp" || pl.Own || pl.TLS || pl.Client != "" || pl.Remote != tcp.LocalAddr().String() {
		t.Errorf("the plain TCP connection is listed as %+v", pl)
	}

	tcp.Close()
	tlsClient.nc.Close()
	waitFor(t, "the closed connections to go", func() bool { return len(s.srv.Connections()) == 1 })
	if c := s.srv.Connections()[0]; !c.Own {
		t.Errorf("left listed: %+v, want the own connection", c)
	}
}
