// The server side of the fixed-newstyle handshake.

package nbd

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
)

var be = binary.BigEndian

// errAbort ends a handshake the client gave up with NBD_OPT_ABORT.
var errAbort = errors.New("client sent NBD_OPT_ABORT")

// handshake runs the fixed-newstyle negotiation and returns the export the
// client chose. Any error means the connection must be dropped.
func (c *conn) handshake() (*Export, error) {
	noZeroes, err := c.greet()
	if err != nil {
		return nil, err
	}
	for {
		opt, data, err := c.readOption()
		if err != nil {
			return nil, err
		}
		if c.stopping.Load() {
			_ = c.optError(opt, repErrShutdown, "server shutting down")
			return nil, errStopped
		}
		if c.tlsConfig != nil && c.tls == nil {
			if err := c.requireTLS(opt, data); err != nil {
				return nil, err
			}
			continue
		}
		if e, err := c.option(opt, data, noZeroes); e != nil || err != nil {
			return e, err
		}
	}
}

// greet sends the server's greeting and reads the client's flags, which
// say whether the client wants the 124 zero bytes after
// NBD_OPT_EXPORT_NAME's reply (noZeroes false).
func (c *conn) greet() (noZeroes bool, err error) {
	var greeting [18]byte
	be.PutUint64(greeting[0:], magicInit)
	be.PutUint64(greeting[8:], magicOption)
	be.PutUint16(greeting[16:], flagFixedNewstyle|flagNoZeroes)
	if _, err := c.sock.Write(greeting[:]); err != nil {
		return false, fmt.Errorf("sending greeting: %w", err)
	}

	var cf [4]byte
	if _, err := io.ReadFull(c.br, cf[:]); err != nil {
		return false, fmt.Errorf("reading client flags: %w", err)
	}
	clientFlags := be.Uint32(cf[:])
	if unknown := clientFlags &^ (clientFlagFixed | clientFlagNoZeroes); unknown != 0 {
		// The spec requires dropping a client that sets unknown flags.
		return false, fmt.Errorf("client flags %#x: unknown bits %#x", clientFlags, unknown)
	}
	if c.tlsConfig != nil && clientFlags&clientFlagFixed == 0 {
		// The spec allows TLS only after fixed newstyle: such a client
		// could never start it.
		return false, errors.New("client without fixed newstyle cannot start TLS, which this listener requires")
	}
	return clientFlags&clientFlagNoZeroes != 0, nil
}

// readOption reads the next option and its data. An option with more data
// than maxOptionLen is skipped and refused here, and the one after it read.
func (c *conn) readOption() (uint32, []byte, error) {
	var oh [16]byte
	for {
		if _, err := io.ReadFull(c.br, oh[:]); err != nil {
			return 0, nil, fmt.Errorf("reading option header: %w", err)
		}
		if m := be.Uint64(oh[0:]); m != magicOption {
			return 0, nil, fmt.Errorf("bad option magic %#x", m)
		}
		opt := be.Uint32(oh[8:])
		length := be.Uint32(oh[12:])
		if length > maxOptionLen {
			if length > maxOptionSkip {
				return 0, nil, fmt.Errorf("option %d: %d bytes of data, beyond %d", opt, length, maxOptionSkip)
			}
			if _, err := io.CopyN(io.Discard, c.br, int64(length)); err != nil {
				return 0, nil, fmt.Errorf("option %d: skipping data: %w", opt, err)
			}
			if err := c.optError(opt, repErrTooBig, "option data too long"); err != nil {
				return 0, nil, err
			}
			continue
		}
		data := make([]byte, length)
		if _, err := io.ReadFull(c.br, data); err != nil {
			return 0, nil, fmt.Errorf("option %d: reading %d bytes of data: %w", opt, length, err)
		}
		return opt, data, nil
	}
}

// option answers one option once TLS is up where required. It returns the
// export when the negotiation ended with one, an error when the connection
// must be dropped, and neither when the client may send another option.
func (c *conn) option(opt uint32, data []byte, noZeroes bool) (*Export, error) {
	switch opt {
	case optExportName:
		return c.exportName(data, noZeroes)

	case optAbort:
		// Best effort: the client may already have gone.
		_ = c.optReply(opt, repAck, nil)
		return nil, errAbort

	case optList:
		return nil, c.list(opt, data)

	case optInfo, optGo:
		e, err := c.info(opt, data)
		if err != nil {
			return nil, err
		}
		if e != nil && opt == optGo {
			return e, nil
		}
		return nil, nil

	case optStartTLS:
		// On a listener that requires TLS, requireTLS took it until
		// TLS was up; on others TLS is not offered.
		if c.tls != nil {
			return nil, c.optError(opt, repErrInvalid, "TLS is already started")
		}
		return nil, c.optError(opt, repErrUnsup, "TLS is not offered here")

	default:
		// STRUCTURED_REPLY, meta contexts, extended headers and
		// anything newer: the client falls back to the basics.
		return nil, c.optError(opt, repErrUnsup, "option not supported")
	}
}

