package nbd

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/gzramd/gzramd/internal/testpki"
	"github.com/gzramd/gzramd/pkg/nbd/nbdtest"
)

// tlsPKI is a CA with a server certificate for loopback, written to a
// temporary directory as the server reads them.
type tlsPKI struct {
	dir   string
	ca    *testpki.CA
	files TLSFiles // Cert and Key; CA left to the test
}

func newPKI(t testing.TB) *tlsPKI {
	t.Helper()
	dir := t.TempDir()
	ca, err := testpki.NewCA("gzramd test CA")
	if err != nil {
		t.Fatal(err)
	}
	p := &tlsPKI{dir: dir, ca: ca}
	p.issueServer(t, "server-1")
	if err := testpki.WriteFile(filepath.Join(dir, "ca.pem"), ca.PEM); err != nil {
		t.Fatal(err)
	}
	return p
}

// issueServer writes a new server certificate named name over the
// server's files.
func (p *tlsPKI) issueServer(t testing.TB, name string) {
	t.Helper()
	leaf, err := p.ca.Server(name, "127.0.0.1", "::1", "localhost")
	if err != nil {
		t.Fatal(err)
	}
	if p.files.Cert, p.files.Key, err = leaf.Write(p.dir, "server-cert.pem", "server-key.pem"); err != nil {
		t.Fatal(err)
	}
}

// clientCert returns a client certificate that ca signed.
func clientCert(t testing.TB, ca *testpki.CA, name string) tls.Certificate {
	t.Helper()
	leaf, err := ca.Client(name)
	if err != nil {
		t.Fatal(err)
	}
	c, err := tls.X509KeyPair(leaf.CertPEM, leaf.KeyPEM)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// tlsServer is a Server whose loopback TCP listener requires TLS.
type tlsServer struct {
	*testServer
	addr string
	logs *logBuffer
	mem  *nbdtest.MemBackend
}

func startTLSServer(t testing.TB, files TLSFiles, opts Options) *tlsServer {
	t.Helper()
	logs := &logBuffer{}
	opts.Logger = slog.New(slog.NewTextHandler(io.MultiWriter(logs, testLog(t)), nil))
	conf, err := files.Config(opts.Logger)
	if err != nil {
		t.Fatal(err)
	}
	mem := nbdtest.NewMemBackend(8 << 20)
	ts := startServer(t, []Export{{Name: "d", Backend: mem}}, opts)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go ts.srv.ServeTLS(l, conf)
	return &tlsServer{testServer: ts, addr: l.Addr().String(), logs: logs, mem: mem}
}

// testLog is where a test server's log lines go besides the test's own
// buffer: the test's log with -v, nowhere without.
func testLog(t testing.TB) io.Writer {
	if testing.Verbose() {
		return testWriter{t}
	}
	return io.Discard
}

// dialGreeted dials the TLS server and reads its greeting.
func (s *tlsServer) dialGreeted(t testing.TB) net.Conn {
	t.Helper()
	nc, err := net.Dial("tcp", s.addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nc.Close() })
	nc.SetDeadline(time.Now().Add(10 * time.Second))
	var g [18]byte
	if _, err := io.ReadFull(nc, g[:]); err != nil {
		t.Fatal(err)
	}
	if be.Uint64(g[:]) != magicInit || be.Uint64(g[8:]) != magicOption {
		t.Fatalf("greeting %x", g)
	}
	return nc
}

// expectOptReply reads the reply to opt and checks its type.
func expectOptReply(t testing.TB, r io.Reader, opt, want uint32) []byte {
	t.Helper()
	typ, data, err := readOptReply(r, opt)
	if err != nil {
		t.Fatalf("option %d: %v", opt, err)
	}
	if typ != want {
		t.Fatalf("option %d: reply %#x (%q), want %#x", opt, typ, data, want)
	}
	return data
}

