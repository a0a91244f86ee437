package nbd

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// A netlink-attached device outlives its server: when the server's
// sockets close, the kernel marks them dead, holds new requests for up to
// the dead-connection timeout, and re-queues the requests that were in
// flight when their request timeout fires. A new server process (or the
// same one after losing its sockets) dials the export again and hands the
// kernel new sockets with NBD_CMD_RECONFIGURE; the held and re-queued
// requests then go out on them (drivers/block/nbd.c: nbd_handle_cmd,
// wait_for_reconnect, nbd_xmit_timeout, nbd_reconnect_socket).
//
// Every request may therefore reach a server twice, or reach the next
// server after the first one died running it: the Backend must make each
// safe to repeat.

// ErrNotSurvivable says a kernel device fails its I/O when its server
// goes, so that a restart of the server loses whatever is swapped to it.
var ErrNotSurvivable = errors.New("nbd: the kernel device does not survive its server")

// ErrNoKernelDevice says no connected /dev/nbdN matches what was asked for:
// there is nothing to reattach, and the export may be attached afresh.
var ErrNoKernelDevice = errors.New("nbd: no connected kernel device")

// SurvivesRestart reports whether the device's I/O waits for a new server
// when this one goes: nil, or an error wrapping ErrNotSurvivable that says
// why not, for the caller to log.
func (d *KernelDevice) SurvivesRestart() error {
	switch {
	case !d.Netlink:
		return fmt.Errorf("%w: %s is attached with the ioctl interface, which has no dead-connection timeout and takes no new sockets", ErrNotSurvivable, d.Path)
	case d.opts.DeadConnTimeout < 0:
		return fmt.Errorf("%w: %s has no dead-connection timeout: its I/O fails as soon as the server goes", ErrNotSurvivable, d.Path)
	case d.opts.Timeout < 0:
		return fmt.Errorf("%w: %s has no request timeout: requests in flight when the server goes wait for the kernel's 30-second check, and Reconnect cannot tell which sockets the kernel kept", ErrNotSurvivable, d.Path)
	}
	return nil
}

// FindKernelDevice returns the index of the connected /dev/nbdN whose
// /sys/block/nbdN/backend is backendID: how a new server process finds
// the device its predecessor attached. The error wraps ErrNoKernelDevice
// when there is none (the kernel may also predate backend identifiers,
// Linux 5.14).
func FindKernelDevice(backendID string) (int, error) {
	if backendID == "" {
		return 0, errors.New("nbd: find kernel device: empty backend identifier")
	}
	entries, err := os.ReadDir(sysBlock)
	if err != nil {
		return 0, fmt.Errorf("nbd: listing %s: %w", sysBlock, err)
	}
	var found []int
	for _, e := range entries {
		s, ok := strings.CutPrefix(e.Name(), "nbd")
		if !ok {
			continue
		}
		n, err := strconv.Atoi(s)
		if err != nil {
			continue
		}
		id, ok, err := readBackendID(n)
		if err != nil || !ok || id != backendID {
			continue
		}
		if busy, err := DeviceInUse(n); err == nil && busy {
			found = append(found, n)
		}
	}
	switch len(found) {
	case 0:
		return 0, fmt.Errorf("%w with backend %q in %s", ErrNoKernelDevice, backendID, sysBlock)
	case 1:
		return found[0], nil
	}
	return 0, fmt.Errorf("nbd: find kernel device: backend %q is connected as nbd%v: give the index", backendID, found)
}

// deviceConnections counts /sys/block/nbdN/mq's entries: the kernel gives
// a connected device one hardware queue per connection (nbd_start_device).
func deviceConnections(index int) (int, error) {
	entries, err := os.ReadDir(filepath.Join(sysBlock, "nbd"+strconv.Itoa(index), "mq"))
	if err != nil {
		return 0, fmt.Errorf("nbd: /dev/nbd%d hardware queues: %w", index, err)
	}
	n := 0
	for _, e := range entries {
		if _, err := strconv.Atoi(e.Name()); err == nil {
			n++
		}
	}
	if n == 0 {
		return 0, fmt.Errorf("nbd: /dev/nbd%d has no hardware queues in sysfs", index)
	}
	return n, nil
}

