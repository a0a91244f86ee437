package ublk

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/gzramd/gzramd/internal/uring"
)

// DefaultControlPath is the driver's control device.
const DefaultControlPath = "/dev/ublk-control"

// ErrNoDriver wraps the error of opening a control device that is not
// there: ublk_drv is not loaded, or the kernel has none.
var ErrNoDriver = errors.New("ublk: no ublk driver (modprobe ublk_drv; Linux 6.0 or later)")

// control sends control commands to /dev/ublk-control through a ring of
// its own. Not safe for concurrent use.
type control struct {
	f    *os.File
	ring *uring.Ring
	// scratch holds a command's buffer while the kernel reads or fills
	// it: memory of its own, since a Go stack may move under the kernel.
	scratch []byte
}

func openControl(path string) (*control, error) {
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("%w: %w", ErrNoDriver, err)
	}
	if errors.Is(err, os.ErrPermission) {
		return nil, fmt.Errorf("ublk: opening %s: %w (serving a ublk device needs root, or CAP_SYS_ADMIN)", path, err)
	}
	if err != nil {
		return nil, fmt.Errorf("ublk: opening %s: %w", path, err)
	}
	ring, err := uring.New(4, 0)
	if errors.Is(err, uring.ErrUnsupported) {
		f.Close()
		return nil, fmt.Errorf("ublk: control ring: %w (ublk needs io_uring: sysctl kernel.io_uring_disabled=0)", err)
	}
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("ublk: control ring: %w", err)
	}
	scratch, err := unix.Mmap(-1, 0, os.Getpagesize(), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		ring.Close()
		f.Close()
		return nil, fmt.Errorf("ublk: control buffer: %w", err)
	}
	return &control{f: f, ring: ring, scratch: scratch}, nil
}

func (c *control) Close() error {
	err := c.ring.Close()
	_ = unix.Munmap(c.scratch)
	if cerr := c.f.Close(); err == nil {
		err = cerr
	}
	return err
}

// cmd sends control command op with header h and waits for its result.
// buf, if any, is the command's in and out buffer: the kernel reads it
// and may fill it in (h.Addr and h.Len are set to a copy of it).
func (c *control) cmd(op uint32, h ctrlCmd, buf []byte) (int32, error) {
	// The command's completion is posted through the submitting thread's
	// task work: wait on that thread.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if len(buf) > len(c.scratch) {
		return 0, fmt.Errorf("ublk: a control buffer of %d bytes", len(buf))
	}
	if len(buf) > 0 {
		copy(c.scratch, buf)
		h.Addr = uint64(uintptr(unsafe.Pointer(&c.scratch[0])))
		h.Len = uint16(len(buf))
	}
	payload := (*[ctrlCmdSize]byte)(unsafe.Pointer(&h))
	e := c.ring.NextSQE()
	if e == nil {
		return 0, errors.New("ublk: the control ring is full")
	}
	if err := e.PrepUringCmd(int(c.f.Fd()), op, payload[:], uint64(op)); err != nil {
		return 0, err
	}
	if err := c.ring.Submit(1); err != nil {
		return 0, err
	}
	var res int32
	c.ring.Reap(func(cqe uring.CQE) { res = cqe.Res })
	copy(buf, c.scratch)
	if res < 0 {
		return res, unix.Errno(-res)
	}
	return res, nil
}

// devCmd sends a command about device id with no buffer.
func (c *control) devCmd(op uint32, id uint32, data uint64) error {
	_, err := c.cmd(op, ctrlCmd{DevID: id, QueueID: 0xffff, Data: data}, nil)
	return err
}

// addDev creates a device as info asks (DevID ^0 picks a free id) and
// returns info as the kernel filled it in.
func (c *control) addDev(info ctrlDevInfo) (ctrlDevInfo, error) {
	b := (*[unsafe.Sizeof(info)]byte)(unsafe.Pointer(&info))
	if _, err := c.cmd(cmdAddDev, ctrlCmd{DevID: info.DevID, QueueID: 0xffff}, b[:]); err != nil {
		return info, addDevError(err, info.Flags)
	}
	return info, nil
}

