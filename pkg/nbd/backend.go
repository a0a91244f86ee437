// Package nbd is gzramd's NBD server: the fixed-newstyle handshake and a
// transmission phase that keeps many requests in flight per connection and
// replies as each completes. It knows nothing about compression: exports
// are served by a Backend.
package nbd

import "context"

// Backend serves one export. Offsets and lengths are already checked
// against Size by the server. Methods are called concurrently.
//
// Errors map to NBD error codes: an error that wraps a syscall.Errno
// (syscall.ENOSPC, syscall.EINVAL, ...) is sent as that code, anything else
// as EIO.
type Backend interface {
	// Size is the export size in bytes.
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