// deviceSize reads /sys/block/nbdN/size, in bytes.
func deviceSize(index int) (uint64, error) {
	b, err := os.ReadFile(filepath.Join(sysBlock, "nbd"+strconv.Itoa(index), "size"))
	if err != nil {
		return 0, fmt.Errorf("nbd: /dev/nbd%d size: %w", index, err)
	}
	sectors, err := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("nbd: /dev/nbd%d size %q: %w", index, b, err)
	}
	return sectors << 9, nil
}

// ReattachKernel takes over a /dev/nbdN that an earlier server process
// attached with AttachKernel and that is waiting for its server: the one
// at opts.Index, or, with AnyDevice, the one FindKernelDevice finds for
// opts.BackendID. It dials the export as often as the device has
// connections, checks that its size is the device's, and hands the
// sockets over with Reconnect. opts must be the ones the device was
// attached with (BackendID especially: the kernel refuses another);
// Connections is ignored. ctx bounds the whole, Reconnect's retries
// included: give it a deadline. The error wraps ErrNoKernelDevice when
// there is no such device to reattach.
func ReattachKernel(ctx context.Context, opts KernelOptions) (*KernelDevice, error) {
	d, _, err := reattachKernel(ctx, opts)
	return d, err
}

// reattachKernel is ReattachKernel, also returning how many
// NBD_CMD_RECONFIGURE it took (for tests).
func reattachKernel(ctx context.Context, opts KernelOptions) (*KernelDevice, int, error) {
	if err := opts.setDefaults(); err != nil {
		return nil, 0, fmt.Errorf("nbd: reattach: %w", err)
	}
	index := opts.Index
	if index == AnyDevice {
		var err error
		if index, err = FindKernelDevice(opts.BackendID); err != nil {
			return nil, 0, fmt.Errorf("nbd: reattach: %w", err)
		}
	}
	path := devicePath(index)
	busy, err := DeviceInUse(index)
	if err != nil {
		return nil, 0, fmt.Errorf("nbd: reattach: %w", err)
	}
	if !busy {
		return nil, 0, fmt.Errorf("nbd: reattach %s: %w: it is not connected", path, ErrNoKernelDevice)
	}
	id, ok, err := readBackendID(index)
	if err != nil {
		return nil, 0, fmt.Errorf("nbd: reattach: %w", err)
	}
	// An empty identifier: attached without one, or by a kernel before
	// 5.14; the kernel then checks nothing, and neither can we.
	if ok && id != "" && id != opts.BackendID {
		return nil, 0, fmt.Errorf("nbd: reattach %s: its backend is %q, not %q", path, id, opts.BackendID)
	}
	if !ok {
		// Only netlink-attached devices have the file (from 5.14 on);
		// Reconnect's NBD_CMD_RECONFIGURE tells an ioctl device apart.
		id = ""
	}
	size, err := deviceSize(index)
	if err != nil {
		return nil, 0, fmt.Errorf("nbd: reattach: %w", err)
	}
	conns, err := deviceConnections(index)
	if err != nil {
		return nil, 0, fmt.Errorf("nbd: reattach: %w", err)
	}
	opts.Index, opts.Connections = index, conns
	d := &KernelDevice{Index: index, Path: path, Size: size, Netlink: true, BackendID: id, opts: opts, connections: conns}
	tries, err := d.reconnect(ctx, conns)
	if err != nil {
		return nil, tries, err
	}
	return d, tries, nil
}

// Reconnect dials the export n more times (n <= 0: as many as the device
// has connections), negotiates, and hands the sockets to the device with
// NBD_CMD_RECONFIGURE, repeating its timeouts and backend identifier. The
// kernel puts each socket into a connection it has found dead; a socket
// for which it has no dead connection (the old server's socket is still
// open, or closed so recently that the kernel has not noticed) it drops
// without an error. So Reconnect checks which sockets the kernel kept, and
// offers the others again until it has kept all n or ctx ends (give it a
// deadline): the error then says how many it kept. A device attached
// with the ioctl interface, or without a request timeout, cannot be
// reconnected: the error wraps ErrNotSurvivable.
func (d *KernelDevice) Reconnect(ctx context.Context, n int) error {
	_, err := d.reconnect(ctx, n)
	return err
}

