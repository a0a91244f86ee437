// The client side of the handshake, for the kernel attach and tests.

package nbd

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"time"
)

// ExportInfo is what a server told the client about the export it chose.
type ExportInfo struct {
	Name  string
	Size  uint64
	Flags uint16 // transmission flags (FlagHasFlags, FlagSendFlush, ...)
	// Block size constraints; zero when the server sent none.
	MinBlock, PreferredBlock, MaxBlock uint32
}

// OptionError is an error reply from the server to a handshake option.
type OptionError struct {
	Option  uint32
	Reply   uint32 // NBD_REP_ERR_* value
	Message string // the server's message, if any
}

func (e *OptionError) Error() string {
	return fmt.Sprintf("nbd: option %d refused with reply %#x: %s", e.Option, e.Reply, e.Message)
}

// Dial connects to an NBD server (network "unix" or "tcp") and negotiates
// the named export with Negotiate. The returned connection is in the
// transmission phase, ready to be handed to the kernel.
func Dial(ctx context.Context, network, addr, export string) (net.Conn, ExportInfo, error) {
	var d net.Dialer
	nc, err := d.DialContext(ctx, network, addr)
	if err != nil {
		return nil, ExportInfo{}, fmt.Errorf("nbd: dial %s %s: %w", network, addr, err)
	}
	if dl, ok := ctx.Deadline(); ok {
		nc.SetDeadline(dl)
	}
	info, err := Negotiate(nc, export)
	if err != nil {
		nc.Close()
		return nil, ExportInfo{}, err
	}
	nc.SetDeadline(time.Time{})
	return nc, info, nil
}

// Negotiate runs the client side of the fixed-newstyle handshake on nc,
// choosing export with NBD_OPT_GO (falling back to NBD_OPT_EXPORT_NAME for
// servers without it). On success nc is in the transmission phase.
func Negotiate(nc net.Conn, export string) (ExportInfo, error) {
	if len(export) > maxNameLen {
		return ExportInfo{}, fmt.Errorf("nbd: export name longer than %d bytes", maxNameLen)
	}
	var greeting [18]byte
	if _, err := io.ReadFull(nc, greeting[:]); err != nil {
		return ExportInfo{}, fmt.Errorf("nbd: reading server greeting: %w", err)
	}
	if m := be.Uint64(greeting[0:]); m != magicInit {
		return ExportInfo{}, fmt.Errorf("nbd: server greeting magic %#x, want %#x", m, magicInit)
	}
	if m := be.Uint64(greeting[8:]); m != magicOption {
		return ExportInfo{}, fmt.Errorf("nbd: server is not newstyle (magic %#x)", m)
	}
	hsFlags := be.Uint16(greeting[16:])
	if hsFlags&flagFixedNewstyle == 0 {
		return ExportInfo{}, errors.New("nbd: server does not speak fixed newstyle")
	}
	clientFlags := clientFlagFixed
	noZeroes := hsFlags&flagNoZeroes != 0
	if noZeroes {
		clientFlags |= clientFlagNoZeroes
	}

	// Client flags and NBD_OPT_GO go out in one write.
	msg := make([]byte, 4, 4+16+4+len(export)+4)
	be.PutUint32(msg, clientFlags)
	msg = appendOption(msg, optGo, len(export)+4+2+2)
	msg = be.AppendUint32(msg, uint32(len(export)))
	msg = append(msg, export...)
	msg = be.AppendUint16(msg, 1)
	msg = be.AppendUint16(msg, infoBlockSize)
	if _, err := nc.Write(msg); err != nil {
		return ExportInfo{}, fmt.Errorf("nbd: sending NBD_OPT_GO: %w", err)
	}

	info := ExportInfo{Name: export}
	var gotExport bool
	for {
		typ, data, err := readOptReply(nc, optGo)
		if err != nil {
			return ExportInfo{}, err
		}
		switch {
		case typ == repAck:
			if !gotExport {
				return ExportInfo{}, errors.New("nbd: NBD_OPT_GO acknowledged without NBD_INFO_EXPORT")
			}
			return info, nil
		case typ == repInfo:
			if len(data) < 2 {
				return ExportInfo{}, errors.New("nbd: empty NBD_REP_INFO")
			}
			switch be.Uint16(data) {
			case infoExport:
				if len(data) != 12 {
					return ExportInfo{}, fmt.Errorf("nbd: NBD_INFO_EXPORT of %d bytes, want 12", len(data))
				}
				info.Size = be.Uint64(data[2:])
				info.Flags = be.Uint16(data[10:])
				gotExport = true
			case infoBlockSize:
				if len(data) != 14 {
					return ExportInfo{}, fmt.Errorf("nbd: NBD_INFO_BLOCK_SIZE of %d bytes, want 14", len(data))
				}
				info.MinBlock = be.Uint32(data[2:])
				info.PreferredBlock = be.Uint32(data[6:])
				info.MaxBlock = be.Uint32(data[10:])
			}
		case typ == repErrUnsup:
			return exportName(nc, export, noZeroes)
		case typ&(1<<31) != 0:
			return ExportInfo{}, &OptionError{Option: optGo, Reply: typ, Message: string(data)}
		default:
			return ExportInfo{}, fmt.Errorf("nbd: unexpected reply %#x to NBD_OPT_GO", typ)
		}
	}
}

// exportName enters transmission with the old NBD_OPT_EXPORT_NAME.
func exportName(nc net.Conn, export string, noZeroes bool) (ExportInfo, error) {
	msg := appendOption(nil, optExportName, len(export))
	msg = append(msg, export...)
	if _, err := nc.Write(msg); err != nil {
		return ExportInfo{}, fmt.Errorf("nbd: sending NBD_OPT_EXPORT_NAME: %w", err)
	}
	n := 10
	if !noZeroes {
		n += 124
	}
	reply := make([]byte, n)
	if _, err := io.ReadFull(nc, reply); err != nil {
		return ExportInfo{}, fmt.Errorf("nbd: reading NBD_OPT_EXPORT_NAME reply (export %q refused?): %w", export, err)
	}
	return ExportInfo{Name: export, Size: be.Uint64(reply), Flags: be.Uint16(reply[8:])}, nil
}

func appendOption(b []byte, opt uint32, length int) []byte {
	b = be.AppendUint64(b, magicOption)
	b = be.AppendUint32(b, opt)
	return be.AppendUint32(b, uint32(length))
}

// readOptReply reads one option reply to opt and returns its type and data.
func readOptReply(r io.Reader, opt uint32) (uint32, []byte, error) {
	var h [20]byte
	if _, err := io.ReadFull(r, h[:]); err != nil {
		return 0, nil, fmt.Errorf("nbd: reading reply to option %d: %w", opt, err)
	}
	if m := be.Uint64(h[0:]); m != magicOptionReply {
		return 0, nil, fmt.Errorf("nbd: option reply magic %#x, want %#x", m, magicOptionReply)
	}
	if o := be.Uint32(h[8:]); o != opt {
		return 0, nil, fmt.Errorf("nbd: reply for option %d, want %d", o, opt)
	}
	typ := be.Uint32(h[12:])
	n := be.Uint32(h[16:])
	if n > maxOptionLen {
		return 0, nil, fmt.Errorf("nbd: option reply of %d bytes", n)
	}
	data := make([]byte, n)
	if _, err := io.ReadFull(r, data); err != nil {
		return 0, nil, fmt.Errorf("nbd: reading reply data to option %d: %w", opt, err)
	}
	return typ, data, nil
}
