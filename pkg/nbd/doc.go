// Package nbd is gzramd's NBD server: the fixed-newstyle handshake and a
// transmission phase that keeps many requests in flight per connection and
// replies as each completes. It knows nothing about compression: exports
// are served by a blockdev.Backend.
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
//
// Errors from a blockdev.Backend map to NBD error codes: an error that
// wraps a syscall.Errno (syscall.ENOSPC, syscall.EINVAL, ...) is sent as
// that code where NBD has it, anything else as EIO. A Backend that is also
// a blockdev.WriteReceiver is offered every write within the export's range.
package nbd
