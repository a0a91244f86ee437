// Package iolog records the requests an NBD server receives as a trace in
// fio's iolog format, version 2, so that a real workload (a kernel
// swapping through gzramd) can be replayed later, on any block device or
// NBD server:
//
//	fio --name=replay --read_iolog=TRACE --replay_redirect=/dev/DEVICE --replay_no_stall=1 --iodepth=32 ...
//
// A Recorder is an nbd.Recorder. The request path only copies a request's
// command, offset and length into a fixed ring of records, allocated and
// written when the Recorder is made; a goroutine of the Recorder's drains
// the ring every few milliseconds and writes the lines through a buffer.
// When the ring is full the request is not recorded, only counted
// (Dropped): a request never waits for the trace.
//
// NBD's read, write and trim become fio's read, write and trim; a flush
// becomes a sync. fio has no action for write-zeroes, which is recorded as
// a trim: both leave the range reading as zeroes, and on a RAM device
// (gzramd, zram, nbdkit's memory plugin) both free it, where a write would
// store data. fio replays trims from version 3.34 on; older versions skip
// each with the line "bad ddir: 2". Requests of length zero, which
// change nothing, are left out: fio replays nothing at all of a trace that
// holds one.
package iolog

import (
	"bufio"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gzramd/gzramd/pkg/nbd"
)

const (
	// ringRecords is the ring's capacity: 1.5 MiB of 24-byte slots, 65 ms
	// of requests at a million a second between two drains 10 ms apart.
	ringRecords = 1 << 16
	// drainInterval is how often the ring is drained while recording.
	drainInterval = 10 * time.Millisecond
	// bufferSize is the file writer's buffer.
	bufferSize = 256 << 10
	// warnInterval spaces the warnings about dropped records.
	warnInterval = time.Second
)

// Recorder writes the requests it is told about to a trace file.
type Recorder struct {
	ring    *ring
	dropped atomic.Uint64
	written atomic.Uint64

	// The drainer's, and Close's once the drainer is gone.
	path     string
	name     []byte // the file name on every line
	out      io.WriteCloser
	w        *bufio.Writer
	line     []byte
	err      error  // the first write error; nothing is written after it
	pending  uint64 // lines buffered since the last flush
	warned   uint64 // dropped records already warned about
	warnedAt time.Time
	log      *slog.Logger

	stop      chan struct{}
	done      chan struct{}
	closeOnce sync.Once
	closeErr  error
}

// Create starts a trace in a new file at path (replacing one there; mode
// 0600, as a swap device's access pattern is nobody else's business), in
// which every line names the file name (an export name, say). fio reads a
// name up to its first blank: blanks and control bytes become '_'.
func Create(path, name string, log *slog.Logger) (*Recorder, error) {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return nil, fmt.Errorf("creating the trace: %w", err)
	}
	r := newRecorder(f, path, name, ringRecords, log)
	if err := r.writeHeader(); err != nil {
		f.Close()
		return nil, fmt.Errorf("writing the trace's header to %s: %w", path, err)
	}
	go r.run()
	r.log.Info("trace: recording NBD requests", "file", path)
	return r, nil
}

// newRecorder returns a Recorder writing to out with a ring of records
// slots; its drainer is not started.
func newRecorder(out io.WriteCloser, path, name string, records int, log *slog.Logger) *Recorder {
	if log == nil {
		log = slog.Default()
	}
	return &Recorder{
		ring: newRing(records),
		path: path,
		name: fileName(name),
		out:  out,
		w:    bufio.NewWriterSize(out, bufferSize),
		// The longest line: the name, "write", two numbers, blanks.
		line: make([]byte, 0, 256+64),
		log:  log,
		stop: make(chan struct{}),
		done: make(chan struct{}),
	}
}

// fileName makes name fit for a trace line: fio reads a file name with
// scanf's %256s, up to the first blank and at most 256 bytes.
func fileName(name string) []byte {
	b := []byte(name)
	if len(b) > 256 {
		b = b[:256]
	}
	for i, c := range b {
		if c <= ' ' || c == 0x7f {
			b[i] = '_'
		}
	}
	if len(b) == 0 {
		return []byte("nbd")
	}
	return b
}

// RecordRequest implements nbd.Recorder: it puts the request in the ring,
// or counts it as dropped when the ring is full. It neither allocates nor
// waits.
func (r *Recorder) RecordRequest(cmd nbd.Command, off uint64, length uint32) {
	switch cmd {
	case nbd.CmdRead, nbd.CmdWrite, nbd.CmdTrim, nbd.CmdWriteZeroes:
		if length == 0 {
			return
		}
	case nbd.CmdFlush:
		off, length = 0, 0
	default:
		return
	}
	if !r.ring.push(record{off: off, length: length, cmd: cmd}) {
		r.dropped.Add(1)
	}
}