// startTLS sends the client flags and NBD_OPT_STARTTLS on nc, and runs the
// client's TLS handshake with conf.
func startTLS(t testing.TB, nc net.Conn, conf *tls.Config) (*tls.Conn, error) {
	t.Helper()
	nc.Write(be.AppendUint32(nil, clientFlagFixed|clientFlagNoZeroes))
	nc.Write(option(optStartTLS, nil))
	expectOptReply(t, nc, optStartTLS, repAck)
	tc := tls.Client(nc, conf)
	return tc, tc.Handshake()
}

// goExport sends NBD_OPT_GO for export d over c and reads the replies to
// the acknowledgement.
func goExport(c net.Conn) error {
	if _, err := c.Write(option(optGo, goData("d"))); err != nil {
		return err
	}
	for {
		typ, data, err := readOptReply(c, optGo)
		if err != nil {
			return err
		}
		switch {
		case typ == repAck:
			return nil
		case typ&(1<<31) != 0:
			return &OptionError{Option: optGo, Reply: typ, Message: string(data)}
		}
	}
}

// clientConf trusts p's CA, and presents cert, if given, whatever the
// server asks for (crypto/tls would otherwise send none that the server's
// CAs did not sign).
func (p *tlsPKI) clientConf(cert ...tls.Certificate) *tls.Config {
	pool := x509.NewCertPool()
	pool.AddCert(p.ca.Cert)
	conf := &tls.Config{RootCAs: pool, ServerName: "127.0.0.1"}
	if len(cert) > 0 {
		conf.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return &cert[0], nil }
	}
	return conf
}

// dialTLS connects to the server over TLS and enters the transmission
// phase of export d.
func (s *tlsServer) dialTLS(t testing.TB, conf *tls.Config) (*rawClient, error) {
	t.Helper()
	nc := s.dialGreeted(t)
	tc, err := startTLS(t, nc, conf)
	if err != nil {
		return nil, err
	}
	if err := goExport(tc); err != nil {
		return nil, err
	}
	tc.SetDeadline(time.Time{})
	return &rawClient{t: t, nc: tc}, nil
}

// Before STARTTLS every option is refused with NBD_REP_ERR_TLS_REQD, and a
// plain client learns why; after it, haggling and transmission go over
// TLS, and a second STARTTLS is invalid.
func TestTLSStartTLS(t *testing.T) {
	base := runtime.NumGoroutine()
	p := newPKI(t)
	s := startTLSServer(t, p.files, Options{})

	nc := s.dialGreeted(t)
	nc.Write(be.AppendUint32(nil, clientFlagFixed|clientFlagNoZeroes))
	for _, o := range []struct {
		opt  uint32
		data []byte
	}{
		{optList, nil},
		{optInfo, goData("d")},
		{optGo, goData("d")},
		{optStructuredReply, nil},
		{99, []byte("junk")},
	} {
		nc.Write(option(o.opt, o.data))
		expectOptReply(t, nc, o.opt, repErrTLSReqd)
	}
	nc.Write(option(optStartTLS, []byte("x")))
	expectOptReply(t, nc, optStartTLS, repErrInvalid)
	nc.Write(option(optStartTLS, nil))
	expectOptReply(t, nc, optStartTLS, repAck)
	tc := tls.Client(nc, p.clientConf())
	if err := tc.Handshake(); err != nil {
		t.Fatal(err)
	}
	if v := tc.ConnectionState().Version; v != tls.VersionTLS13 {
		t.Errorf("TLS version %s, want TLS 1.3", tls.VersionName(v))
	}
	tc.Write(option(optStartTLS, nil))
	expectOptReply(t, tc, optStartTLS, repErrInvalid)
	tc.Write(option(optList, nil))
	expectOptReply(t, tc, optList, repServer)
	expectOptReply(t, tc, optList, repAck)
	if err := goExport(tc); err != nil {
		t.Fatal(err)
	}
	tc.SetDeadline(time.Time{})
	c := &rawClient{t: t, nc: tc}
	c.roundTrip(0)
	// Replies of several requests, large and small, gathered into records.
	big := bytes.Repeat([]byte("gzramd"), 300000)
	c.expect(0, CmdWrite, 0, 4096, uint32(len(big)), big)
	c.send(CmdRead, 0, 1, 4096, uint32(len(big)), nil)
	c.send(CmdRead, 0, 2, 0, 4096, nil)
	for range 2 {
		switch errno, cookie := c.recv(); {
		case errno != 0:
			t.Fatalf("read %d: errno %d", cookie, errno)
		case cookie == 1:
			if !bytes.Equal(c.recvData(len(big)), big) {
				t.Fatal("large read over TLS differs")
			}
		default:
			c.recvData(4096)
		}
	}
	c.send(CmdDisc, 0, 0, 0, 0, nil)
	expectClosed(t, tc)

	// A plain client is told TLS is required.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, _, err := Dial(ctx, "tcp", s.addr, "d")
	var oe *OptionError
	if !errors.As(err, &oe) || oe.Reply != repErrTLSReqd {
		t.Errorf("plain client to a TLS-only listener: %v, want NBD_REP_ERR_TLS_REQD", err)
	}

	s.shutdown(t)
	if n := s.logs.count(`msg="nbd: TLS client connected" remote=127.0.0.1`); n != 1 {
		t.Errorf("%d lines for the TLS client's connection, want 1", n)
	}
	if n := s.logs.count(`msg="nbd: TLS client disconnected" remote=127.0.0.1`); n != 1 {
		t.Errorf("%d lines for the TLS client's leaving, want 1", n)
	}
	checkGoroutines(t, base)
}

