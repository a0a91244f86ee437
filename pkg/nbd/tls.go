// TLS: NBD_OPT_STARTTLS in the handshake, and a listener that requires it.

package nbd

import (
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"sync"
)

// tlsRecordSize is the most plaintext one TLS record carries. Replies to
// a TLS client are gathered into a buffer of this size: crypto/tls writes
// each Write as records of their own, so a reply's header and payload
// written apart would cost a record and a system call each.
const tlsRecordSize = 16 << 10

// tlsGatherSize is how many bytes of records a connection's replies
// gather into one write: 8 full records and their overheads. crypto/tls
// makes each record a system call of its own, and on loopback a system
// call that sends also wakes the client: a batch of replies that plain
// TCP sends in one writev would otherwise take one write per 16 KiB.
const tlsGatherSize = 8 * (tlsRecordSize + 256)

// ServeTLS is Serve for a listener whose clients must speak TLS: the
// protocol's FORCEDTLS mode. A client upgrades with NBD_OPT_STARTTLS and
// a TLS handshake on the same socket, after which the handshake's
// remaining options and the transmission phase go over TLS. Before that,
// every option but NBD_OPT_STARTTLS and NBD_OPT_ABORT is refused with
// NBD_REP_ERR_TLS_REQD, and NBD_OPT_EXPORT_NAME, which cannot be refused,
// drops the connection. The TLS handshake counts against
// Options.HandshakeTimeout like the rest of the negotiation.
//
// config must not be modified after the call. Its MinVersion should be
// TLS 1.2 or later (Go's default for servers), as the protocol asks, and
// DynamicRecordSizingDisabled set (TLSFiles.Config's are), so that a
// reply of up to 16 KiB is one record from a connection's start.
// Clients the certificate checks of config refuse are dropped.
//
// Connections served over TLS are never handed over (HandOver closes
// them): the session's keys live in this process, and passing them on
// would pass secrets.
func (s *Server) ServeTLS(l net.Listener, config *tls.Config) error {
	if config == nil {
		return errors.New("nbd: ServeTLS with a nil tls.Config")
	}
	return s.serve(l, config)
}

// requireTLS answers option opt, with data, sent before the client
// started TLS on a listener that requires it. An error means the
// connection must be dropped.
func (c *conn) requireTLS(opt uint32, data []byte) error {
	switch opt {
	case optStartTLS:
		if len(data) != 0 {
			return c.optError(opt, repErrInvalid, "NBD_OPT_STARTTLS takes no data")
		}
		return c.startTLS()
	case optAbort:
		_ = c.optReply(opt, repAck, nil)
		return errAbort
	case optExportName:
		// It cannot be refused politely: the spec says to drop.
		return errors.New("NBD_OPT_EXPORT_NAME before NBD_OPT_STARTTLS on a listener that requires TLS")
	}
	return c.optError(opt, repErrTLSReqd, "this server requires TLS: send NBD_OPT_STARTTLS first")
}

// startTLS acknowledges NBD_OPT_STARTTLS and runs the TLS handshake on the
// socket; from then on the connection reads and writes through TLS.
func (c *conn) startTLS() error {
	// A client must wait for the acknowledgement before it starts TLS.
	// Bytes already read were sent in the clear before it: neither part
	// of the TLS stream nor to be trusted as options after it.
	if n := c.br.Buffered(); n > 0 {
		return fmt.Errorf("client sent %d bytes after NBD_OPT_STARTTLS before the server's reply", n)
	}
	if err := c.optReply(optStartTLS, repAck, nil); err != nil {
		return err
	}
	// The socket's deadline, the handshake's, bounds the TLS handshake
	// too, and stop's wakes it.
	g := &recordGatherer{Conn: c.sock}
	tc := tls.Server(g, c.tlsConfig)
	if err := tc.Handshake(); err != nil {
		return fmt.Errorf("TLS handshake: %w", err)
	}
	c.tls, c.sock, c.replies.gather = tc, tc, g
	c.br.Reset(tc)
	st := tc.ConnectionState()
	name := clientName(st)
	c.srv.mu.Lock()
	c.client = name
	c.srv.mu.Unlock()
	c.srv.log.Info("nbd: TLS client connected", "remote", c.remote(), "client", c.client,
		"tls", tls.VersionName(st.Version), "cipher", tls.CipherSuiteName(st.CipherSuite))
	return nil
}

// clientName names the client by its certificate's subject: its common
// name, or the whole subject when it has none. Without a certificate
// (no --tls-ca: none is asked for) it is "anonymous".
func clientName(st tls.ConnectionState) string {
	if len(st.PeerCertificates) == 0 {
		return "anonymous"
	}
	subj := st.PeerCertificates[0].Subject
	if subj.CommonName != "" {
		return subj.CommonName
	}
	return subj.String()
}

// closeTLS ends the TLS session, if one started, with a close_notify
// alert (bounded by crypto/tls to 5s), and logs the client's leaving.
func (c *conn) closeTLS() {
	if c.tls == nil {
		return
	}
	c.tls.Close()
	c.srv.log.Info("nbd: TLS client disconnected", "remote", c.remote(), "client", c.client, "export", c.export)
}

// recordGatherer is the socket beneath a TLS session. Between start and
// flush, the records crypto/tls writes are gathered into one write of up
// to tlsGatherSize; otherwise each write goes straight to the socket, as
// the handshake's, alerts and close_notify must.
type recordGatherer struct {
	net.Conn
	// mu orders the replies' writer with a write the session's reader
	// makes (a TLS 1.3 KeyUpdate answered), which crypto/tls serializes
	// only against the records, not against flush.
	mu        sync.Mutex
	gathering bool
	buf       []byte // made with the transmission phase's other buffers
}

// start gathers the records written from now on.
func (g *recordGatherer) start() {
	g.mu.Lock()
	g.gathering = true
	g.mu.Unlock()
}

// flush writes the records gathered since start, and stops gathering.
func (g *recordGatherer) flush() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.gathering = false
	return g.flushLocked()
}

func (g *recordGatherer) flushLocked() error {
	if len(g.buf) == 0 {
		return nil
	}
	_, err := g.Conn.Write(g.buf)
	g.buf = g.buf[:0]
	return err
}

func (g *recordGatherer) Write(p []byte) (int, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if !g.gathering {
		return g.Conn.Write(p)
	}
	if len(g.buf)+len(p) > cap(g.buf) {
		if err := g.flushLocked(); err != nil {
			return 0, err
		}
		if len(p) > cap(g.buf) {
			return g.Conn.Write(p)
		}
	}
	g.buf = append(g.buf, p...)
	return len(p), nil
}