// reconnectBackoff bounds the wait between offers of sockets the kernel
// dropped. The kernel notices a closed socket within a scheduling delay,
// so the first retries come quickly.
const (
	reconnectFirstWait = 2 * time.Millisecond
	reconnectMaxWait   = 100 * time.Millisecond
)

func (d *KernelDevice) reconnect(ctx context.Context, n int) (tries int, err error) {
	// Without a dead-connection timeout the device can still take new
	// sockets; only its I/O in the gap fails.
	if !d.Netlink || d.opts.Timeout < 0 {
		return 0, fmt.Errorf("nbd: reconnect: %w", d.SurvivesRestart())
	}
	if n <= 0 {
		n = d.connections
	}
	opts := d.opts
	opts.Connections = n
	conns, info, err := dialKernelConns(ctx, opts)
	if err != nil {
		return 0, fmt.Errorf("nbd: reconnect %s: %w", d.Path, err)
	}
	// The kernel holds its own reference to each socket it keeps; the
	// ones it dropped close here, and their server sees end-of-file.
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	if info.Size != d.Size {
		return 0, fmt.Errorf("nbd: reconnect %s: export %q is %d bytes, the device %d: not the export it was attached to", d.Path, opts.Export, info.Size, d.Size)
	}
	files := make([]*os.File, n)
	for i, c := range conns {
		f, err := socketFile(c)
		if err != nil {
			return 0, fmt.Errorf("nbd: reconnect %s: connection %d: %w", d.Path, i, err)
		}
		defer f.Close()
		// The kernel sets a kept socket's send timeout to the request
		// timeout; start from none, so that a send timeout means kept.
		if err := unix.SetsockoptTimeval(int(f.Fd()), unix.SOL_SOCKET, unix.SO_SNDTIMEO, &unix.Timeval{}); err != nil {
			return 0, fmt.Errorf("nbd: reconnect %s: connection %d: clearing SO_SNDTIMEO: %w", d.Path, i, err)
		}
		files[i] = f
	}
	req := reconfigureRequest{
		index:       d.Index,
		timeoutSec:  seconds(opts.netlinkTimeout()),
		deadConnSec: seconds(opts.DeadConnTimeout),
		backendID:   d.BackendID,
	}
	if req.backendID == "" {
		// The kernel checks it only against an identifier it holds;
		// sending ours costs nothing where it holds none.
		req.backendID = opts.BackendID
	}
	pending := files
	wait := reconnectFirstWait
	start := time.Now()
	for {
		tries++
		req.fds = req.fds[:0]
		for _, f := range pending {
			req.fds = append(req.fds, int(f.Fd()))
		}
		if err := netlinkReconfigure(req); err != nil {
			return tries, fmt.Errorf("nbd: reconnect %s: %w", d.Path, err)
		}
		var dropped []*os.File
		for _, f := range pending {
			kept, err := kernelKept(f)
			if err != nil {
				return tries, fmt.Errorf("nbd: reconnect %s: %w", d.Path, err)
			}
			if !kept {
				dropped = append(dropped, f)
			}
		}
		pending = dropped
		if len(pending) == 0 {
			return tries, nil
		}
		select {
		case <-ctx.Done():
			return tries, fmt.Errorf("nbd: reconnect %s: the kernel kept %d of %d sockets in %d tries over %v: it has no dead connection for the others (is the old server still connected?): %w",
				d.Path, n-len(pending), n, tries, time.Since(start).Round(time.Millisecond), ctx.Err())
		case <-time.After(wait):
		}
		wait = min(2*wait, reconnectMaxWait)
	}
}

// kernelKept reports whether the kernel kept a socket handed to it by
// NBD_CMD_RECONFIGURE: nbd_reconnect_socket sets the send timeout of a
// socket it puts in a connection slot to the request timeout, and does
// nothing to one it drops.
func kernelKept(f *os.File) (bool, error) {
	tv, err := unix.GetsockoptTimeval(int(f.Fd()), unix.SOL_SOCKET, unix.SO_SNDTIMEO)
	if err != nil {
		return false, fmt.Errorf("reading SO_SNDTIMEO: %w", err)
	}
	return tv.Sec != 0 || tv.Usec != 0, nil
}