// What the protocol says ends a connection before TLS does end it:
// NBD_OPT_EXPORT_NAME, which cannot be refused; a client without fixed
// newstyle, which could never start TLS; bytes sent behind STARTTLS
// before its reply, which would come through in the clear. NBD_OPT_ABORT
// is acknowledged.
func TestTLSDropsBeforeTLS(t *testing.T) {
	base := runtime.NumGoroutine()
	p := newPKI(t)
	s := startTLSServer(t, p.files, Options{})

	nc := s.dialGreeted(t)
	nc.Write(be.AppendUint32(nil, clientFlagFixed|clientFlagNoZeroes))
	nc.Write(option(optExportName, []byte("d")))
	expectClosed(t, nc)

	nc = s.dialGreeted(t)
	nc.Write(be.AppendUint32(nil, clientFlagFixed))
	nc.Write(option(optList, nil))
	expectOptReply(t, nc, optList, repErrTLSReqd)
	nc.Write(option(optExportName, nil))
	expectClosed(t, nc)

	nc = s.dialGreeted(t)
	nc.Write(be.AppendUint32(nil, 0))
	expectClosed(t, nc)

	nc = s.dialGreeted(t)
	nc.Write(append(be.AppendUint32(nil, clientFlagFixed), append(option(optStartTLS, nil), option(optList, nil)...)...))
	expectClosed(t, nc)

	nc = s.dialGreeted(t)
	nc.Write(be.AppendUint32(nil, clientFlagFixed))
	nc.Write(option(optAbort, nil))
	expectOptReply(t, nc, optAbort, repAck)
	expectClosed(t, nc)

	s.shutdown(t)
	checkGoroutines(t, base)
}

// A TLS handshake counts against the handshake timeout: a client that
// sends STARTTLS and nothing more is closed, and counted.
func TestTLSHandshakeTimeout(t *testing.T) {
	base := runtime.NumGoroutine()
	p := newPKI(t)
	s := startTLSServer(t, p.files, Options{HandshakeTimeout: 200 * time.Millisecond})
	nc := s.dialGreeted(t)
	nc.Write(be.AppendUint32(nil, clientFlagFixed))
	nc.Write(option(optStartTLS, nil))
	expectOptReply(t, nc, optStartTLS, repAck)
	start := time.Now()
	expectClosed(t, nc)
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("closed after %v, want about the 200ms handshake timeout", d)
	}
	waitFor(t, "the timeout counted", func() bool { return s.srv.HandshakeTimeouts() == 1 })

	// Half a ClientHello, then nothing.
	nc = s.dialGreeted(t)
	nc.Write(be.AppendUint32(nil, clientFlagFixed))
	nc.Write(option(optStartTLS, nil))
	expectOptReply(t, nc, optStartTLS, repAck)
	nc.Write([]byte{0x16, 0x03, 0x01, 0x01, 0x00, 0x01})
	expectClosed(t, nc)
	waitFor(t, "the timeout counted", func() bool { return s.srv.HandshakeTimeouts() == 2 })

	s.shutdown(t)
	checkGoroutines(t, base)
}

