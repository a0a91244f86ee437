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
	"github.com/gzramd/gzramd/pkg/blockdev"
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
	// multiple of 4096, at most MaxIOBytes); each queue has a buffer
	// of this size.
	MaxIOBytes int
	// ControlPath is the control device (default DefaultControlPath).
	ControlPath string
	// Recoverable creates the device to outlive its server: when the
	// serving process dies, the driver holds the device's requests,
	// those the dead server had taken included, until Recover serves it
	// again in another process (UBLK_F_USER_RECOVERY and
	// UBLK_F_USER_RECOVERY_REISSUE). A swap device needs it: without
	// it, a dead server's device fails every request, and each failed
	// swap-in kills the process whose page it was.
	Recoverable bool
	// Tag is the caller's, kept by the driver with the device (its
	// ublksrv_flags): Find finds the device by it, after its server's
	// death, as a taken-over state's own id.
	Tag uint64
	// IOFlusher marks each queue's thread the kernel's IO flusher
	// (PR_SET_IO_FLUSHER, which needs CAP_SYS_RESOURCE): its allocations
	// never wait for I/O, which may be its own to serve. A server of
	// swap needs it, with its memory locked.
	IOFlusher bool
	// Ready, if set, is called once the block device is live.
	Ready func(Device)
	// Observer, if set, is told of every request served.
	Observer Observer
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

// ErrLeave, as the cause of the context Serve or Recover serves until
// (context.WithCancelCause), has them leave a Recoverable device to the
// next server rather than stop and delete it: the requests in hand are
// answered, the queues close, and the driver holds the device's requests
// until Recover, in this process or another, serves it again. It is
// how a server hands its device over at an upgrade.
var ErrLeave = errors.New("ublk: the device is left to the next server")

// Serve creates a ublk device of backend's size, serves it until ctx is
// done, then stops and deletes it (or leaves it: ErrLeave). The device
// takes requests by USER_COPY (Linux 6.5 or later). Serve returns nil
// after a clean stop or leave; an error from setting up, serving or
// removing the device otherwise.
func Serve(ctx context.Context, cfg Config, backend blockdev.Backend) (err error) {
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
	dev, err := addDevice(ctl, cfg)
	if err != nil {
		return err
	}
	left := false
	defer func() {
		if left {
			return
		}
		if derr := ctl.delDev(uint32(dev.ID)); err == nil {
			err = derr
		}
	}()
	if err := ctl.setParams(uint32(dev.ID), deviceParams(size, dev.MaxIOBytes)); err != nil {
		return err
	}
	left, err = serveDevice(ctx, ctl, dev, cfg, backend, nil, func(ctl *control, dev Device) error {
		if err := start(ctl, dev); err != nil {
			return errors.Join(err, ctl.stopDev(uint32(dev.ID)))
		}
		return nil
	})
	return err
}

// recoveryFlags make a device that outlives its server (Config.Recoverable).
const recoveryFlags = FlagUserRecovery | FlagUserRecoveryReissue

// addDevice creates the device with USER_COPY and returns it as the driver
// made it. Past ADD_DEV, an error leaves it for the caller to delete.
func addDevice(ctl *control, cfg Config) (Device, error) {
	flags := uint64(FlagUserCopy | FlagCmdIoctlEncode)
	if cfg.Recoverable {
		flags |= recoveryFlags
	}
	info, err := ctl.addDev(ctrlDevInfo{
		NrHWQueues:    uint16(cfg.Queues),
		QueueDepth:    uint16(cfg.Depth),
		MaxIOBufBytes: uint32(cfg.MaxIOBytes),
		DevID:         ^uint32(0),
		Flags:         flags,
		UblksrvFlags:  cfg.Tag,
	})
	if err != nil {
		return Device{}, err
	}
	dev := deviceOf(info)
	switch {
	case info.Flags&recoveryFlags != flags&recoveryFlags:
		err = fmt.Errorf("ublk: the driver does not keep a device for recovery (UBLK_F_USER_RECOVERY and _REISSUE): flags %#x", info.Flags)
	default:
		err = dev.check()
	}
	return dev, err
}

