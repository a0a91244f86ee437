package ublk

import "fmt"

// The kernel's interface, from include/uapi/linux/ublk_cmd.h. Only what
// this server uses; the names keep the header's, in Go's case.

// ioc encodes a command number as _IOC does on x86 and arm64 (2 direction
// bits, 14 size bits, 8 type bits, 8 number bits).
func ioc(dir, typ, nr, size uint32) uint32 {
	return dir<<30 | size<<16 | typ<<8 | nr
}

const (
	iocWrite = 1
	iocRead  = 2

	ctrlCmdSize = 32 // sizeof(struct ublksrv_ctrl_cmd)
	ioCmdSize   = 16 // sizeof(struct ublksrv_io_cmd)
)

func iowr(nr, size uint32) uint32 { return ioc(iocRead|iocWrite, 'u', nr, size) }
func ior(nr, size uint32) uint32  { return ioc(iocRead, 'u', nr, size) }

// Control commands, ioctl-encoded (UBLK_U_CMD_*), sent as uring commands
// to /dev/ublk-control. Kernels since 6.4 take these encodings; the bare
// numbers (UBLK_CMD_*) are the legacy ones.
var (
	cmdGetDevInfo        = ior(0x02, ctrlCmdSize)
	cmdAddDev            = iowr(0x04, ctrlCmdSize)
	cmdDelDev            = iowr(0x05, ctrlCmdSize)
	cmdStartDev          = iowr(0x06, ctrlCmdSize)
	cmdStopDev           = iowr(0x07, ctrlCmdSize)
	cmdSetParams         = iowr(0x08, ctrlCmdSize)
	cmdGetParams         = ior(0x09, ctrlCmdSize)
	cmdStartUserRecovery = iowr(0x10, ctrlCmdSize)
	cmdEndUserRecovery   = iowr(0x11, ctrlCmdSize)
)

// I/O commands (UBLK_U_IO_*), sent as uring commands to /dev/ublkcN by
// each queue's thread.
var (
	ioFetchReq          = iowr(0x20, ioCmdSize)
	ioCommitAndFetchReq = iowr(0x21, ioCmdSize)
)

// Device flags (UBLK_F_*), asked for in ctrlDevInfo.Flags at ADD_DEV.
const (
	FlagUserRecovery        = 1 << 3 // UBLK_F_USER_RECOVERY
	FlagUserRecoveryReissue = 1 << 4 // UBLK_F_USER_RECOVERY_REISSUE
	FlagUnprivilegedDev     = 1 << 5 // UBLK_F_UNPRIVILEGED_DEV
	FlagCmdIoctlEncode      = 1 << 6 // UBLK_F_CMD_IOCTL_ENCODE
	FlagUserCopy            = 1 << 7 // UBLK_F_USER_COPY
)

// Device states (UBLK_S_DEV_*).
const (
	stateDead     = 0
	stateLive     = 1
	stateQuiesced = 2
	stateFailIO   = 3
)

func stateName(s uint16) string {
	switch s {
	case stateDead:
		return "dead"
	case stateLive:
		return "live"
	case stateQuiesced:
		return "quiesced"
	case stateFailIO:
		return "failing its I/O"
	}
	return fmt.Sprintf("in state %d", s)
}

// Request operations (UBLK_IO_OP_*), bits 0-7 of ioDesc.OpFlags, and
// request flags (UBLK_IO_F_*), bits 8-31 of it, each at its own bit.
const (
	opRead        = 0
	opWrite       = 1
	opFlush       = 2
	opDiscard     = 3
	opWriteSame   = 4
	opWriteZeroes = 5

	ioFlagFUA     = 1 << 13 // UBLK_IO_F_FUA
	ioFlagNoUnmap = 1 << 15 // UBLK_IO_F_NOUNMAP
	ioFlagSwap    = 1 << 16 // UBLK_IO_F_SWAP
)

// Results of a FETCH or COMMIT_AND_FETCH completion.
const (
	ioResOK = 0
	// ioResAbort (UBLK_IO_RES_ABORT, -ENODEV) says the queue is going
	// away: the command is not to be sent again.
	ioResAbort = -19
)

// Parameter types (UBLK_PARAM_TYPE_*) and basic attributes (UBLK_ATTR_*).
const (
	paramTypeBasic   = 1 << 0
	paramTypeDiscard = 1 << 1

	attrVolatileCache = 1 << 2
	attrFUA           = 1 << 3
)