// With a CA, only clients with a certificate it signed get past the TLS
// handshake; the log names each by its certificate's subject.
func TestTLSMutual(t *testing.T) {
	base := runtime.NumGoroutine()
	p := newPKI(t)
	p.files.CA = filepath.Join(p.dir, "ca.pem")
	s := startTLSServer(t, p.files, Options{})

	other, err := testpki.NewCA("another CA")
	if err != nil {
		t.Fatal(err)
	}
	expired, err := p.ca.Issue("old", nil, x509.ExtKeyUsageClientAuth, time.Now().Add(-48*time.Hour), time.Now().Add(-time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	expiredCert, err := tls.X509KeyPair(expired.CertPEM, expired.KeyPEM)
	if err != nil {
		t.Fatal(err)
	}
	tls12 := p.clientConf()
	tls12.MaxVersion = tls.VersionTLS12
	// In TLS 1.3 the client's handshake ends before the server checks
	// its certificate: the refusal comes with the first read.
	for _, tc := range []struct {
		name string
		conf *tls.Config
		log  string
	}{
		{"no certificate", p.clientConf(), "client didn't provide a certificate"},
		{"a certificate of another CA", p.clientConf(clientCert(t, other, "mallory")), "certificate signed by unknown authority"},
		{"an expired certificate", p.clientConf(expiredCert), "certificate has expired"},
		{"TLS 1.2, no certificate", tls12, "client didn't provide a certificate"},
	} {
		before := s.logs.count(tc.log)
		if _, err := s.dialTLS(t, tc.conf); err == nil {
			t.Errorf("client with %s got in", tc.name)
		}
		waitFor(t, "the refusal logged", func() bool { return s.logs.count(tc.log) > before })
	}

	c, err := s.dialTLS(t, p.clientConf(clientCert(t, p.ca, "host-a")))
	if err != nil {
		t.Fatal(err)
	}
	c.roundTrip(4096)
	data := s.mem.Snapshot()[4096:8192]
	if !bytes.Equal(data, bytes.Repeat([]byte{1, 0x5a}, 2048)) { // roundTrip's pattern
		t.Error("the write over TLS did not reach the backend")
	}
	c.send(CmdDisc, 0, 0, 0, 0, nil)
	expectClosed(t, c.nc)

	s.shutdown(t)
	if n := s.logs.count(`msg="nbd: TLS client connected" remote=127.0.0.1`); n != 1 {
		t.Errorf("%d connected lines, want 1 (the refused clients never connect)", n)
	}
	if n := s.logs.count(`msg="nbd: TLS client disconnected" remote=127.0.0.1`); n != 1 {
		t.Errorf("%d disconnected lines, want 1", n)
	}
	if n := s.logs.count("client=host-a"); n != 2 {
		t.Errorf("%d lines name client host-a, want 2 (connected, disconnected)", n)
	}
	if n := s.logs.count("handshake failed"); n != 4 {
		t.Errorf("%d refused handshakes logged, want 4", n)
	}
	checkGoroutines(t, base)
}

// Certificates rotated on disk serve the next connection, without a
// signal; those that do not load leave the last good ones in use; an open
// connection keeps its session.
func TestTLSRotation(t *testing.T) {
	base := runtime.NumGoroutine()
	p := newPKI(t)
	s := startTLSServer(t, p.files, Options{})

	serverName := func() (string, *rawClient) {
		t.Helper()
		c, err := s.dialTLS(t, p.clientConf())
		if err != nil {
			t.Fatal(err)
		}
		return c.nc.(*tls.Conn).ConnectionState().PeerCertificates[0].Subject.CommonName, c
	}
	name, first := serverName()
	if name != "server-1" {
		t.Fatalf("server certificate %q, want server-1", name)
	}

	p.issueServer(t, "server-2") // renamed over the old files
	if name, _ = serverName(); name != "server-2" {
		t.Errorf("after a rotation by rename: %q, want server-2", name)
	}
	first.roundTrip(0)

	// Rewritten in place, key first: the key alone does not match the
	// certificate, and the connection meanwhile gets the old pair.
	leaf, err := p.ca.Server("server-3", "127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p.files.Key, leaf.KeyPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if name, _ = serverName(); name != "server-2" {
			t.Errorf("with a new key and the old certificate: %q, want server-2 still", name)
		}
	}
	if n := s.logs.count("do not load"); n != 1 {
		t.Errorf("%d lines for the credentials that do not load, want 1 (once per change)", n)
	}
	if err := os.WriteFile(p.files.Cert, leaf.CertPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	if name, _ = serverName(); name != "server-3" {
		t.Errorf("after a rotation in place: %q, want server-3", name)
	}
	if n := s.logs.count("TLS credentials reloaded"); n != 2 {
		t.Errorf("%d reloads logged, want 2", n)
	}
	first.roundTrip(8192)

	s.shutdown(t)
	checkGoroutines(t, base)
}

// An upgrade hands plain connections over and closes TLS ones: their
// keys must not leave the process.
func TestTLSNotHandedOver(t *testing.T) {
	p := newPKI(t)
	s := startTLSServer(t, p.files, Options{})
	c, err := s.dialTLS(t, p.clientConf())
	if err != nil {
		t.Fatal(err)
	}
	c.roundTrip(0)
	plain := dialRaw(t, s.testServer, "d")
	plain.roundTrip(4096)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	handed, err := s.srv.HandOver(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, h := range handed {
		h.File.Close()
	}
	if len(handed) != 1 {
		t.Fatalf("%d connections handed over, want 1 (the plain one)", len(handed))
	}
	if _, ok := handed[0].Conn.(*net.UnixConn); !ok {
		t.Errorf("handed over a %T, want the Unix socket's", handed[0].Conn)
	}
	expectClosed(t, c.nc)
	if n := s.logs.count("closing the TLS connections instead of handing them over"); n != 1 {
		t.Errorf("%d lines for the TLS connections closed, want 1", n)
	}
}

// The credentials are checked at load, and an error names the file at
// fault and why.
func TestTLSFilesErrors(t *testing.T) {
	p := newPKI(t)
	dir := p.dir
	other, err := p.ca.Server("other", "127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	otherCert, otherKey, err := other.Write(dir, "other-cert.pem", "other-key.pem")
	if err != nil {
		t.Fatal(err)
	}
	expired, err := p.ca.Issue("old", nil, x509.ExtKeyUsageServerAuth, time.Now().Add(-48*time.Hour), time.Now().Add(-time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	expiredCert, expiredKey, err := expired.Write(dir, "old-cert.pem", "old-key.pem")
	if err != nil {
		t.Fatal(err)
	}
	garbage := filepath.Join(dir, "garbage.pem")
	os.WriteFile(garbage, []byte("-----BEGIN CERTIFICATE-----\nbm90IGEgY2VydGlmaWNhdGU=\n-----END CERTIFICATE-----\n"), 0o600)
	empty := filepath.Join(dir, "empty.pem")
	os.WriteFile(empty, []byte("nothing here\n"), 0o600)
	missing := filepath.Join(dir, "missing.pem")

	for _, tc := range []struct {
		files TLSFiles
		want  []string
	}{
		{TLSFiles{Cert: missing, Key: p.files.Key}, []string{"reading the TLS certificate", missing, "no such file"}},
		{TLSFiles{Cert: p.files.Cert, Key: missing}, []string{"reading the TLS key", missing}},
		{TLSFiles{Cert: p.files.Cert, Key: otherKey}, []string{p.files.Cert, otherKey, "does not match"}},
		{TLSFiles{Cert: empty, Key: otherKey}, []string{empty, "certificate"}},
		{TLSFiles{Cert: otherCert, Key: empty}, []string{empty, "key"}},
		{TLSFiles{Cert: expiredCert, Key: expiredKey}, []string{expiredCert, "expired on"}},
		{TLSFiles{Cert: otherCert, Key: otherKey, CA: garbage}, []string{"CA bundle", garbage, "certificate 1"}},
		{TLSFiles{Cert: otherCert, Key: otherKey, CA: empty}, []string{"CA bundle", empty, "no PEM certificate"}},
		{TLSFiles{Cert: otherCert, Key: otherKey, CA: missing}, []string{"CA bundle", missing}},
	} {
		_, err := tc.files.Config(nil)
		if err == nil {
			t.Errorf("%+v: loaded", tc.files)
			continue
		}
		for _, w := range tc.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%+v: %v; want it to say %q", tc.files, err, w)
			}
		}
	}
	if _, err := (TLSFiles{Cert: otherCert, Key: otherKey, CA: filepath.Join(dir, "ca.pem")}).Config(nil); err != nil {
		t.Error(err)
	}
}

// Before TLS, whatever the client sends, the server answers only
// NBD_REP_ERR_TLS_REQD, STARTTLS's and ABORT's replies; nothing about the
// exports goes out in the clear, and after the STARTTLS acknowledgement
// only TLS records do.
func FuzzHandshakeTLS(f *testing.F) {
	flags := be.AppendUint32(nil, clientFlagFixed|clientFlagNoZeroes)
	cat := func(b ...[]byte) []byte { return bytes.Join(b, nil) }
	f.Add(cat(flags, option(optList, nil), option(optGo, goData("d"))))
	f.Add(cat(flags, option(optInfo, goData("d", infoName)), option(optExportName, []byte("d"))))
	f.Add(cat(flags, option(optStartTLS, []byte("x")), option(optAbort, nil)))
	f.Add(cat(flags, option(optStartTLS, nil)))
	f.Add(cat(flags, option(optStartTLS, nil), []byte{0x16, 0x03, 0x01, 0x00, 0x05, 1, 2, 3, 4, 5}))
	f.Add(cat(be.AppendUint32(nil, 0), option(optStartTLS, nil)))
	p := newPKI(f)
	conf, err := p.files.Config(nil)
	if err != nil {
		f.Fatal(err)
	}
	srv := fuzzServer(f)
	f.Fuzz(func(t *testing.T, in []byte) {
		sc := &scriptConn{r: bytes.NewReader(in)}
		c := newConn(srv, sc)
		c.tlsConfig = conf
		srv.mu.Lock()
		srv.conns[c] = struct{}{}
		srv.connWG.Add(1)
		srv.mu.Unlock()
		c.serve()
		out := sc.out.Bytes()
		if len(out) < 18 || be.Uint64(out) != magicInit {
			t.Fatalf("no greeting: %x", out)
		}
		out = out[18:]
		for len(out) >= 20 && be.Uint64(out) == magicOptionReply {
			opt, typ, n := be.Uint32(out[8:]), be.Uint32(out[12:]), be.Uint32(out[16:])
			if uint32(len(out)-20) < n {
				t.Fatalf("option reply claims %d bytes, %d left", n, len(out)-20)
			}
			out = out[20+n:]
			switch {
			case typ == repErrTLSReqd && opt != optStartTLS && opt != optAbort:
			case opt == optStartTLS && typ == repErrInvalid:
			case opt == optAbort && typ == repAck:
			case opt == optStartTLS && typ == repAck:
				// What follows is TLS: records of type alert (21) or
				// handshake (22), if anything.
				if len(out) > 0 && out[0] != 21 && out[0] != 22 {
					t.Fatalf("after STARTTLS's acknowledgement, %x", out)
				}
				return
			default:
				t.Fatalf("before TLS: reply %#x to option %d", typ, opt)
			}
		}
		if len(out) > 0 {
			t.Fatalf("before TLS: %d bytes that are no option reply: %x", len(out), out)
		}
	})
}