// exportName answers NBD_OPT_EXPORT_NAME, which ends the negotiation.
func (c *conn) exportName(data []byte, noZeroes bool) (*Export, error) {
	e := c.srv.lookup(string(data))
	if e == nil {
		// NBD_OPT_EXPORT_NAME cannot fail politely: the spec
		// says to drop the connection.
		return nil, fmt.Errorf("NBD_OPT_EXPORT_NAME: no export %q", data)
	}
	reply := make([]byte, 10, 10+124)
	be.PutUint64(reply[0:], uint64(e.Backend.Size()))
	be.PutUint16(reply[8:], serverFlags)
	if !noZeroes {
		reply = reply[:10+124]
	}
	if _, err := c.sock.Write(reply); err != nil {
		return nil, fmt.Errorf("NBD_OPT_EXPORT_NAME: sending export: %w", err)
	}
	return e, nil
}

// list answers NBD_OPT_LIST with every export. It returns an error only
// when the connection must be dropped.
func (c *conn) list(opt uint32, data []byte) error {
	if len(data) != 0 {
		return c.optError(opt, repErrInvalid, "NBD_OPT_LIST takes no data")
	}
	for i := range c.srv.exports {
		e := &c.srv.exports[i]
		d := make([]byte, 4, 4+len(e.Name)+len(e.Description))
		be.PutUint32(d, uint32(len(e.Name)))
		d = append(d, e.Name...)
		d = append(d, e.Description...)
		if err := c.optReply(opt, repServer, d); err != nil {
			return err
		}
	}
	return c.optReply(opt, repAck, nil)
}

// info answers NBD_OPT_INFO and NBD_OPT_GO. It returns the export when the
// request succeeded, nil after an error reply, and an error only when the
// connection must be dropped.
func (c *conn) info(opt uint32, data []byte) (*Export, error) {
	// Data: u32 name length, name, u16 number of requests, u16 each.
	if len(data) < 6 {
		return nil, c.optError(opt, repErrInvalid, "option data too short")
	}
	nameLen := be.Uint32(data)
	if uint64(nameLen)+6 > uint64(len(data)) {
		return nil, c.optError(opt, repErrInvalid, "export name length beyond option data")
	}
	name := string(data[4 : 4+nameLen])
	rest := data[4+nameLen:]
	nreq := int(be.Uint16(rest))
	rest = rest[2:]
	if len(rest) != 2*nreq {
		return nil, c.optError(opt, repErrInvalid, "information request count does not match option length")
	}
	var wantName, wantDesc bool
	for i := 0; i < nreq; i++ {
		switch be.Uint16(rest[2*i:]) {
		case infoName:
			wantName = true
		case infoDescription:
			wantDesc = true
		}
	}

	e := c.srv.lookup(name)
	if e == nil {
		return nil, c.optError(opt, repErrUnknown, fmt.Sprintf("no export named %q", name))
	}

	var exp [12]byte
	be.PutUint16(exp[0:], infoExport)
	be.PutUint64(exp[2:], uint64(e.Backend.Size()))
	be.PutUint16(exp[10:], serverFlags)
	if err := c.optReply(opt, repInfo, exp[:]); err != nil {
		return nil, err
	}
	if wantName {
		d := make([]byte, 2, 2+len(e.Name))
		be.PutUint16(d, infoName)
		if err := c.optReply(opt, repInfo, append(d, e.Name...)); err != nil {
			return nil, err
		}
	}
	if wantDesc && e.Description != "" {
		d := make([]byte, 2, 2+len(e.Description))
		be.PutUint16(d, infoDescription)
		if err := c.optReply(opt, repInfo, append(d, e.Description...)); err != nil {
			return nil, err
		}
	}
	// Block sizes are sent whether asked for or not, with the page as
	// the preferred size so that the kernel and qemu align to it. The
	// maximum is the protocol's default for the kernel device's
	// connections, less for others (otherMaxPayload).
	var bs [14]byte
	be.PutUint16(bs[0:], infoBlockSize)
	be.PutUint32(bs[2:], minBlockSize)
	be.PutUint32(bs[6:], PreferredBlockSize)
	be.PutUint32(bs[10:], c.maxPayload())
	if err := c.optReply(opt, repInfo, bs[:]); err != nil {
		return nil, err
	}
	if err := c.optReply(opt, repAck, nil); err != nil {
		return nil, err
	}
	return e, nil
}

// optReply sends one option reply: magic, option, type, length, data.
func (c *conn) optReply(opt, typ uint32, data []byte) error {
	b := make([]byte, 20, 20+len(data))
	be.PutUint64(b[0:], magicOptionReply)
	be.PutUint32(b[8:], opt)
	be.PutUint32(b[12:], typ)
	be.PutUint32(b[16:], uint32(len(data)))
	if _, err := c.sock.Write(append(b, data...)); err != nil {
		return fmt.Errorf("option %d: sending reply %#x: %w", opt, typ, err)
	}
	return nil
}

// optError sends an error reply with a message for the user.
func (c *conn) optError(opt, typ uint32, msg string) error {
	return c.optReply(opt, typ, []byte(msg))
}
