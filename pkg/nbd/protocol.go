// The NBD protocol's wire constants.

package nbd

import "github.com/pojntfx/go-nbd/pkg/protocol"

// Wire constants from the NBD protocol (NetworkBlockDevice/nbd doc/proto.md).
// go-nbd names the handshake magics and a few option codes; the rest of the
// transmission phase (FLUSH, TRIM, WRITE_ZEROES, command flags, error codes)
// is not in go-nbd and is spelled out here.
const (
	magicInit        = protocol.NEGOTIATION_MAGIC_OLDSTYLE // "NBDMAGIC"
	magicOption      = protocol.NEGOTIATION_MAGIC_OPTION   // "IHAVEOPT"
	magicOptionReply = protocol.NEGOTIATION_MAGIC_REPLY
	magicRequest     = protocol.TRANSMISSION_MAGIC_REQUEST
	magicReply       = protocol.TRANSMISSION_MAGIC_REPLY

	// Handshake flags (server) and client flags.
	flagFixedNewstyle  = protocol.NEGOTIATION_HANDSHAKE_FLAG_FIXED_NEWSTYLE
	flagNoZeroes       = uint16(1 << 1)
	clientFlagFixed    = uint32(1 << 0)
	clientFlagNoZeroes = uint32(1 << 1)

	// Options.
	optExportName      = uint32(1)
	optAbort           = protocol.NEGOTIATION_ID_OPTION_ABORT
	optList            = protocol.NEGOTIATION_ID_OPTION_LIST
	optStartTLS        = uint32(5)
	optInfo            = protocol.NEGOTIATION_ID_OPTION_INFO
	optGo              = protocol.NEGOTIATION_ID_OPTION_GO
	optStructuredReply = uint32(8)

	// Option replies.
	repAck            = protocol.NEGOTIATION_TYPE_REPLY_ACK
	repServer         = protocol.NEGOTIATION_TYPE_REPLY_SERVER
	repInfo           = protocol.NEGOTIATION_TYPE_REPLY_INFO
	repErrUnsup       = protocol.NEGOTIATION_TYPE_REPLY_ERR_UNSUPPORTED
	repErrPolicy      = uint32(1<<31 | 2)
	repErrInvalid     = uint32(1<<31 | 3)
	repErrUnknown     = protocol.NEGOTIATION_TYPE_REPLY_ERR_UNKNOWN
	repErrTLSReqd     = uint32(1<<31 | 5)
	repErrShutdown    = uint32(1<<31 | 7)
	repErrTooBig      = uint32(1<<31 | 9)
	repErrBlockSizeRq = uint32(1<<31 | 8)

	// Info types.
	infoExport      = protocol.NEGOTIATION_TYPE_INFO_EXPORT
	infoName        = protocol.NEGOTIATION_TYPE_INFO_NAME
	infoDescription = protocol.NEGOTIATION_TYPE_INFO_DESCRIPTION
	infoBlockSize   = protocol.NEGOTIATION_TYPE_INFO_BLOCKSIZE
)

// Transmission flags sent with an export.
const (
	FlagHasFlags        = uint16(1 << 0)
	FlagReadOnly        = uint16(1 << 1)
	FlagSendFlush       = uint16(1 << 2)
	FlagSendFUA         = uint16(1 << 3)
	FlagRotational      = uint16(1 << 4)
	FlagSendTrim        = uint16(1 << 5)
	FlagSendWriteZeroes = uint16(1 << 6)
	FlagCanMultiConn    = uint16(1 << 8)
)

// serverFlags are the transmission flags of every export: a RAM device has
// no rotation and one shared cache, so multi-conn is safe.
const serverFlags = FlagHasFlags | FlagSendFlush | FlagSendFUA | FlagSendTrim |
	FlagSendWriteZeroes | FlagCanMultiConn

// Command is an NBD request type.
type Command uint16

// Commands of the transmission phase.
const (
	CmdRead        Command = 0
	CmdWrite       Command = 1
	CmdDisc        Command = 2
	CmdFlush       Command = 3
	CmdTrim        Command = 4
	CmdCache       Command = 5
	CmdWriteZeroes Command = 6
	CmdBlockStatus Command = 7
)

func (c Command) String() string {
	switch c {
	case CmdRead:
		return "read"
	case CmdWrite:
		return "write"
	case CmdDisc:
		return "disc"
	case CmdFlush:
		return "flush"
	case CmdTrim:
		return "trim"
	case CmdCache:
		return "cache"
	case CmdWriteZeroes:
		return "write_zeroes"
	case CmdBlockStatus:
		return "block_status"
	}
	return "unknown"
}

// Command flags.
const (
	cmdFlagFUA    = uint16(1 << 0)
	cmdFlagNoHole = uint16(1 << 1)
)

// NBD error codes (proto.md "Error values"); these match Linux errno.
const (
	errnoPerm     = uint32(1)
	errnoIO       = uint32(5)
	errnoNoMem    = uint32(12)
	errnoInval    = uint32(22)
	errnoNoSpc    = uint32(28)
	errnoOverflow = uint32(75)
	errnoNotSup   = uint32(95)
	errnoShutdown = uint32(108)
)

const (
	requestHeaderLen = 28
	replyHeaderLen   = 16

	// MaxPayload is the largest read or write the server accepts on the
	// kernel device's connections (others: otherMaxPayload); it is the
	// maximum block size advertised to them in NBD_INFO_BLOCK_SIZE.
	MaxPayload = 32 << 20
	// PreferredBlockSize is the advertised preferred block size: one page.
	PreferredBlockSize = 4096
	minBlockSize       = 1

	// maxOptionLen bounds the data of one handshake option; a longer one
	// is refused with NBD_REP_ERR_TOO_BIG (and its data skipped) up to
	// maxOptionSkip, beyond which the connection is dropped.
	maxOptionLen  = 64 << 10
	maxOptionSkip = 1 << 20
	// maxNameLen is the longest export name the spec allows (4096 bytes).
	maxNameLen = 4096
)
