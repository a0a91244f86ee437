package ublk

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gzramd/gzramd/pkg/blockdev"
)

// recoverWait bounds how long Recover waits for the driver to let go of a
// dead server: it quiesces the device once the server's files are closed,
// which its exit does.
const recoverWait = 10 * time.Second

// quiesceSettle is how long Recover lets the driver finish quiescing a
// device before it sends START_USER_RECOVERY. Linux 6.12's driver says a
// device is quiesced (and takes START) before its work item has
// cancelled the old server's fetches; fetches this process sends in
// between are cancelled with them, and its queues stop with the device
// live. The work is an ordinary kernel thread, which this process's
// realtime threads may keep off the CPU: sleeping lets it run.
const quiesceSettle = 50 * time.Millisecond

// Recover serves device id again: a device created Recoverable whose
// server died, or left it without stopping it. The driver holds the
// device's requests meanwhile, and requeues those the dead server had
// taken; once every queue here has fetched, it makes the device live
// again and sends them. Recover waits up to 10 s for the driver to let go
// of the dead server. From then on it is Serve: it serves until ctx is
// done, then stops and deletes the device. The device keeps its queues,
// their depth and its requests' size: cfg's are not used.
//
// A recovery that fails before the device is live again leaves it as it
// found it, holding its requests, for another try: deleting it would fail
// them, and a swap device's failed reads kill the processes whose pages
// they were.
//
// What a death must not interrupt is short: the queues set up their rings
// and buffers first, and only then does Recover send START_USER_RECOVERY,
// open /dev/ublkcN and have every queue fetch at once, each in one
// submission; they map their descriptors after. A recovering server that
// dies after its START and before any queue fetched leaves a device the
// next takes over. One that dies while some of its queues are ready and
// others not leaves, on Linux 6.12, a device the next START oopses on
// (ublk_queue_reinit puts the not-ready queue's NULL daemon): the queues'
// fetches are microseconds apart to make that unlikely, not impossible.
func Recover(ctx context.Context, cfg Config, id int, backend blockdev.Backend) (err error) {
	if cfg.ControlPath == "" {
		cfg.ControlPath = DefaultControlPath
	}
	if id < 0 {
		return fmt.Errorf("ublk: recovering device %d: no such id", id)
	}
	ctl, err := openControl(cfg.ControlPath)
	if err != nil {
		return err
	}
	defer ctl.Close()
	info, err := quiescedDevice(ctl, uint32(id))
	if err != nil {
		return err
	}
	time.Sleep(quiesceSettle)
	dev := deviceOf(info)
	if err := dev.check(); err != nil {
		return err
	}
	p, err := ctl.params(uint32(id))
	if err != nil {
		return err
	}
	if size := backend.Size(); int64(p.Basic.DevSectors)<<9 != size {
		return fmt.Errorf("ublk: %s holds %d bytes, the backend %d", dev.Block, int64(p.Basic.DevSectors)<<9, size)
	}
	interrupted := false
	begin := func() error {
		err := startRecovery(ctl, uint32(id))
		if errors.Is(err, unix.EINVAL) {
			// A recovery before this one sent START_USER_RECOVERY and
			// died before every queue had fetched: Linux 6.12's driver
			// refuses another START then (no queue is ready), but takes
			// this one's fetches and END_USER_RECOVERY as they are.
			interrupted = true
			return nil
		}
		return err
	}
	live, left := false, false
	defer func() {
		if !live || left {
			return
		}
		if derr := ctl.delDev(uint32(id)); err == nil {
			err = derr
		}
	}()
	left, err = serveDevice(ctx, ctl, dev, cfg, backend, begin, func(ctl *control, dev Device) error {
		err := endRecovery(ctl, dev)
		live = err == nil
		return err
	})
	if err != nil && interrupted && !live {
		return fmt.Errorf("ublk: %s: a recovery before this one died halfway (its START_USER_RECOVERY taken, its queues not all ready), and this kernel's driver does not take the device from there: %w", dev.Block, err)
	}
	return err
}

// ErrNotFound is Find's answer when no device has the tag.
var ErrNotFound = errors.New("ublk: no device with this tag")

