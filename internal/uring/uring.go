// Package uring is the small part of Linux's io_uring that gzramd needs,
// through raw system calls: a ring of 128-byte submission entries (for
// IORING_OP_URING_CMD, whose command does not fit a 64-byte entry), NOPs,
// polls and uring commands, submitted and reaped by one thread.
//
// A Ring is not safe for concurrent use: its submission queue has one
// producer and its completion queue one consumer, the goroutine that owns
// it. Where the commands care which task submits them (ublk's queue
// commands must all come from the same one), that goroutine locks its OS
// thread.
package uring

import (
	"errors"
	"fmt"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Setup flags and features (include/uapi/linux/io_uring.h).
const (
	SetupSQE128 = 1 << 10 // IORING_SETUP_SQE128

	featSingleMmap = 1 << 0 // IORING_FEAT_SINGLE_MMAP

	enterGetEvents = 1 << 0 // IORING_ENTER_GETEVENTS

	offSQRing = 0          // IORING_OFF_SQ_RING
	offCQRing = 0x8000000  // IORING_OFF_CQ_RING
	offSQEs   = 0x10000000 // IORING_OFF_SQES
)

// Opcodes used here.
const (
	OpNop      = 0  // IORING_OP_NOP
	OpPollAdd  = 6  // IORING_OP_POLL_ADD
	OpUringCmd = 46 // IORING_OP_URING_CMD
)

// SQESize is the size of one submission entry on a ring set up with
// SetupSQE128; CmdSize is how much of it a uring command's payload may use.
const (
	SQESize = 128
	CmdSize = 80
	cqeSize = 16
)

// SQE is one 128-byte submission entry. Its fields are set through the
// methods, which keep the kernel's layout in one place.
type SQE [SQESize]byte

func (e *SQE) put8(off int, v uint8)   { e[off] = v }
func (e *SQE) put16(off int, v uint16) { *(*uint16)(unsafe.Pointer(&e[off])) = v }
func (e *SQE) put32(off int, v uint32) { *(*uint32)(unsafe.Pointer(&e[off])) = v }
func (e *SQE) put64(off int, v uint64) { *(*uint64)(unsafe.Pointer(&e[off])) = v }

// Offsets in struct io_uring_sqe.
const (
	sqeOpcode   = 0
	sqeFd       = 4
	sqeOff      = 8 // also cmd_op (u32) for IORING_OP_URING_CMD
	sqeAddr     = 16
	sqeLen      = 24
	sqeOpFlags  = 28 // rw_flags, poll32_events, uring_cmd_flags
	sqeUserData = 32
	sqeCmd      = 48 // addr3, or the start of a uring command's payload
)

// PrepNop makes e a NOP.
func (e *SQE) PrepNop(userData uint64) {
	*e = SQE{}
	e.put8(sqeOpcode, OpNop)
	e.put64(sqeUserData, userData)
}

// PrepPollAdd makes e a one-shot poll of fd for events (POLLIN, ...).
func (e *SQE) PrepPollAdd(fd int, events uint32, userData uint64) {
	*e = SQE{}
	e.put8(sqeOpcode, OpPollAdd)
	e.put32(sqeFd, uint32(int32(fd)))
	e.put32(sqeOpFlags, events)
	e.put64(sqeUserData, userData)
}

// PrepUringCmd makes e a uring command cmdOp on fd, its payload cmd
// copied in (at most CmdSize bytes).
func (e *SQE) PrepUringCmd(fd int, cmdOp uint32, cmd []byte, userData uint64) error {
	if len(cmd) > CmdSize {
		return fmt.Errorf("uring: a command of %d bytes, more than %d", len(cmd), CmdSize)
	}
	*e = SQE{}
	e.put8(sqeOpcode, OpUringCmd)
	e.put32(sqeFd, uint32(int32(fd)))
	e.put32(sqeOff, cmdOp)
	e.put64(sqeUserData, userData)
	copy(e[sqeCmd:], cmd)
	return nil
}

// CQE is one completion: the submission's user data, and its result (a
// negative errno on failure).
type CQE struct {
	UserData uint64
	Res      int32
	Flags    uint32
}

// params is struct io_uring_params.
type params struct {
	sqEntries    uint32
	cqEntries    uint32
	flags        uint32
	sqThreadCPU  uint32
	sqThreadIdle uint32
	features     uint32
	wqFd         uint32
	resv         [3]uint32
	sqOff        sqringOffsets
	cqOff        cqringOffsets
}

type sqringOffsets struct {
	head, tail, ringMask, ringEntries, flags, dropped, array, resv1 uint32
	userAddr                                                        uint64
}

type cqringOffsets struct {
	head, tail, ringMask, ringEntries, overflow, cqes, flags, resv1 uint32
	userAddr                                                        uint64
}

// Ring is one io_uring instance with its three mappings.
type Ring struct {
	fd int

	sqMem, cqMem, sqeMem []byte

	sqHead, sqTail, sqMask *uint32
	sqEntries              uint32
	sqes                   []SQE
	tail                   uint32 // the next SQE to fill (ours; the kernel sees it on Submit)

	cqHead, cqTail, cqMask *uint32
	cqes                   []CQE
}

// ErrUnsupported wraps the setup error of a kernel without io_uring, or
// one where it is disabled (kernel.io_uring_disabled) or refused.
var ErrUnsupported = errors.New("io_uring unavailable")

// New sets up a ring of at least entries submission entries with flags
// (SetupSQE128 is always added).
func New(entries uint32, flags uint32) (*Ring, error) {
	p := params{flags: flags | SetupSQE128}
	fd, _, errno := unix.Syscall(unix.SYS_IO_URING_SETUP, uintptr(entries), uintptr(unsafe.Pointer(&p)), 0)
	if errno != 0 {
		err := error(errno)
		if errno == unix.ENOSYS || errno == unix.EPERM {
			err = fmt.Errorf("%w: %w", ErrUnsupported, errno)
		}
		return nil, fmt.Errorf("uring: io_uring_setup(%d): %w", entries, err)
	}
	r := &Ring{fd: int(fd)}
	if err := r.mmap(&p); err != nil {
		r.Close()
		return nil, err
	}
	return r, nil
}

func (r *Ring) mmap(p *params) error {
	sqSize := int(p.sqOff.array + p.sqEntries*4)
	cqSize := int(p.cqOff.cqes + p.cqEntries*cqeSize)
	var err error
	if p.features&featSingleMmap != 0 {
		sqSize = max(sqSize, cqSize)
	}
	r.sqMem, err = unix.Mmap(r.fd, offSQRing, sqSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_POPULATE)
	if err != nil {
		return fmt.Errorf("uring: mapping the submission ring: %w", err)
	}
	cq := r.sqMem
	if p.features&featSingleMmap == 0 {
		r.cqMem, err = unix.Mmap(r.fd, offCQRing, cqSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_POPULATE)
		if err != nil {
			return fmt.Errorf("uring: mapping the completion ring: %w", err)
		}
		cq = r.cqMem
	}
	r.sqeMem, err = unix.Mmap(r.fd, offSQEs, int(p.sqEntries)*SQESize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_POPULATE)
	if err != nil {
		return fmt.Errorf("uring: mapping the submission entries: %w", err)
	}
	u32 := func(m []byte, off uint32) *uint32 { return (*uint32)(unsafe.Pointer(&m[off])) }
	r.sqHead, r.sqTail, r.sqMask = u32(r.sqMem, p.sqOff.head), u32(r.sqMem, p.sqOff.tail), u32(r.sqMem, p.sqOff.ringMask)
	r.sqEntries = p.sqEntries
	r.sqes = unsafe.Slice((*SQE)(unsafe.Pointer(&r.sqeMem[0])), p.sqEntries)
	// The array indirection maps ring slot i to entry i, once and for all.
	array := unsafe.Slice((*uint32)(unsafe.Pointer(&r.sqMem[p.sqOff.array])), p.sqEntries)
	for i := range array {
		array[i] = uint32(i)
	}
	r.tail = atomic.LoadUint32(r.sqTail)
	r.cqHead, r.cqTail, r.cqMask = u32(cq, p.cqOff.head), u32(cq, p.cqOff.tail), u32(cq, p.cqOff.ringMask)
	r.cqes = unsafe.Slice((*CQE)(unsafe.Pointer(&cq[p.cqOff.cqes])), p.cqEntries)
	return nil
}

// Close unmaps the ring and closes it; the kernel cancels what is still
// in flight on it.
func (r *Ring) Close() error {
	for _, m := range [][]byte{r.sqeMem, r.cqMem, r.sqMem} {
		if m != nil {
			_ = unix.Munmap(m)
		}
	}
	r.sqeMem, r.cqMem, r.sqMem = nil, nil, nil
	if r.fd < 0 {
		return nil
	}
	err := unix.Close(r.fd)
	r.fd = -1
	return err
}

// NextSQE returns the next free submission entry, or nil when the
// submission queue is full (Submit first). The entry goes to the kernel
// on the next Submit.
func (r *Ring) NextSQE() *SQE {
	if r.tail-atomic.LoadUint32(r.sqHead) >= r.sqEntries {
		return nil
	}
	e := &r.sqes[r.tail&*r.sqMask]
	r.tail++
	return e
}

// Submit hands the filled entries to the kernel and waits until at least
// wait completions are ready. It returns once every entry is consumed;
// a signal interrupting the wait (Go's runtime sends them) is retried.
func (r *Ring) Submit(wait uint32) error {
	atomic.StoreUint32(r.sqTail, r.tail)
	for {
		pending := r.tail - atomic.LoadUint32(r.sqHead)
		flags := uintptr(0)
		if wait > 0 {
			flags = enterGetEvents
		}
		_, _, errno := unix.Syscall6(unix.SYS_IO_URING_ENTER, uintptr(r.fd), uintptr(pending), uintptr(wait), flags, 0, 0)
		switch errno {
		case 0:
		case unix.EINTR:
			continue
		default:
			return fmt.Errorf("uring: io_uring_enter: %w", errno)
		}
		if r.tail == atomic.LoadUint32(r.sqHead) && (wait == 0 || r.Ready() >= wait) {
			return nil
		}
	}
}

// Ready is the number of completions waiting to be reaped.
func (r *Ring) Ready() uint32 {
	return atomic.LoadUint32(r.cqTail) - atomic.LoadUint32(r.cqHead)
}

// PopCQE takes the oldest completion ready, if any, and frees its slot.
func (r *Ring) PopCQE() (CQE, bool) {
	head := atomic.LoadUint32(r.cqHead)
	if head == atomic.LoadUint32(r.cqTail) {
		return CQE{}, false
	}
	c := r.cqes[head&*r.cqMask]
	atomic.StoreUint32(r.cqHead, head+1)
	return c, true
}

// Reap calls fn for each completion ready, in order, and frees their
// slots. fn may fill new entries (NextSQE) for the next Submit.
func (r *Ring) Reap(fn func(CQE)) int {
	head := atomic.LoadUint32(r.cqHead)
	tail := atomic.LoadUint32(r.cqTail)
	n := 0
	for ; head != tail; head++ {
		c := r.cqes[head&*r.cqMask]
		atomic.StoreUint32(r.cqHead, head+1)
		fn(c)
		n++
	}
	return n
}
