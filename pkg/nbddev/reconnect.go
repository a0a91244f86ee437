// Keeping a kernel device across a server's death: finding the device a
// dead server left, and handing it the next server's sockets.

package nbddev

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gzramd/gzramd/pkg/nbd"
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
// safe to repeat. A request timeout also fires on a server that is merely
// slow: the kernel then shuts that connection down and sends the request
// again on another while the server may still be running the first copy,
// which must not land after a later write to the same blocks.
//
// The kernel can also shut down a socket it has just kept: a connection
// found dead by a failed send or a request timeout keeps its receive
// worker until that worker reads the old socket's end, and the worker then
// marks the connection dead again, whatever socket it holds by then
// (recv_work, nbd_mark_nsock_dead). A server must replace the connections
// it loses for as long as it serves, not only when it starts.

// ErrNotSurvivable says a kernel device fails its I/O when its server
// goes, so that a restart of the server loses whatever is swapped to it.
var ErrNotSurvivable = errors.New("nbd: the kernel device does not survive its server")

// ErrNoDevice says no connected /dev/nbdN matches what was asked for:
// there is nothing to reattach, and the export may be attached afresh.
var ErrNoDevice = errors.New("nbd: no connected kernel device")

// SurvivesRestart reports whether the device's I/O waits for a new server
// when this one goes: nil, or an error wrapping ErrNotSurvivable that says
// why not, for the caller to log.
func (d *Device) SurvivesRestart() error {
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

// Find returns the index of the connected /dev/nbdN whose
// /sys/block/nbdN/backend is backendID: how a new server process finds
// the device its predecessor attached. The error wraps ErrNoDevice
// when there is none (the kernel may also predate backend identifiers,
// Linux 5.14).
func (sys sysfs) find(backendID string) (int, error) {
	if backendID == "" {
		return 0, errors.New("nbd: find kernel device: empty backend identifier")
	}
	entries, err := os.ReadDir(string(sys))
	if err != nil {
		return 0, fmt.Errorf("nbd: listing %s: %w", string(sys), err)
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
		id, ok, err := sys.readBackendID(n)
		if err != nil || !ok || id != backendID {
			continue
		}
		if busy, err := sys.inUse(n); err == nil && busy {
			found = append(found, n)
		}
	}
	switch len(found) {
	case 0:
		return 0, fmt.Errorf("%w with backend %q in %s", ErrNoDevice, backendID, string(sys))
	case 1:
		return found[0], nil
	}
	return 0, fmt.Errorf("nbd: find kernel device: backend %q is connected as nbd%v: give the index", backendID, found)
}

// deviceConnections counts /sys/block/nbdN/mq's entries: the kernel gives
// a connected device one hardware queue per connection (nbd_start_device).
func (sys sysfs) deviceConnections(index int) (int, error) {
	entries, err := os.ReadDir(filepath.Join(string(sys), "nbd"+strconv.Itoa(index), "mq"))
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
func (sys sysfs) deviceSize(index int) (uint64, error) {
	b, err := os.ReadFile(filepath.Join(string(sys), "nbd"+strconv.Itoa(index), "size"))
	if err != nil {
		return 0, fmt.Errorf("nbd: /dev/nbd%d size: %w", index, err)
	}
	sectors, err := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("nbd: /dev/nbd%d size %q: %w", index, b, err)
	}
	return sectors << 9, nil
}

// Reattach takes over a /dev/nbdN that an earlier server process
// attached with Attach and that is waiting for its server: it is
// PrepareReattach and Takeover.Complete, for a process that starts after
// the old one is gone. ctx bounds the whole: give it a deadline. The error
// wraps ErrNoDevice when there is no such device to reattach.
func Reattach(ctx context.Context, opts Options) (*Device, error) {
	t, err := PrepareReattach(ctx, opts)
	if err != nil {
		return nil, err
	}
	defer t.Close()
	return t.Complete(ctx)
}

// Takeover is a handover of new sockets to a kernel device, prepared
// ahead: the device found and the export dialed and negotiated on every
// socket, so that Complete only has to hand them over. A standby server
// prepares one while the active server still serves, and calls Complete
// to take over as soon as the kernel finds the active server's sockets
// dead; preparing first also leaves the new server's connections set up
// (their memory allocated) before the device depends on it, which matters
// when the device is swap and memory is short.
type Takeover struct {
	d      *Device
	conns  []net.Conn
	files  []*os.File // blocking duplicates of conns, for the kernel
	nl     *nbdGenl
	req    reconfigureRequest
	tries  int // NBD_CMD_RECONFIGURE sent
	closed bool
}

// PrepareReattach prepares the takeover of a /dev/nbdN that an earlier
// server process attached with Attach: the one at opts.Index, or,
// with AnyIndex, the one Find finds for opts.BackendID. It
// dials the export as often as the device has connections (the kernel
// cannot add any; opts.Connections is ignored) and checks that its size is
// the device's. opts must be the ones the device was attached with
// (BackendID especially: the kernel refuses another). The error wraps
// ErrNoDevice when there is no such device.
func PrepareReattach(ctx context.Context, opts Options) (*Takeover, error) {
	d, err := attached(opts)
	if err != nil {
		return nil, fmt.Errorf("nbd: reattach: %w", err)
	}
	return d.prepare(ctx, d.connections)
}

// FindAttached returns the /dev/nbdN an earlier server process attached
// with Attach (found as PrepareReattach finds it) whose sockets this
// process serves already: they were handed over (Server.Adopt), and the
// kernel kept its connections. Nothing is sent to the kernel.
func FindAttached(opts Options) (*Device, error) {
	d, err := attached(opts)
	if err != nil {
		return nil, fmt.Errorf("nbd: %w", err)
	}
	return d, nil
}

// attached describes the connected device opts name, for a process that
// did not attach it.
func attached(opts Options) (*Device, error) {
	if err := opts.setDefaults(); err != nil {
		return nil, err
	}
	index := opts.Index
	if index == AnyIndex {
		var err error
		if index, err = opts.sys().find(opts.BackendID); err != nil {
			return nil, err
		}
	}
	path := devicePath(index)
	busy, err := opts.sys().inUse(index)
	if err != nil {
		return nil, err
	}
	if !busy {
		return nil, fmt.Errorf("%s: %w: it is not connected", path, ErrNoDevice)
	}
	id, ok, err := opts.sys().readBackendID(index)
	if err != nil {
		return nil, err
	}
	// An empty identifier: attached without one, or by a kernel before
	// 5.14; the kernel then checks nothing, and neither can we. No file:
	// not attached through netlink (or before 5.14), which
	// NBD_CMD_RECONFIGURE finds out.
	if ok && id != "" && id != opts.BackendID {
		return nil, fmt.Errorf("%s: its backend is %q, not %q", path, id, opts.BackendID)
	}
	size, err := opts.sys().deviceSize(index)
	if err != nil {
		return nil, err
	}
	conns, err := opts.sys().deviceConnections(index)
	if err != nil {
		return nil, err
	}
	opts.Index, opts.Connections = index, conns
	return &Device{Index: index, Path: path, Size: size, Netlink: true, BackendID: id, opts: opts, connections: conns}, nil
}

// Reconnect hands the device n new sockets (n <= 0: as many as it has
// connections), as a server that lost its sockets (or some of them) does:
// it is a Takeover prepared and completed at once. The kernel puts each
// socket into a connection it has found dead and silently drops the
// others, so Reconnect offers the dropped ones again until all are kept
// or ctx ends: give it a deadline. A device attached with the ioctl
// interface, or without a request timeout, cannot be reconnected: the
// error wraps ErrNotSurvivable.
func (d *Device) Reconnect(ctx context.Context, n int) error {
	t, err := d.prepare(ctx, n)
	if err != nil {
		return err
	}
	defer t.Close()
	_, err = t.Complete(ctx)
	return err
}

func (d *Device) prepare(ctx context.Context, n int) (*Takeover, error) {
	// Without a dead-connection timeout the device can still take new
	// sockets; only its I/O in the gap fails.
	if !d.Netlink || d.opts.Timeout < 0 {
		return nil, fmt.Errorf("nbd: reconnect: %w", d.SurvivesRestart())
	}
	if n <= 0 {
		n = d.connections
	}
	opts := d.opts
	opts.Connections = n
	t := &Takeover{d: d}
	ok := false
	defer func() {
		if !ok {
			t.Close()
		}
	}()
	var info nbd.ExportInfo
	var err error
	if t.conns, info, err = dialKernelConns(ctx, opts); err != nil {
		return nil, fmt.Errorf("nbd: reconnect %s: %w", d.Path, err)
	}
	if info.Size != d.Size {
		return nil, fmt.Errorf("nbd: reconnect %s: export %q is %d bytes, the device %d: not the export it was attached to", d.Path, opts.Export, info.Size, d.Size)
	}
	for i, c := range t.conns {
		f, err := nbd.SocketFile(c)
		if err != nil {
			return nil, fmt.Errorf("nbd: reconnect %s: connection %d: %w", d.Path, i, err)
		}
		t.files = append(t.files, f)
		// The kernel sets a kept socket's send timeout to the request
		// timeout; start from none, so that a send timeout means kept.
		if err := unix.SetsockoptTimeval(int(f.Fd()), unix.SOL_SOCKET, unix.SO_SNDTIMEO, &unix.Timeval{}); err != nil {
			return nil, fmt.Errorf("nbd: reconnect %s: connection %d: clearing SO_SNDTIMEO: %w", d.Path, i, err)
		}
	}
	if t.nl, err = dialNBDGenl(); err != nil {
		return nil, fmt.Errorf("nbd: reconnect %s: %w", d.Path, err)
	}
	t.req = reconfigureRequest{
		index:       d.Index,
		timeoutSec:  seconds(opts.netlinkTimeout()),
		deadConnSec: seconds(opts.DeadConnTimeout),
		backendID:   d.BackendID,
		fds:         make([]int, 0, n),
	}
	if t.req.backendID == "" {
		// The kernel checks it only against an identifier it holds;
		// sending ours costs nothing where it holds none.
		t.req.backendID = opts.BackendID
	}
	ok = true
	return t, nil
}

// The wait between offers of sockets the kernel dropped. The kernel
// notices a closed socket within a scheduling delay, so the first retries
// come quickly; a standby waiting for the active server to go polls at
// the longest.
const (
	reconnectFirstWait = 2 * time.Millisecond
	reconnectMaxWait   = 100 * time.Millisecond
)

// Complete hands the prepared sockets to the device with
// NBD_CMD_RECONFIGURE, repeating its timeouts and backend identifier, and
// returns the device once the kernel has kept every one. The kernel puts
// a socket only into a connection it has found dead; one it has no such
// connection for (the old server's socket is still open, or closed so
// recently that the kernel has not noticed) it drops without an error. So
// Complete checks which sockets it kept and offers the others again, at
// most reconnectMaxWait apart, until it has kept all of them or ctx ends:
// the error then says how many it kept. A kept socket stays with the
// device whatever happens after.
func (t *Takeover) Complete(ctx context.Context) (*Device, error) {
	d := t.d
	if t.closed {
		return nil, fmt.Errorf("nbd: reconnect %s: takeover closed", d.Path)
	}
	wait := reconnectFirstWait
	start := time.Now()
	d.staleWait, d.staleLeft = 0, 0
	for {
		pending := t.pending()
		if len(pending) == 0 {
			return d, nil
		}
		waited, left := d.waitStaleWorkers(ctx, d.connections-len(pending))
		d.staleWait += waited
		d.staleLeft = left
		t.req.fds = t.req.fds[:0]
		for _, f := range pending {
			t.req.fds = append(t.req.fds, int(f.Fd()))
		}
		t.tries++
		if err := t.nl.reconfigure(t.req); err != nil {
			return nil, fmt.Errorf("nbd: reconnect %s: %w", d.Path, err)
		}
		for _, f := range pending {
			kept, err := kernelKept(f)
			if err != nil {
				return nil, fmt.Errorf("nbd: reconnect %s: %w", d.Path, err)
			}
			if kept {
				t.release(f)
			}
		}
		if len(t.pending()) == 0 {
			return d, nil
		}
		select {
		case <-ctx.Done():
			n := len(t.files)
			return nil, fmt.Errorf("nbd: reconnect %s: the kernel kept %d of %d sockets in %d tries over %v: it has no dead connection for the others (is the old server still connected?): %w",
				d.Path, n-len(t.pending()), n, t.tries, time.Since(start).Round(time.Millisecond), ctx.Err())
		case <-time.After(wait):
		}
		wait = min(2*wait, reconnectMaxWait)
	}
}

// StaleWorkers says how long the last Reattach or Reconnect waited for
// the kernel's receive workers of dead connections to end before it
// offered sockets (workers.go), and how many it gave up waiting for.
func (d *Device) StaleWorkers() (waited time.Duration, left int) { return d.staleWait, d.staleLeft }

// pending returns the sockets the kernel has not kept yet.
func (t *Takeover) pending() []*os.File {
	var p []*os.File
	for _, f := range t.files {
		if f != nil {
			p = append(p, f)
		}
	}
	return p
}

// release closes our copies of a socket the kernel kept: it holds its own
// reference.
func (t *Takeover) release(f *os.File) {
	for i, g := range t.files {
		if g == f {
			f.Close()
			t.conns[i].Close()
			t.files[i], t.conns[i] = nil, nil
		}
	}
}

// Close gives up the sockets the kernel has not kept (their server sees
// end-of-file) and the netlink socket. It is safe after Complete.
func (t *Takeover) Close() error {
	t.closed = true
	for i, c := range t.conns {
		if c != nil {
			c.Close()
		}
		if i < len(t.files) && t.files[i] != nil {
			t.files[i].Close()
		}
		t.conns[i] = nil
	}
	t.files = nil
	if t.nl != nil {
		t.nl.Close()
		t.nl = nil
	}
	return nil
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