// The offsets of /dev/ublkcN: the descriptor areas at 0
// (UBLKSRV_CMD_BUF_OFFSET), a queue's after the one before it; with
// USER_COPY, each request's data at ioBufOffset + its queue, tag and
// byte offset in the bit fields below (ublk_pos in the driver).
const (
	ioBufOffset = 0x80000000 // UBLKSRV_IO_BUF_OFFSET
	ioBufBits   = 25         // UBLK_IO_BUF_BITS: at most 32 MiB a request
	tagOff      = ioBufBits  // UBLK_TAG_OFF
	tagBits     = 16         // UBLK_TAG_BITS
	qidOff      = tagOff + tagBits
	qidBits     = 12

	// MaxQueueDepth is UBLK_MAX_QUEUE_DEPTH.
	MaxQueueDepth = 4096
	// MaxIOBytes is the most one request may carry (1 << UBLK_IO_BUF_BITS).
	MaxIOBytes = 1 << ioBufBits
)

// userCopyPos is where the data of request tag of queue q, from byte off,
// is read or written on /dev/ublkcN with USER_COPY.
func userCopyPos(q, tag uint16, off uint32) int64 {
	return ioBufOffset + int64(q)<<qidOff + int64(tag)<<tagOff + int64(off)
}

// ctrlCmd is struct ublksrv_ctrl_cmd, the payload of a control command.
type ctrlCmd struct {
	DevID      uint32
	QueueID    uint16 // 0xffff where the command is for no queue
	Len        uint16 // of the buffer at Addr
	Addr       uint64
	Data       uint64 // data[0]
	DevPathLen uint16
	Pad        uint16
	Reserved   uint32
}

// ctrlDevInfo is struct ublksrv_ctrl_dev_info: what ADD_DEV asks for and
// the kernel fills in (the device's id, its owner) and GET_DEV_INFO
// returns.
type ctrlDevInfo struct {
	NrHWQueues    uint16
	QueueDepth    uint16
	State         uint16
	Pad0          uint16
	MaxIOBufBytes uint32
	DevID         uint32
	UblksrvPid    int32
	Pad1          uint32
	Flags         uint64
	UblksrvFlags  uint64 // the server's own, the kernel keeps them
	OwnerUID      uint32
	OwnerGID      uint32
	Reserved1     uint64
	Reserved2     uint64
}

// paramBasic is struct ublk_param_basic.
type paramBasic struct {
	Attrs            uint32
	LogicalBSShift   uint8
	PhysicalBSShift  uint8
	IOOptShift       uint8
	IOMinShift       uint8
	MaxSectors       uint32
	ChunkSectors     uint32
	DevSectors       uint64
	VirtBoundaryMask uint64
}

// paramDiscard is struct ublk_param_discard.
type paramDiscard struct {
	DiscardAlignment      uint32
	DiscardGranularity    uint32
	MaxDiscardSectors     uint32
	MaxWriteZeroesSectors uint32
	MaxDiscardSegments    uint16
	Reserved0             uint16
}

// params is the head of struct ublk_params with the two parameter sets
// this server sets. The kernel's struct goes on (devt, zoned, dma,
// segment, ...); Len says how much of it is sent, and the driver reads
// no further.
type params struct {
	Len     uint32
	Types   uint32
	Basic   paramBasic
	Discard paramDiscard
}

// paramsLen is how much of params is sent: up to where the kernel's devt
// begins (Go pads the struct beyond that to 64).
const paramsLen = 60

// ioDesc is struct ublksrv_io_desc, one per tag in a queue's descriptor
// area, written by the driver before it completes the tag's fetch.
type ioDesc struct {
	OpFlags     uint32 // op in bits 0-7, flags above
	NrSectors   uint32
	StartSector uint64
	Addr        uint64 // unused with USER_COPY
}

const ioDescSize = 24

func (d *ioDesc) op() uint8 { return uint8(d.OpFlags) }

// ioCmd is struct ublksrv_io_cmd, the payload of FETCH_REQ and
// COMMIT_AND_FETCH_REQ.
type ioCmd struct {
	QID    uint16
	Tag    uint16
	Result int32 // COMMIT: bytes done, or a negative errno
	Addr   uint64
}
