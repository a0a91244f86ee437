package ublk

import (
	"context"
	"errors"
	"fmt"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gzramd/gzramd/pkg/blockdev"
)

// handler runs one queue's requests against the backend. Its data moves
// by USER_COPY: pread and pwrite on /dev/ublkcN at the request's position.
type handler struct {
	ctx     context.Context
	backend blockdev.Backend
	recv    blockdev.WriteReceiver // backend, if it receives writes itself
	obs     Observer               // nil: none
	size    int64
	data    int // /dev/ublkcN, or in tests any file
	q       uint16
}

func newHandler(ctx context.Context, backend blockdev.Backend, obs Observer, data int) handler {
	recv, _ := backend.(blockdev.WriteReceiver)
	return handler{ctx: ctx, backend: backend, recv: recv, obs: obs, size: backend.Size(), data: data}
}

// Op is a request's operation, as the driver names it (UBLK_IO_OP_*).
type Op uint8

// The operations a device is sent; OpWriteSame and any other are
// answered EOPNOTSUPP.
const (
	OpRead        Op = opRead
	OpWrite       Op = opWrite
	OpFlush       Op = opFlush
	OpDiscard     Op = opDiscard
	OpWriteSame   Op = opWriteSame
	OpWriteZeroes Op = opWriteZeroes
)

func (o Op) String() string {
	switch o {
	case OpRead:
		return "read"
	case OpWrite:
		return "write"
	case OpFlush:
		return "flush"
	case OpDiscard:
		return "discard"
	case OpWriteSame:
		return "write_same"
	case OpWriteZeroes:
		return "write_zeroes"
	}
	return "unknown"
}

// Observer is told of every request a queue serves, for metrics. It is
// called on the queue's thread before the request is committed, so it
// must be cheap, and must neither allocate nor block.
type Observer interface {
	// RequestDone reports one request: its operation, its length, the
	// time from its descriptor being read to its result being ready,
	// and the errno answered (0 for success).
	RequestDone(op Op, length uint64, d time.Duration, errno syscall.Errno)
}

// serve runs the request in d, tag's, with buf as its data buffer, and
// returns what COMMIT_AND_FETCH reports: the bytes done, or a negative
// errno. The observer, if any, is told.
func (h *handler) serve(tag uint16, d ioDesc, buf []byte) int32 {
	if h.obs == nil {
		return h.run(tag, d, buf)
	}
	start := time.Now()
	res := h.run(tag, d, buf)
	var errno syscall.Errno
	if res < 0 {
		errno = syscall.Errno(-res)
	}
	h.obs.RequestDone(Op(d.op()), uint64(d.NrSectors)<<9, time.Since(start), errno)
	return res
}

// run serves the request. Whatever the descriptor says, it does not
// panic: a descriptor the driver should never write (an unknown op, a
// range past the end, a request longer than buf) is answered with an
// error.
func (h *handler) run(tag uint16, d ioDesc, buf []byte) int32 {
	off := int64(d.StartSector) << 9
	n := int64(d.NrSectors) << 9
	op := d.op()
	if op != opFlush && (d.StartSector > uint64(h.size)>>9 || off+n > h.size) {
		return -int32(unix.EINVAL)
	}
	var err error
	switch op {
	case opRead, opWrite:
		if n > int64(len(buf)) {
			return -int32(unix.EINVAL)
		}
		p := buf[:n]
		if op == opRead {
			err = h.backend.ReadAt(h.ctx, p, off)
			if err == nil {
				err = h.copyOut(tag, p)
			}
		} else {
			err = h.write(tag, p, off, d.OpFlags&ioFlagFUA != 0)
		}
		if err == nil {
			return int32(n)
		}
	case opFlush:
		err = h.backend.Flush(h.ctx)
	case opDiscard:
		err = h.backend.Trim(h.ctx, off, n)
	case opWriteZeroes:
		err = h.backend.WriteZeroes(h.ctx, off, n, d.OpFlags&ioFlagNoUnmap != 0)
	default:
		return -int32(unix.EOPNOTSUPP)
	}
	return errnoResult(err)
}

// write stores a write's data, p long at off. A backend that receives
// writes itself (the device's staging slots, with a GPU) gets the data
// read from the driver straight into its memory, saving the copy through
// the tag's buffer p; one that declines gets it in p, by WriteAt.
func (h *handler) write(tag uint16, p []byte, off int64, fua bool) error {
	if h.recv != nil {
		if rc, ok := h.recv.ReceiveWrite(off, len(p)); ok {
			at := 0
			for _, b := range rc.Buffers() {
				if err := h.copyIn(tag, b, at); err != nil {
					h.recv.AbortWrite(rc)
					return err
				}
				at += len(b)
			}
			return h.recv.CompleteWrite(h.ctx, rc, fua)
		}
	}
	if err := h.copyIn(tag, p, 0); err != nil {
		return err
	}
	return h.backend.WriteAt(h.ctx, p, off, fua)
}

// copyIn reads the write's data from byte at on, len(p) of it, into p.
func (h *handler) copyIn(tag uint16, p []byte, at int) error {
	for done := 0; done < len(p); {
		n, err := unix.Pread(h.data, p[done:], userCopyPos(h.q, tag, uint32(at+done)))
		if err != nil {
			return fmt.Errorf("ublk: reading tag %d's data: %w", tag, err)
		}
		if n == 0 {
			return fmt.Errorf("ublk: reading tag %d's data: %w after %d of %d bytes", tag, unix.EIO, at+done, at+len(p))
		}
		done += n
	}
	return nil
}

// copyOut writes a read's data from p to the driver.
func (h *handler) copyOut(tag uint16, p []byte) error {
	for done := 0; done < len(p); {
		n, err := unix.Pwrite(h.data, p[done:], userCopyPos(h.q, tag, uint32(done)))
		if err != nil {
			return fmt.Errorf("ublk: writing tag %d's data: %w", tag, err)
		}
		if n == 0 {
			return fmt.Errorf("ublk: writing tag %d's data: %w after %d of %d bytes", tag, unix.EIO, done, len(p))
		}
		done += n
	}
	return nil
}

// errnoResult is err as the kernel takes it: 0, or a negative errno (EIO
// where err names none).
func errnoResult(err error) int32 {
	if err == nil {
		return 0
	}
	var errno syscall.Errno
	if errors.As(err, &errno) && errno != 0 && errno < 4096 {
		return -int32(errno)
	}
	return -int32(unix.EIO)
}
