package nbd

import (
	"crypto/tls"
	"crypto/x509"
	"net"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"github.com/gzramd/gzramd/internal/testpki"
)

// Every bad input of issue 40 is refused and leaves nothing behind: no
// goroutine, no connection counted, no payload buffer held or made, and
// the connection's budget, cache and reserve back to nothing (the reserve
// unmapped). The one connection that gets through (a second STARTTLS is
// only refused) reads and writes from its reserve before it leaves.
func TestTLSBadInputLeaksNothing(t *testing.T) {
	p := newPKI(t)
	opts := Options{ReserveBuffers: 1 << 20, HandshakeTimeout: 300 * time.Millisecond}
	anyClient := startTLSServer(t, p.files, opts)
	mutual := p.files
	mutual.CA = filepath.Join(p.dir, "ca.pem")
	certified := startTLSServer(t, mutual, opts)

	other, err := testpki.NewCA("another CA")
	if err != nil {
		t.Fatal(err)
	}
	old, err := p.ca.Issue("old", nil, x509.ExtKeyUsageClientAuth, time.Now().Add(-48*time.Hour), time.Now().Add(-time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	expired, err := tls.X509KeyPair(old.CertPEM, old.KeyPEM)
	if err != nil {
		t.Fatal(err)
	}
	// refusedAtTLS runs a client with conf whose certificate the server
	// refuses: in TLS 1.3 its handshake may end before the server checks
	// the certificate, so the refusal may come with the first read.
	refusedAtTLS := func(conf *tls.Config) func(*testing.T, net.Conn) {
		return func(t *testing.T, nc net.Conn) {
			tc, err := startTLS(t, nc, conf)
			if err == nil {
				err = goExport(tc)
			}
			if err == nil {
				t.Fatal("the client got in")
			}
			expectClosed(t, nc)
		}
	}
	// halfHello starts TLS and sends the first bytes of a ClientHello.
	halfHello := func(t *testing.T, nc net.Conn) {
		nc.Write(be.AppendUint32(nil, clientFlagFixed))
		nc.Write(option(optStartTLS, nil))
		expectOptReply(t, nc, optStartTLS, repAck)
		nc.Write([]byte{0x16, 0x03, 0x01, 0x01, 0x00, 0x01})
	}

	for _, tc := range []struct {
		name string
		s    *tlsServer
		run  func(*testing.T, net.Conn)
	}{
		{"plain client", anyClient, func(t *testing.T, nc net.Conn) {
			nc.Write(be.AppendUint32(nil, clientFlagFixed|clientFlagNoZeroes))
			nc.Write(option(optGo, goData("d")))
			expectOptReply(t, nc, optGo, repErrTLSReqd)
			nc.Write(option(optExportName, []byte("d")))
			expectClosed(t, nc)
		}},
		{"plain client that gives up", anyClient, func(t *testing.T, nc net.Conn) {
			nc.Write(be.AppendUint32(nil, clientFlagFixed|clientFlagNoZeroes))
			nc.Write(option(optInfo, goData("d")))
			expectOptReply(t, nc, optInfo, repErrTLSReqd)
			nc.Write(option(optAbort, nil))
			expectOptReply(t, nc, optAbort, repAck)
			expectClosed(t, nc)
		}},
		{"no certificate", certified, refusedAtTLS(p.clientConf())},
		{"expired certificate", certified, refusedAtTLS(p.clientConf(expired))},
		{"certificate of another CA", certified, refusedAtTLS(p.clientConf(clientCert(t, other, "mallory")))},
		{"TLS handshake cut off", anyClient, func(t *testing.T, nc net.Conn) {
			halfHello(t, nc)
			nc.Close()
		}},
		{"TLS handshake stalled", anyClient, func(t *testing.T, nc net.Conn) {
			halfHello(t, nc)
			expectClosed(t, nc)
		}},
		{"TLS handshake of garbage", anyClient, func(t *testing.T, nc net.Conn) {
			nc.Write(be.AppendUint32(nil, clientFlagFixed))
			nc.Write(option(optStartTLS, nil))
			expectOptReply(t, nc, optStartTLS, repAck)
			nc.Write([]byte("GET / HTTP/1.0\r\n\r\n"))
			expectClosed(t, nc)
		}},
		{"STARTTLS twice before its reply", anyClient, func(t *testing.T, nc net.Conn) {
			nc.Write(be.AppendUint32(nil, clientFlagFixed))
			nc.Write(append(option(optStartTLS, nil), option(optStartTLS, nil)...))
			expectClosed(t, nc)
		}},
		{"STARTTLS twice", anyClient, func(t *testing.T, nc net.Conn) {
			tc, err := startTLS(t, nc, p.clientConf())
			if err != nil {
				t.Fatal(err)
			}
			tc.Write(option(optStartTLS, nil))
			expectOptReply(t, tc, optStartTLS, repErrInvalid)
			if err := goExport(tc); err != nil {
				t.Fatal(err)
			}
			tc.SetDeadline(time.Time{})
			c := &rawClient{t: t, nc: tc}
			c.roundTrip(0)
			c.send(CmdDisc, 0, 0, 0, 0, nil)
			expectClosed(t, tc)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := tc.s
			base := runtime.NumGoroutine()
			made := s.srv.PayloadBuffersAllocated()
			nc := s.dialGreeted(t)
			c := onlyConn(t, s.srv)
			tc.run(t, nc)
			nc.Close()

			waitFor(t, "the connection forgotten", func() bool {
				s.srv.mu.Lock()
				defer s.srv.mu.Unlock()
				return len(s.srv.conns) == 0 && s.srv.others == 0
			})
			checkGoroutines(t, base)
			c.payload.mu.Lock()
			used, reserved, cached, region := c.payload.used, c.payload.reserveUsed, c.payload.cached, c.payload.region
			c.payload.mu.Unlock()
			if used != 0 || reserved != 0 || cached != 0 || region != nil {
				t.Errorf("the closed connection holds %d bytes of buffers, %d of its reserve, %d cached, and a reserve of %d bytes mapped; want none",
					used, reserved, cached, len(region))
			}
			if n := s.srv.bufBytes.Load(); n != 0 {
				t.Errorf("requests hold %d bytes of payload buffers, want 0", n)
			}
			if n := s.srv.PayloadBuffersAllocated() - made; n != 0 {
				t.Errorf("%d payload buffers allocated, want none", n)
			}
			if n := s.logs.count("not all back"); n != 0 {
				t.Errorf("%d lines for a reserve left mapped", n)
			}
		})
	}
}

// onlyConn returns the one connection srv has open.
func onlyConn(t *testing.T, srv *Server) *conn {
	t.Helper()
	srv.mu.Lock()
	defer srv.mu.Unlock()
	if len(srv.conns) != 1 {
		t.Fatalf("%d connections open, want 1", len(srv.conns))
	}
	for c := range srv.conns {
		return c
	}
	return nil
}