// Find returns the id of the device made with tag (Config.Tag), through
// the control device at path (DefaultControlPath if empty), and whether
// it waits to be recovered (its server gone). It looks at every ublk
// device there is (/sys/class/ublk-char).
func Find(path string, tag uint64) (id int, quiesced bool, err error) {
	if path == "" {
		path = DefaultControlPath
	}
	ctl, err := openControl(path)
	if err != nil {
		return 0, false, err
	}
	defer ctl.Close()
	names, err := os.ReadDir("/sys/class/ublk-char")
	if errors.Is(err, os.ErrNotExist) {
		return 0, false, ErrNotFound
	}
	if err != nil {
		return 0, false, fmt.Errorf("ublk: listing devices: %w", err)
	}
	for _, n := range names {
		id, err := strconv.Atoi(strings.TrimPrefix(n.Name(), "ublkc"))
		if err != nil || !strings.HasPrefix(n.Name(), "ublkc") {
			continue
		}
		info, err := ctl.devInfo(uint32(id))
		if err != nil || info.UblksrvFlags != tag {
			continue // gone meanwhile, or another's
		}
		return id, info.State == stateQuiesced, nil
	}
	return 0, false, ErrNotFound
}

// quiescedDevice waits until device id, made to be recovered, is
// quiesced: its server gone, its requests held.
func quiescedDevice(ctl *control, id uint32) (ctrlDevInfo, error) {
	deadline := time.Now().Add(recoverWait)
	for {
		info, err := ctl.devInfo(id)
		switch {
		case errors.Is(err, unix.ENODEV):
			return info, fmt.Errorf("ublk: recovering /dev/ublkb%d: no such device: %w", id, err)
		case err != nil:
			return info, err
		case info.Flags&recoveryFlags != recoveryFlags:
			return info, fmt.Errorf("ublk: /dev/ublkb%d was not made to be recovered (flags %#x): a dead server's device fails its requests and goes", id, info.Flags)
		case info.State == stateQuiesced:
			return info, nil
		case info.State == stateDead:
			return info, fmt.Errorf("ublk: /dev/ublkb%d is stopped, with no disk to recover", id)
		}
		if time.Now().After(deadline) {
			return info, fmt.Errorf("ublk: /dev/ublkb%d is still %s after %v, server pid %d: it was not left by a dead server", id, stateName(info.State), recoverWait, info.UblksrvPid)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// startRecovery sends START_USER_RECOVERY, which the driver refuses
// (EBUSY) while the dead server's /dev/ublkcN is still open: its files
// close as its exit ends, a moment after the device quiesces.
func startRecovery(ctl *control, id uint32) error {
	deadline := time.Now().Add(recoverWait)
	for {
		err := ctl.startRecovery(id)
		if !errors.Is(err, unix.EBUSY) || time.Now().After(deadline) {
			return err
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// endRecovery makes the recovered device live with this process as its
// server, and checks that the driver says so.
func endRecovery(ctl *control, dev Device) error {
	if err := ctl.endRecovery(uint32(dev.ID), os.Getpid()); err != nil {
		return err
	}
	info, err := ctl.devInfo(uint32(dev.ID))
	if err != nil {
		return err
	}
	if info.State != stateLive {
		return fmt.Errorf("ublk: %s is %s after END_USER_RECOVERY, not live", dev.Block, stateName(info.State))
	}
	return nil
}

// RemoveLeft deletes the devices tagged tag (Config.Tag), through the
// control device at path (DefaultControlPath if empty), that a server
// left when it died without stopping them and that nothing can serve
// again: made without recovery, their disk gone with the server (the
// driver stops such a device when its server dies, and keeps it until
// DEL_DEV). A device a server added and has not started yet is left
// alone, as is one being served; one that its server is stopping and
// about to delete may go here first. It returns the ids it deleted.
func RemoveLeft(path string, tag uint64) ([]int, error) {
	if path == "" {
		path = DefaultControlPath
	}
	ctl, err := openControl(path)
	if err != nil {
		return nil, err
	}
	defer ctl.Close()
	names, err := os.ReadDir("/sys/class/ublk-char")
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("ublk: listing devices: %w", err)
	}
	var removed []int
	var errs []error
	for _, n := range names {
		id, err := strconv.Atoi(strings.TrimPrefix(n.Name(), "ublkc"))
		if err != nil || !strings.HasPrefix(n.Name(), "ublkc") {
			continue
		}
		info, err := ctl.devInfo(uint32(id))
		// The driver sets the server's pid to -1 as it stops a device:
		// a device added and not started yet has the pid ADD_DEV gave.
		if err != nil || info.UblksrvFlags != tag || info.Flags&FlagUserRecovery != 0 ||
			info.State != stateDead || info.UblksrvPid != -1 {
			continue
		}
		if err := ctl.delDev(uint32(id)); err != nil {
			errs = append(errs, err)
			continue
		}
		removed = append(removed, id)
	}
	return removed, errors.Join(errs...)
}
