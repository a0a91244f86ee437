package ublk

import (
	"context"
	"errors"
	"fmt"
	"syscall"

	"golang.org/x/sys/unix"
)

// Backend serves the device's blocks. It has the shape of nbd.Backend, so
// that one store serves either transport; offsets and lengths are checked
// against Size before a call. Methods are called concurrently, from every
// queue's thread.
//
// An error that wraps a syscall.Errno goes to the kernel as that errno,
// anything else as EIO.
type Backend interface {
	// Size is the device's size in bytes, a multiple of 4096.
	Size() int64
	// ReadAt fills p with the bytes at off.
	ReadAt(ctx context.Context, p []byte, off int64) error
	// WriteAt stores p at off; fua asks for it to be durable too.
	WriteAt(ctx context.Context, p []byte, off int64, fua bool) error
	// Trim discards the range; later reads return zeroes.
	Trim(ctx context.Context, off, length int64) error
	// WriteZeroes makes the range read as zeroes; noHole asks that it
	// stay allocated.
	WriteZeroes(ctx context.Context, off, length int64, noHole bool) error
	// Flush returns once every write completed before it is held.
	Flush(ctx context.Context) error
}

// handler runs one queue's requests against the backend. Its data moves
// by USER_COPY: pread and pwrite on /dev/ublkcN at the request's position.
type handler struct {
	ctx     context.Context
	backend Backend
	size    int64
	data    int // /dev/ublkcN, or in tests any file
	q       uint16
}

// serve runs the request in d, tag's, with buf as its data buffer, and
// returns what COMMIT_AND_FETCH reports: the bytes done, or a negative
// errno. Whatever the descriptor says, it does not panic: a descriptor
// the driver should never write (an unknown op, a range past the end, a
// request longer than buf) is answered with an error.
func (h *handler) serve(tag uint16, d ioDesc, buf []byte) int32 {
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
			err = h.copyIn(tag, p)
			if err == nil {
				err = h.backend.WriteAt(h.ctx, p, off, d.OpFlags&ioFlagFUA != 0)
			}
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

// copyIn reads a write's data from the driver into p.
func (h *handler) copyIn(tag uint16, p []byte) error {
	for done := 0; done < len(p); {
		n, err := unix.Pread(h.data, p[done:], userCopyPos(h.q, tag, uint32(done)))
		if err != nil {
			return fmt.Errorf("ublk: reading tag %d's data: %w", tag, err)
		}
		if n == 0 {
			return fmt.Errorf("ublk: reading tag %d's data: %w after %d of %d bytes", tag, unix.EIO, done, len(p))
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