// Written returns the number of requests written to the trace so far.
func (r *Recorder) Written() uint64 { return r.written.Load() }

// Dropped returns the number of requests left out of the trace: those
// that found the ring full, and those a failed write lost.
func (r *Recorder) Dropped() uint64 { return r.dropped.Load() }

// Close records what the ring still holds, ends the trace with fio's
// close line, closes the file and logs how many requests the trace holds
// and how many were dropped. Requests told about later are not recorded.
// It returns the first error writing the trace met (logged when it
// happened).
func (r *Recorder) Close() error {
	r.closeOnce.Do(func() {
		close(r.stop)
		<-r.done
		r.closeErr = r.finish()
	})
	return r.closeErr
}

// run drains the ring until Close.
func (r *Recorder) run() {
	defer close(r.done)
	t := time.NewTicker(drainInterval)
	defer t.Stop()
	for {
		select {
		case <-r.stop:
			r.drain()
			return
		case now := <-t.C:
			r.drain()
			r.warnDropped(now)
		}
	}
}

func (r *Recorder) writeHeader() error {
	r.w.WriteString("fio version 2 iolog\n")
	r.writeFileAction("add")
	r.writeFileAction("open")
	return r.w.Flush()
}

func (r *Recorder) writeFileAction(action string) {
	r.line = append(append(append(r.line[:0], r.name...), ' '), action...)
	r.line = append(r.line, '\n')
	r.w.Write(r.line)
}

// drain writes every record in the ring, then flushes the buffer, so
// that the file is never more than a drain behind.
func (r *Recorder) drain() {
	for {
		rec, ok := r.ring.pop()
		if !ok {
			break
		}
		if r.err != nil {
			r.dropped.Add(1)
			continue
		}
		r.line = appendLine(r.line[:0], r.name, rec)
		if _, err := r.w.Write(r.line); err != nil {
			r.fail(err, 1)
			continue
		}
		r.pending++
	}
	if r.pending > 0 && r.err == nil {
		if err := r.w.Flush(); err != nil {
			r.fail(err, 0)
			return
		}
		r.written.Add(r.pending)
		r.pending = 0
	}
}

// fail stops writing after err; the lines still buffered, and lost
// records besides, count as dropped.
func (r *Recorder) fail(err error, lost uint64) {
	r.err = fmt.Errorf("writing the trace to %s: %w", r.path, err)
	r.dropped.Add(r.pending + lost)
	r.pending = 0
	r.log.Error("trace: writing failed; recording no more requests", "err", r.err)
}

// appendLine appends rec's line: "NAME ACTION OFFSET LENGTH\n".
func appendLine(b, name []byte, rec record) []byte {
	b = append(append(b, name...), ' ')
	switch rec.cmd {
	case nbd.CmdRead:
		b = append(b, "read "...)
	case nbd.CmdWrite:
		b = append(b, "write "...)
	case nbd.CmdFlush:
		b = append(b, "sync "...)
	default: // trim, write-zeroes
		b = append(b, "trim "...)
	}
	b = strconv.AppendUint(b, rec.off, 10)
	b = append(b, ' ')
	b = strconv.AppendUint(b, uint64(rec.length), 10)
	return append(b, '\n')
}

// warnDropped logs the requests dropped since the last warning, at most
// once every warnInterval.
func (r *Recorder) warnDropped(now time.Time) {
	d := r.dropped.Load()
	if d == r.warned || now.Sub(r.warnedAt) < warnInterval {
		return
	}
	r.log.Warn("trace: requests not recorded: the trace writer fell behind",
		"file", r.path, "dropped", d-r.warned, "dropped_total", d)
	r.warned, r.warnedAt = d, now
}

// finish ends the trace once the drainer is gone.
func (r *Recorder) finish() error {
	r.drain()
	if r.err == nil {
		r.writeFileAction("close")
		if err := r.w.Flush(); err != nil {
			r.fail(err, 0)
		}
	}
	err := r.err
	if cerr := r.out.Close(); cerr != nil && err == nil {
		err = fmt.Errorf("closing the trace %s: %w", r.path, cerr)
		r.log.Error("trace: closing failed", "err", err)
	}
	r.log.Info("trace closed", "file", r.path, "requests", r.written.Load(), "dropped", r.dropped.Load())
	return err
}