func (c *control) devInfo(id uint32) (ctrlDevInfo, error) {
	var info ctrlDevInfo
	b := (*[unsafe.Sizeof(ctrlDevInfo{})]byte)(unsafe.Pointer(&info))
	if _, err := c.cmd(cmdGetDevInfo, ctrlCmd{DevID: id, QueueID: 0xffff}, b[:]); err != nil {
		return info, fmt.Errorf("ublk: GET_DEV_INFO %d: %w", id, err)
	}
	return info, nil
}

func (c *control) setParams(id uint32, p params) error {
	p.Len = paramsLen
	b := (*[unsafe.Sizeof(params{})]byte)(unsafe.Pointer(&p))
	if _, err := c.cmd(cmdSetParams, ctrlCmd{DevID: id, QueueID: 0xffff}, b[:]); err != nil {
		return fmt.Errorf("ublk: SET_PARAMS %d: %w", id, err)
	}
	return nil
}

// startDev makes the block device live; the driver waits until every
// queue has fetched every tag, and pid is the server's.
func (c *control) startDev(id uint32, pid int) error {
	if err := c.devCmd(cmdStartDev, id, uint64(pid)); err != nil {
		return fmt.Errorf("ublk: START_DEV %d: %w", id, err)
	}
	return nil
}

func (c *control) params(id uint32) (params, error) {
	p := params{Len: paramsLen}
	b := (*[unsafe.Sizeof(params{})]byte)(unsafe.Pointer(&p))
	if _, err := c.cmd(cmdGetParams, ctrlCmd{DevID: id, QueueID: 0xffff}, b[:]); err != nil {
		return p, fmt.Errorf("ublk: GET_PARAMS %d: %w", id, err)
	}
	return p, nil
}

// startRecovery readies a device whose server died for another's queues.
func (c *control) startRecovery(id uint32) error {
	if err := c.devCmd(cmdStartUserRecovery, id, 0); err != nil {
		return fmt.Errorf("ublk: START_USER_RECOVERY %d: %w", id, err)
	}
	return nil
}

// endRecovery makes a recovered device live again; the driver waits
// until every queue has fetched every tag, and pid is the new server's.
func (c *control) endRecovery(id uint32, pid int) error {
	if err := c.devCmd(cmdEndUserRecovery, id, uint64(pid)); err != nil {
		return fmt.Errorf("ublk: END_USER_RECOVERY %d: %w", id, err)
	}
	return nil
}

func (c *control) stopDev(id uint32) error {
	if err := c.devCmd(cmdStopDev, id, 0); err != nil {
		return fmt.Errorf("ublk: STOP_DEV %d: %w", id, err)
	}
	return nil
}

// delDev removes the device; the driver waits until /dev/ublkcN is
// closed.
func (c *control) delDev(id uint32) error {
	if err := c.devCmd(cmdDelDev, id, 0); err != nil {
		return fmt.Errorf("ublk: DEL_DEV %d: %w", id, err)
	}
	return nil
}

// addDevError says what ADD_DEV's error means: the driver answers EINVAL
// to flags it does not know, which for the flags asked here means a
// kernel older than USER_COPY (6.5), and EPERM to a caller without
// CAP_SYS_ADMIN.
func addDevError(err error, flags uint64) error {
	switch {
	case errors.Is(err, unix.EINVAL) && flags&FlagUserCopy != 0:
		return fmt.Errorf("ublk: ADD_DEV: %w: this kernel (%s) does not take a device with UBLK_F_USER_COPY, which came in Linux 6.5", err, kernelRelease())
	case errors.Is(err, unix.EPERM), errors.Is(err, unix.EACCES):
		return fmt.Errorf("ublk: ADD_DEV: %w (creating a ublk device needs CAP_SYS_ADMIN)", err)
	}
	return fmt.Errorf("ublk: ADD_DEV: %w", err)
}

// kernelRelease is uname -r, or "unknown".
func kernelRelease() string {
	var u unix.Utsname
	if unix.Uname(&u) != nil {
		return "unknown"
	}
	return unix.ByteSliceToString(u.Release[:])
}

// Probe reports whether a device could be served here, without making
// one: the control device at path (DefaultControlPath if empty) opens for
// reading and writing and a ring can be set up to send it commands. Its
// error says what is missing (ErrNoDriver: the module is not loaded). A
// kernel without USER_COPY passes; Serve then fails at ADD_DEV, saying so.
func Probe(path string) error {
	if path == "" {
		path = DefaultControlPath
	}
	ctl, err := openControl(path)
	if err != nil {
		return err
	}
	return ctl.Close()
}