// deviceOf is the device the driver describes with info.
func deviceOf(info ctrlDevInfo) Device {
	return Device{
		ID:         int(info.DevID),
		Block:      fmt.Sprintf("/dev/ublkb%d", info.DevID),
		Char:       fmt.Sprintf("/dev/ublkc%d", info.DevID),
		Queues:     int(info.NrHWQueues),
		Depth:      int(info.QueueDepth),
		MaxIOBytes: int(info.MaxIOBufBytes),
		Flags:      info.Flags,
	}
}

// check checks what the driver set against what this server can serve.
func (dev Device) check() error {
	switch {
	case dev.Flags&FlagUserCopy == 0:
		return fmt.Errorf("ublk: the driver does not copy by pread and pwrite (UBLK_F_USER_COPY, Linux 6.5): flags %#x", dev.Flags)
	case dev.MaxIOBytes < 1<<blockShift || dev.MaxIOBytes > MaxIOBytes:
		return fmt.Errorf("ublk: the driver set requests of at most %d bytes", dev.MaxIOBytes)
	case dev.Queues < 1 || dev.Depth < 1 || dev.Depth > MaxQueueDepth:
		return fmt.Errorf("ublk: the driver set %d queues of depth %d", dev.Queues, dev.Depth)
	}
	return nil
}

// serveDevice runs the queues of an added device, makes it live once they
// have fetched (live: START_DEV, or END_USER_RECOVERY), serves until ctx
// is done or a queue fails, and stops it, or leaves it to the next server
// (ErrLeave), which it reports. begin, if set, runs once the queues have
// set up what they can without the char device, and before it is opened
// (START_USER_RECOVERY).
func serveDevice(ctx context.Context, ctl *control, dev Device, cfg Config, backend blockdev.Backend, begin func() error, live func(*control, Device) error) (left bool, err error) {
	qs, err := startQueues(dev, cfg.IOFlusher)
	if err != nil {
		return false, err
	}
	if err := qs.waitPrepared(); err != nil {
		return false, errors.Join(err, qs.abort())
	}
	if begin != nil {
		if err := begin(); err != nil {
			return false, errors.Join(err, qs.abort())
		}
	}
	char, err := openChar(dev.Char)
	if err != nil {
		return false, errors.Join(err, qs.abort())
	}
	// Closed before DEL_DEV, which waits for it; after the queues.
	defer func() {
		if cerr := char.Close(); err == nil && cerr != nil {
			err = fmt.Errorf("ublk: closing %s: %w", dev.Char, cerr)
		}
	}()
	qs.attach(newHandler(context.WithoutCancel(ctx), backend, cfg.Observer, int(char.Fd())))
	ferr := qs.waitFetched()
	// Only now, every queue ready, are the descriptors mapped: the
	// driver lets only the process that mapped them first map them
	// until the next START_USER_RECOVERY, so a recovering server that
	// died before its queues were ready must not have mapped them.
	qs.mapDescs()
	if err := errors.Join(ferr, qs.waitMapped()); err != nil {
		return false, errors.Join(err, qs.stop())
	}
	if err := live(ctl, dev); err != nil {
		return false, errors.Join(err, qs.stop())
	}
	if cfg.Ready != nil {
		cfg.Ready(dev)
	}
	var qerr error
	select {
	case <-ctx.Done():
		if errors.Is(context.Cause(ctx), ErrLeave) && dev.Flags&recoveryFlags == recoveryFlags {
			// The driver holds what comes next, and requeues what the
			// queues took and did not answer.
			return true, qs.stop()
		}
	case qerr = <-qs.done:
		// A queue stopped on its own: the device cannot be served.
		qs.running--
		if qerr == nil {
			qerr = fmt.Errorf("ublk: a queue of %s stopped", dev.Block)
		}
	}
	// STOP_DEV deletes the disk, waiting for what is in flight: the
	// queues serve on meanwhile.
	serr := ctl.stopDev(uint32(dev.ID))
	return false, errors.Join(qerr, serr, qs.stop())
}

// start makes the device live and checks that the driver says so.
func start(ctl *control, dev Device) error {
	if err := ctl.startDev(uint32(dev.ID), os.Getpid()); err != nil {
		return err
	}
	info, err := ctl.devInfo(uint32(dev.ID))
	if err != nil {
		return err
	}
	if info.State != stateLive {
		return fmt.Errorf("ublk: %s is %s after START_DEV, not live", dev.Block, stateName(info.State))
	}
	return nil
}

