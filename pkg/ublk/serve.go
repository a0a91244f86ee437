package ublk

import (
	"context"
	"errors"
	"fmt"
	"os"
	"runtime"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gzramd/gzramd/internal/osthread"
)

// Config is how a device is served. The zero value serves with the
// defaults.
type Config struct {
	// Queues is the number of hardware queues, each served by a thread
	// and a ring of its own (default min(NumCPU, 4)).
	Queues int
	// Depth is how many requests each queue may hold at once (default 64,
	// at most MaxQueueDepth).
	Depth int
	// MaxIOBytes is the most one request carries (default 128 KiB, a
	// multiple of 4096, at most MaxIOBytes); each tag has a buffer of
	// this size.
	MaxIOBytes int
	// ControlPath is the control device (default DefaultControlPath).
	ControlPath string
	// IOFlusher marks each queue's thread the kernel's IO flusher
	// (PR_SET_IO_FLUSHER, which needs CAP_SYS_RESOURCE): its allocations
	// never wait for I/O, which may be its own to serve. A server of
	// swap needs it, with its memory locked.
	IOFlusher bool
	// Ready, if set, is called once the block device is live.
	Ready func(Device)
}

// Device is a device being served.
type Device struct {
	ID         int
	Block      string // /dev/ublkbN
	Char       string // /dev/ublkcN
	Queues     int
	Depth      int
	MaxIOBytes int
	Flags      uint64 // as the driver set them (UBLK_F_*)
}

const (
	defaultDepth   = 64
	defaultMaxIO   = 128 << 10
	maxQueues      = 4
	blockShift     = 12 // 4 KiB logical and physical blocks
	maxDiscardSect = 1 << 22
)

func (c Config) withDefaults() (Config, error) {
	if c.Queues == 0 {
		c.Queues = min(runtime.NumCPU(), maxQueues)
	}
	if c.Depth == 0 {
		c.Depth = defaultDepth
	}
	if c.MaxIOBytes == 0 {
		c.MaxIOBytes = defaultMaxIO
	}
	if c.ControlPath == "" {
		c.ControlPath = DefaultControlPath
	}
	switch {
	case c.Queues < 1 || c.Queues > runtime.NumCPU():
		return c, fmt.Errorf("ublk: %d queues, want 1 to %d (the CPUs)", c.Queues, runtime.NumCPU())
	case c.Depth < 1 || c.Depth > MaxQueueDepth:
		return c, fmt.Errorf("ublk: queue depth %d, want 1 to %d", c.Depth, MaxQueueDepth)
	case c.MaxIOBytes < 1<<blockShift || c.MaxIOBytes > MaxIOBytes || c.MaxIOBytes%(1<<blockShift) != 0:
		return c, fmt.Errorf("ublk: requests of at most %d bytes, want a multiple of 4096 up to %d", c.MaxIOBytes, MaxIOBytes)
	}
	return c, nil
}

