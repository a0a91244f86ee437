// Package nbd is gzramd's NBD server: the fixed-newstyle handshake and a
// transmission phase that keeps many requests in flight per connection and
// replies as each completes. It knows nothing about compression: exports
// are served by a Backend.
//
// Serving:
//
//	srv, err := nbd.NewServer([]nbd.Export{{Name: "gzram0", Backend: dev}}, nbd.Options{})
//	go srv.Serve(unixListener) // any number of listeners
//	go srv.Serve(tcpListener)
//	...
//	srv.Shutdown(ctx) // stop reading, finish and answer what is in flight
//
// Each connection has one reader goroutine, which parses requests into
// recycled request structs with pooled payload buffers, and up to
// Options.MaxInFlight worker goroutines that run them against the Backend.
// Replies leave in completion order; the worker that finds no write under
// way writes every queued reply in one writev. Nothing on that path
// allocates in steady state (BenchmarkRequests).
//
// The client side of the handshake (Dial, Negotiate) is here too, for the
// kernel's device (package nbddev) and for tests.
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

// WriteReceiver is implemented by a Backend that takes a write's payload
// straight from the connection into memory of its own (gzramd's staging
// area), saving the copy out of a payload buffer. The server offers it
// every write within the export's range; a write it declines goes to
// WriteAt as usual.
type WriteReceiver interface {
	// ReceiveWrite is called before the payload of a write of length
	// bytes at off is read. It returns where the payload goes, or ok
	// false to decline. It must not block for long: the connection reads
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