// queues are a device's queues, each run by a goroutine on a thread of
// its own.
type queues struct {
	stopFd   int           // eventfd every queue polls: written to stop them
	prepared chan error    // one a queue, once it has set up its own
	attached chan struct{} // closed once handler is set, or given up on (handler.data < 0)
	handler  handler       // the char device's handler, every queue's
	fetched  chan error    // one a queue, once it has fetched every tag
	toMap    chan struct{} // closed once every queue has fetched, or failed to
	mapped   chan error    // one a queue that fetched, once it has mapped its descriptors
	done     chan error    // one a queue, once it has stopped
	running  int           // queues not yet stopped
	fetching int           // queues that fetched: as many send on mapped
}

func startQueues(dev Device, ioFlusher bool) (*queues, error) {
	stopFd, err := unix.Eventfd(0, unix.EFD_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("ublk: stop eventfd: %w", err)
	}
	qs := &queues{stopFd: stopFd, prepared: make(chan error, dev.Queues), attached: make(chan struct{}),
		fetched: make(chan error, dev.Queues), toMap: make(chan struct{}), mapped: make(chan error, dev.Queues),
		done: make(chan error, dev.Queues), running: dev.Queues, handler: handler{data: -1}}
	for i := range dev.Queues {
		q := &queue{id: uint16(i), depth: dev.Depth, maxIO: dev.MaxIOBytes, stop: stopFd, ioFlusher: ioFlusher}
		go osthread.Run(fmt.Sprintf("ublk%d-q%d", dev.ID, i), func() { qs.run(q) })
	}
	return qs, nil
}

// run is one queue's life: set up, fetch, map its descriptors, serve,
// close.
func (qs *queues) run(q *queue) {
	growStack(stackBytes)
	err := q.prepare()
	qs.prepared <- err
	// Every queue fetches at the one signal, and in one submission: a
	// recovering server that dies while some of its queues are ready and
	// others not leaves Linux 6.12's driver a device that its next
	// START_USER_RECOVERY oopses on (see Recover).
	<-qs.attached
	switch {
	case err != nil:
	case qs.handler.data < 0:
		err = errGaveUp
	default:
		q.attach(qs.handler)
		err = q.fetchAll()
	}
	qs.fetched <- err
	if err == nil {
		<-qs.toMap
		err = q.mapDescs()
		qs.mapped <- err
	}
	if err == nil {
		err = q.serve()
	}
	// Before saying so: DEL_DEV waits for the fetches that closing the
	// ring cancels.
	q.close()
	// The thread ends with the goroutine (locked once more than
	// osthread.Run unlocks): the driver keeps it as the queue's server,
	// and recovers the device only from a server whose threads are gone.
	runtime.LockOSThread()
	qs.done <- err
}

// errGaveUp ends a queue that was set up for a device given up on before
// it was opened.
var errGaveUp = errors.New("ublk: given up before the device was opened")

// waitPrepared waits until every queue has set up its own, or failed to.
func (qs *queues) waitPrepared() error {
	var err error
	for range cap(qs.prepared) {
		err = errors.Join(err, <-qs.prepared)
	}
	return err
}

// attach has every queue serve through h's char device, and fetch.
func (qs *queues) attach(h handler) {
	qs.handler = h
	close(qs.attached)
}

// abort ends queues that were never attached.
func (qs *queues) abort() error {
	close(qs.attached)
	err := qs.stop()
	if errors.Is(err, errGaveUp) {
		err = nil
	}
	return err
}

// waitFetched waits until every queue has fetched, or failed to.
func (qs *queues) waitFetched() error {
	var errs []error
	for range cap(qs.fetched) {
		err := <-qs.fetched
		if err == nil {
			qs.fetching++
		}
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// mapDescs has the queues that fetched map their descriptors.
func (qs *queues) mapDescs() {
	close(qs.toMap)
}

// waitMapped waits until every queue that fetched has mapped its
// descriptors, or failed to.
func (qs *queues) waitMapped() error {
	var err error
	for range qs.fetching {
		err = errors.Join(err, <-qs.mapped)
	}
	return err
}

// stop wakes every queue's poll, waits for those still running and
// closes the eventfd.
func (qs *queues) stop() error {
	one := [8]byte{1}
	_, err := unix.Write(qs.stopFd, one[:])
	for ; qs.running > 0; qs.running-- {
		err = errors.Join(err, <-qs.done)
	}
	return errors.Join(err, unix.Close(qs.stopFd))
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