// Serve creates a ublk device of backend's size, serves it until ctx is
// done, then stops and deletes it. The device takes requests by USER_COPY
// (Linux 6.5 or later). Serve returns nil after a clean stop; an error
// from setting up, serving or removing the device otherwise.
func Serve(ctx context.Context, cfg Config, backend Backend) (err error) {
	cfg, err = cfg.withDefaults()
	if err != nil {
		return err
	}
	size := backend.Size()
	if size <= 0 || size%(1<<blockShift) != 0 {
		return fmt.Errorf("ublk: a device of %d bytes, want a positive multiple of 4096", size)
	}
	ctl, err := openControl(cfg.ControlPath)
	if err != nil {
		return err
	}
	defer ctl.Close()

	info, err := ctl.addDev(ctrlDevInfo{
		NrHWQueues:    uint16(cfg.Queues),
		QueueDepth:    uint16(cfg.Depth),
		MaxIOBufBytes: uint32(cfg.MaxIOBytes),
		DevID:         ^uint32(0),
		Flags:         FlagUserCopy | FlagCmdIoctlEncode,
	})
	if err != nil {
		return err
	}
	id := info.DevID
	defer func() {
		if derr := ctl.delDev(id); err == nil {
			err = derr
		}
	}()
	if info.Flags&FlagUserCopy == 0 {
		return fmt.Errorf("ublk: the driver does not copy by pread and pwrite (UBLK_F_USER_COPY, Linux 6.5): flags %#x", info.Flags)
	}
	dev := Device{
		ID:         int(id),
		Block:      fmt.Sprintf("/dev/ublkb%d", id),
		Char:       fmt.Sprintf("/dev/ublkc%d", id),
		Queues:     int(info.NrHWQueues),
		Depth:      int(info.QueueDepth),
		MaxIOBytes: int(info.MaxIOBufBytes),
		Flags:      info.Flags,
	}
	if dev.MaxIOBytes < 1<<blockShift || dev.MaxIOBytes > MaxIOBytes {
		return fmt.Errorf("ublk: the driver set requests of at most %d bytes", dev.MaxIOBytes)
	}
	if err := ctl.setParams(id, deviceParams(size, dev.MaxIOBytes)); err != nil {
		return err
	}
	char, err := openChar(dev.Char)
	if err != nil {
		return err
	}
	// Closed before DEL_DEV (deferred above, so run after), which waits
	// for it.
	defer func() {
		if cerr := char.Close(); err == nil && cerr != nil {
			err = fmt.Errorf("ublk: closing %s: %w", dev.Char, cerr)
		}
	}()
	stopFd, err := unix.Eventfd(0, unix.EFD_CLOEXEC)
	if err != nil {
		return fmt.Errorf("ublk: stop eventfd: %w", err)
	}
	defer unix.Close(stopFd)

	h := handler{ctx: context.WithoutCancel(ctx), backend: backend, size: size, data: int(char.Fd())}
	fetched := make(chan error, dev.Queues)
	done := make(chan error, dev.Queues)
	for i := range dev.Queues {
		q := &queue{id: uint16(i), depth: dev.Depth, maxIO: dev.MaxIOBytes, h: h, stop: stopFd, ioFlusher: cfg.IOFlusher}
		q.h.q = q.id
		go osthread.Run(fmt.Sprintf("ublk%d-q%d", id, i), func() {
			growStack(stackBytes)
			err := q.open()
			if err == nil {
				err = q.fetchAll()
			}
			fetched <- err
			if err == nil {
				err = q.serve()
			}
			// Before saying so: DEL_DEV waits for the fetches that
			// closing the ring cancels.
			q.close()
			done <- err
		})
	}
	running := dev.Queues
	// stopQueues wakes every queue's poll and waits for them all.
	stopQueues := func() error {
		var one = [8]byte{1}
		_, werr := unix.Write(stopFd, one[:])
		var qerr error
		for ; running > 0; running-- {
			qerr = errors.Join(qerr, <-done)
		}
		return errors.Join(werr, qerr)
	}
	var fetchErr error
	for range dev.Queues {
		fetchErr = errors.Join(fetchErr, <-fetched)
	}
	if fetchErr != nil {
		return errors.Join(fetchErr, stopQueues())
	}
	if err := ctl.startDev(id, os.Getpid()); err != nil {
		return errors.Join(err, stopQueues())
	}
	if cfg.Ready != nil {
		cfg.Ready(dev)
	}
	var qerr error
	select {
	case <-ctx.Done():
	case qerr = <-done:
		// A queue stopped on its own: the device cannot be served.
		running--
		if qerr == nil {
			qerr = fmt.Errorf("ublk: queue of %s stopped", dev.Block)
		}
	}
	// STOP_DEV deletes the disk, waiting for what is in flight: the
	// queues serve on meanwhile.
	serr := ctl.stopDev(id)
	return errors.Join(qerr, serr, stopQueues())
}

// deviceParams are the device's parameters: 4 KiB blocks, requests of at
// most maxIO bytes, and discards and zeroing in one segment.
func deviceParams(size int64, maxIO int) params {
	return params{
		Types: paramTypeBasic | paramTypeDiscard,
		Basic: paramBasic{
			// A volatile cache and FUA make the kernel send flushes and
			// FUA writes through, for a backend that may hold writes.
			Attrs:           attrVolatileCache | attrFUA,
			LogicalBSShift:  blockShift,
			PhysicalBSShift: blockShift,
			IOOptShift:      blockShift,
			IOMinShift:      blockShift,
			MaxSectors:      uint32(maxIO >> 9),
			DevSectors:      uint64(size >> 9),
		},
		Discard: paramDiscard{
			DiscardGranularity:    1 << blockShift,
			MaxDiscardSectors:     maxDiscardSect,
			MaxWriteZeroesSectors: maxDiscardSect,
			MaxDiscardSegments:    1,
		},
	}
}

// openChar opens the device's char device, which devtmpfs (or udev) may
// make a moment after ADD_DEV.
func openChar(path string) (*os.File, error) {
	deadline := time.Now().Add(2 * time.Second)
	for {
		f, err := os.OpenFile(path, os.O_RDWR, 0)
		if err == nil {
			return f, nil
		}
		if !errors.Is(err, os.ErrNotExist) || time.Now().After(deadline) {
			return nil, fmt.Errorf("ublk: opening %s: %w", path, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
