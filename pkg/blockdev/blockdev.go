// Package blockdev is what a transport serves: the interfaces a store of
// blocks implements so that the NBD server (pkg/nbd) and the ublk server
// (pkg/ublk) serve it as peers, neither importing the other.
//
// Each transport maps a Backend's errors to its own codes: an error that
// wraps a syscall.Errno goes out as that errno where the protocol has it,
// anything else as EIO.
package blockdev

import "context"

// Backend serves a device's blocks. Offsets and lengths are checked
// against Size by the transport before a call. Methods are called
// concurrently.
type Backend interface {
	// Size is the device's size in bytes.
	Size() int64
	// ReadAt fills p with the bytes at off.
	ReadAt(ctx context.Context, p []byte, off int64) error
	// WriteAt stores p at off and returns only once the data is held
	// (fua asks for it to be durable too; for a RAM device the two agree).
	WriteAt(ctx context.Context, p []byte, off int64, fua bool) error
	// Trim discards the range; later reads return zeroes.
	Trim(ctx context.Context, off, length int64) error
	// WriteZeroes makes the range read as zeroes; noHole asks that it stay
	// allocated rather than be punched out.
	WriteZeroes(ctx context.Context, off, length int64, noHole bool) error
	// Flush returns once every write acknowledged before it is held.
	Flush(ctx context.Context) error
}

// WriteReceiver is implemented by a Backend that takes a write's payload
// straight from the transport into memory of its own (gzramd's staging
// area), saving the copy out of a payload buffer. A transport that can
// offers it every write within the device's range; a write it declines
// goes to WriteAt as usual.
type WriteReceiver interface {
	// ReceiveWrite is called before the payload of a write of length
	// bytes at off is read. It returns where the payload goes, or ok
	// false to decline. It must not block for long: the transport reads
	// nothing meanwhile.
	ReceiveWrite(off int64, length int) (r Receipt, ok bool)
	// CompleteWrite stores a write whose payload has been read into r; it
	// is the write's WriteAt, and returns once the data is held.
	CompleteWrite(ctx context.Context, r Receipt, fua bool) error
	// AbortWrite gives r back when its payload could not be read, or its
	// request was dropped before it ran.
	AbortWrite(r Receipt)
}

// Receipt is a Backend's memory for one write's payload.
type Receipt interface {
	// Buffers are where the payload goes, in order: together exactly as
	// long as the write.
	Buffers() [][]byte
}
