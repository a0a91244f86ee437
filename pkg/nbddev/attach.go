// Package nbddev is the kernel's side of NBD: it attaches an export to
// /dev/nbdN and keeps it attached across its server's deaths. The device
// here is that kernel device, never the page table (pkg/device). Attach dials
// the server, negotiates each socket with the client side of the
// handshake (nbd.Dial), and hands the sockets to the kernel with generic
// netlink (NBD_CMD_CONNECT), or the ioctl interface where netlink is
// missing (Options.Ioctl); Device.Detach undoes it. A later server
// process finds the device by its backend identifier and hands it new
// sockets (Reattach, PrepareReattach, Device.Reconnect: reconnect.go).
// Whether a device is free, connected or whose it is, it reads from sysfs
// (Options.SysBlock).
//
// testdata/kernelvm.sh runs the tests that need the nbd module in a QEMU
// guest booting Debian's kernel.
//
// This file: attaching, its options and timeouts, and the choice between
// netlink and the ioctl fallback.
package nbddev

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gzramd/gzramd/pkg/nbd"
)

// AnyIndex asks Attach for any free /dev/nbdN.
const AnyIndex = -1

// Options configure Attach and Reattach.
type Options struct {
	// Network and Address reach the server ("unix" and a socket path, or
	// "tcp" and host:port); Export names the export ("" is the default).
	Network, Address, Export string
	// Index picks /dev/nbdN; AnyIndex lets the kernel (netlink) or
	// FindFree (ioctl) choose, or, for Reattach, finds the
	// device by BackendID.
	Index int
	// Connections is the number of sockets the kernel spreads requests
	// over (default 1). The ioctl fallback supports only one.
	// Reattach ignores it: the kernel cannot add connections to a
	// device, so a reattach replaces as many as the device has.
	Connections int
	// BlockSize is the device's logical block size (default 4096).
	BlockSize uint32
	// Timeout is the kernel's per-request timeout, in whole seconds
	// (rounded up). A request that has had no reply for this long makes
	// the kernel shut its socket down and queue the request again, to go
	// out whole on whatever socket replaces it: this is what re-sends the
	// requests that were in flight when a server died, and what a request
	// slower than Timeout costs (its connection). 0 means
	// DefaultTimeout with netlink, and no timeout with the ioctl
	// interface (whose device cannot wait for a new socket, so a timeout
	// there only turns a slow request into an I/O error). Negative means
	// no timeout: the kernel then re-sends requests in flight at its
	// 30-second check for stuck requests, and Reconnect refuses to run.
	Timeout time.Duration
	// DeadConnTimeout is how long the kernel holds requests while no
	// connection of the device is alive, waiting for Reconnect, before it
	// fails them with EIO (whole seconds, rounded up). 0 means
	// DefaultDeadConnTimeout; negative means none: I/O fails as soon as
	// the server goes. Netlink only.
	DeadConnTimeout time.Duration
	// BackendID names the export to the kernel, which shows it in
	// /sys/block/nbdN/backend (Linux 5.14 on; older kernels ignore it). A
	// later process finds its device by it (Find), and the
	// kernel refuses a reconfigure that names another. "" means
	// DefaultBackendID. Netlink only.
	BackendID string
	// DialTimeout bounds dialing and negotiating each connection
	// (default 10s).
	DialTimeout time.Duration
	// Ioctl attaches with the ioctl interface even where netlink is
	// there: that of kernels before 4.12 and of nbd-client -nonetlink,
	// whose device cannot outlive its server (SurvivesRestart).
	Ioctl bool
	// SysBlock is where sysfs describes block devices (default
	// DefaultSysBlock), for a sysfs mounted elsewhere.
	SysBlock string
	// Proc is where procfs is (default /proc), for one mounted
	// elsewhere: a takeover reads the kernel's threads there.
	Proc string
}

// DefaultTimeout is the request timeout of a netlink-attached
// device. Requests in flight when the server dies are re-sent this long
// after they went out, so it bounds the pause a server restart causes
// them. Shorter makes a request that is merely slow (a swap-in queued
// behind a storm of swap-outs on a busy machine) cost its connection,
// which then has to be reconnected while its requests wait.
const DefaultTimeout = 10 * time.Second

// DefaultDeadConnTimeout is how long a netlink-attached device holds its
// I/O while its server is away. Long enough for a supervisor to restart
// the daemon (and for a person to start it by hand) before processes with
// pages in swap are killed by the I/O errors; finite, so that a server
// that is never coming back does not hang the machine for good.
const DefaultDeadConnTimeout = 5 * time.Minute

// DefaultBackendID is the backend identifier Attach gives a device
// when Options.BackendID is empty: the export's NBD URI.
func DefaultBackendID(network, address, export string) string {
	if network == "unix" {
		return "nbd+unix:///" + export + "?socket=" + address
	}
	return "nbd://" + address + "/" + export
}

// maxBackendID bounds a backend identifier: the kernel takes any length,
// but it is a name for sysfs, not a payload.
const maxBackendID = 1024

// setDefaults fills in Options' defaults and checks what it can
// without the kernel.
func (o *Options) setDefaults() error {
	if o.Connections == 0 {
		o.Connections = 1
	}
	if o.BlockSize == 0 {
		o.BlockSize = nbd.PreferredBlockSize
	}
	if o.DialTimeout <= 0 {
		o.DialTimeout = 10 * time.Second
	}
	if o.DeadConnTimeout == 0 {
		o.DeadConnTimeout = DefaultDeadConnTimeout
	}
	if o.BackendID == "" {
		o.BackendID = DefaultBackendID(o.Network, o.Address, o.Export)
	}
	if o.SysBlock == "" {
		o.SysBlock = DefaultSysBlock
	}
	if o.Connections < 1 || o.Connections > 256 {
		return fmt.Errorf("%d connections: want 1..256", o.Connections)
	}
	if bs := o.BlockSize; bs < 512 || bs > 65536 || bs&(bs-1) != 0 {
		// The kernel's blk_validate_block_size: a power of two from
		// 512 up to the page size (64 KiB at most on any arch).
		return fmt.Errorf("block size %d: want a power of two from 512 to the page size", bs)
	}
	if o.Index < AnyIndex {
		return fmt.Errorf("device index %d: want >= 0 or AnyIndex", o.Index)
	}
	if len(o.BackendID) > maxBackendID || strings.ContainsFunc(o.BackendID, func(r rune) bool { return r < ' ' || r == 0x7f }) {
		return fmt.Errorf("backend identifier %.40q...: want at most %d bytes and no control characters", o.BackendID, maxBackendID)
	}
	return nil
}

// seconds converts a timeout to the kernel's whole seconds, rounding up
// so that a positive timeout never becomes 0 (which means none).
func seconds(d time.Duration) uint64 {
	if d <= 0 {
		return 0
	}
	return uint64((d + time.Second - 1) / time.Second)
}

// netlinkTimeout is the request timeout a netlink-attached device gets.
func (o *Options) netlinkTimeout() time.Duration {
	if o.Timeout == 0 {
		return DefaultTimeout
	}
	return o.Timeout
}

// Device is a /dev/nbdN attached to an export.
type Device struct {
	Index   int
	Path    string // /dev/nbdN
	Size    uint64 // bytes, as negotiated
	Netlink bool   // attached with netlink (false: the ioctl interface)
	// BackendID is what /sys/block/nbdN/backend showed after attaching:
	// "" where the kernel keeps none (before 5.14, or the ioctl
	// interface).
	BackendID string

	// opts are the options the device was attached (or reattached) with,
	// defaults applied: Reconnect repeats them. connections is the
	// number of sockets the device has.
	opts        Options
	connections int
	// What the last takeover or reconnect waited for the receive
	// workers of dead connections (StaleWorkers).
	staleWait time.Duration
	staleLeft int

	// ioctl attachment: the open device and NBD_DO_IT's result.
	dev  *os.File
	doIt chan error
}

// Connections returns the number of sockets the device spreads its
// requests over.
func (d *Device) Connections() int { return d.connections }

// Timeout returns the device's request timeout (0: none).
func (d *Device) Timeout() time.Duration {
	if !d.Netlink {
		return max(d.opts.Timeout, 0)
	}
	return max(d.opts.netlinkTimeout(), 0)
}

// DeadConnTimeout returns how long the device holds its I/O while no
// server is connected (0: not at all).
func (d *Device) DeadConnTimeout() time.Duration {
	if !d.Netlink {
		return 0
	}
	return max(d.opts.DeadConnTimeout, 0)
}

// Attach connects a kernel /dev/nbdN to an export: it dials
// Connections sockets to the server, negotiates the export on each
// (NBD_OPT_GO), and hands them to the kernel with generic netlink
// (NBD_CMD_CONNECT), with a request timeout, a dead-connection timeout and
// a backend identifier, so that the device waits for a restarted server
// (Reattach, Reconnect) instead of failing its I/O. Where the kernel
// has no nbd netlink family it falls back to the ioctl interface with one
// connection, whose device does not survive its server: SurvivesRestart
// says so. It needs CAP_SYS_ADMIN and the nbd module. Errors name the step
// and the errno.
func Attach(ctx context.Context, opts Options) (*Device, error) {
	if err := opts.setDefaults(); err != nil {
		return nil, fmt.Errorf("nbd: attach: %w", err)
	}
	conns, info, err := dialKernelConns(ctx, opts)
	if err != nil {
		return nil, err
	}
	// The kernel takes its own reference to each socket: ours are closed
	// whatever happens.
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	if info.Size < uint64(opts.BlockSize) {
		return nil, fmt.Errorf("nbd: attach: export %q is %d bytes, smaller than one %d-byte block", opts.Export, info.Size, opts.BlockSize)
	}
	fds := make([]int, len(conns))
	for i, c := range conns {
		f, err := nbd.SocketFile(c)
		if err != nil {
			return nil, fmt.Errorf("nbd: attach: connection %d: %w", i, err)
		}
		defer f.Close() // after the kernel has taken its reference
		fds[i] = int(f.Fd())
	}

	req := connectRequest{
		index:       opts.Index,
		size:        info.Size,
		blockSize:   uint64(opts.BlockSize),
		timeoutSec:  seconds(opts.netlinkTimeout()),
		deadConnSec: seconds(opts.DeadConnTimeout),
		serverFlags: uint64(info.Flags),
		backendID:   opts.BackendID,
		fds:         fds,
	}
	if opts.Ioctl {
		return attachIoctl(opts, info, fds[0])
	}
	index, err := netlinkConnect(req)
	if err == nil {
		d := &Device{Index: index, Path: devicePath(index), Size: info.Size, Netlink: true,
			opts: opts, connections: len(conns)}
		// The kernel connects the device before acknowledging; check,
		// rather than trust an acknowledgement that changed nothing.
		if busy, err := opts.sys().inUse(index); err != nil || !busy {
			d.Detach()
			return nil, fmt.Errorf("nbd: attach via netlink: NBD_CMD_CONNECT acknowledged but %s is not connected (in use %v, %v)", d.Path, busy, err)
		}
		// A kernel before 5.14 ignores the identifier and shows none.
		if id, ok, err := opts.sys().readBackendID(index); err == nil && ok {
			d.BackendID = id
		}
		return d, nil
	}
	if !isNetlinkUnavailable(err) {
		return nil, fmt.Errorf("nbd: attach via netlink: %w", err)
	}
	d, ierr := attachIoctl(opts, info, fds[0])
	if ierr != nil {
		return nil, fmt.Errorf("nbd: attach: netlink unavailable (%v); ioctl fallback: %w", err, ierr)
	}
	return d, nil
}

// dialKernelConns opens and negotiates the sockets for the kernel.
func dialKernelConns(ctx context.Context, opts Options) ([]net.Conn, nbd.ExportInfo, error) {
	var conns []net.Conn
	var first nbd.ExportInfo
	for i := 0; i < opts.Connections; i++ {
		dctx, cancel := context.WithTimeout(ctx, opts.DialTimeout)
		c, info, err := nbd.Dial(dctx, opts.Network, opts.Address, opts.Export)
		cancel()
		if err != nil {
			for _, c := range conns {
				c.Close()
			}
			return nil, nbd.ExportInfo{}, fmt.Errorf("nbd: attach: connection %d of %d: %w", i+1, opts.Connections, err)
		}
		conns = append(conns, c)
		if i == 0 {
			first = info
		} else if info.Size != first.Size || info.Flags != first.Flags {
			for _, c := range conns {
				c.Close()
			}
			return nil, nbd.ExportInfo{}, fmt.Errorf("nbd: attach: connection %d saw size %d flags %#x, connection 1 saw %d %#x",
				i+1, info.Size, info.Flags, first.Size, first.Flags)
		}
	}
	if opts.Connections > 1 && first.Flags&nbd.FlagCanMultiConn == 0 {
		for _, c := range conns {
			c.Close()
		}
		return nil, nbd.ExportInfo{}, fmt.Errorf("nbd: attach: export %q does not allow multiple connections", opts.Export)
	}
	return conns, first, nil
}

// Detach disconnects the device: the kernel sends NBD_CMD_DISC, fails
// what is still queued and shuts the sockets down.
func (d *Device) Detach() error {
	if d.Netlink {
		if err := netlinkDisconnect(d.Index); err != nil {
			return fmt.Errorf("nbd: detach: %w", err)
		}
		return nil
	}
	return d.detachIoctl()
}

// LimitRequests caps the requests the kernel sends the device at n bytes
// (its queue's max_sectors_kb, rounded down to KiB). Reads and writes
// larger than that are split by the block layer.
//
// A limit already in place is not written again. On Linux 6.12 a write
// to max_sectors_kb freezes the queue (queue_attr_store,
// queue_limits_commit_update_frozen) and waits, uninterruptibly, for
// every request in flight; after a takeover those include requests
// the dead server left, which only this process can complete. If the
// process is killed there (SIGKILL ends its other threads, the NBD server
// among them, but not the one waiting), the queue never drains, the
// process never exits, and no other can take over: the device stalls
// until the dead-connection timeout fails its I/O (seen on 6.12 with
// test/e2e's survive scenario). The limit belongs to the device, so the
// serving process before this one has set it already.
func (d *Device) LimitRequests(n int) error {
	path := filepath.Join(string(d.opts.sys()), "nbd"+strconv.Itoa(d.Index), "queue", "max_sectors_kb")
	want := strconv.Itoa(n >> 10)
	if b, err := os.ReadFile(path); err == nil && strings.TrimSpace(string(b)) == want {
		return nil
	}
	if err := os.WriteFile(path, []byte(want), 0); err != nil {
		return fmt.Errorf("nbd: limiting %s's requests to %d KiB: %w", d.Path, n>>10, err)
	}
	return nil
}

func devicePath(index int) string { return "/dev/nbd" + strconv.Itoa(index) }

// sysfs is where the kernel describes block devices (Options.SysBlock).
type sysfs string

func (o *Options) sys() sysfs {
	if o.SysBlock == "" {
		return DefaultSysBlock
	}
	return sysfs(o.SysBlock)
}

// DefaultSysBlock is where sysfs describes block devices.
const DefaultSysBlock = "/sys/block"

// InUse reports whether /dev/nbdN is connected: the kernel creates
// /sys/block/nbdN/pid while a device is connected, and its size is
// nonzero. An error means the device does not exist (module not loaded,
// or N beyond nbds_max).
func (sys sysfs) inUse(index int) (bool, error) {
	dir := filepath.Join(string(sys), "nbd"+strconv.Itoa(index))
	if _, err := os.Stat(dir); err != nil {
		return false, fmt.Errorf("nbd: /dev/nbd%d: %w (is the nbd module loaded?)", index, err)
	}
	if _, err := os.Stat(filepath.Join(dir, "pid")); err == nil {
		return true, nil
	}
	b, err := os.ReadFile(filepath.Join(dir, "size"))
	if err != nil {
		return false, fmt.Errorf("nbd: /dev/nbd%d: %w", index, err)
	}
	sectors, err := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
	if err != nil {
		return false, fmt.Errorf("nbd: /dev/nbd%d: size %q: %w", index, b, err)
	}
	return sectors != 0, nil
}

// readBackendID reads /sys/block/nbdN/backend; ok is false where the file
// does not exist (the device is not connected through netlink, or the
// kernel predates 5.14).
func (sys sysfs) readBackendID(index int) (id string, ok bool, err error) {
	b, err := os.ReadFile(filepath.Join(string(sys), "nbd"+strconv.Itoa(index), "backend"))
	if errors.Is(err, os.ErrNotExist) {
		return "", false, nil
	}
	if err != nil {
		return "", false, fmt.Errorf("nbd: /dev/nbd%d backend: %w", index, err)
	}
	return strings.TrimSuffix(string(b), "\n"), true, nil
}

// FindFree returns the lowest N whose /dev/nbdN is not in use.
func (sys sysfs) findFree() (int, error) {
	entries, err := os.ReadDir(string(sys))
	if err != nil {
		return 0, fmt.Errorf("nbd: listing %s: %w", string(sys), err)
	}
	best := -1
	for _, e := range entries {
		s, ok := strings.CutPrefix(e.Name(), "nbd")
		if !ok {
			continue
		}
		n, err := strconv.Atoi(s)
		if err != nil || (best >= 0 && n >= best) {
			continue
		}
		if busy, err := sys.inUse(n); err == nil && !busy {
			best = n
		}
	}
	if best < 0 {
		return 0, fmt.Errorf("nbd: no free /dev/nbdN in %s (is the nbd module loaded? nbds_max?)", string(sys))
	}
	return best, nil
}

// The kernel's nbd ioctls (include/uapi/linux/nbd.h): _IO(0xab, n).
const (
	ioctlSetSock       = 0xab00
	ioctlSetBlkSize    = 0xab01
	ioctlDoIt          = 0xab03
	ioctlClearSock     = 0xab04
	ioctlClearQue      = 0xab05
	ioctlSetSizeBlocks = 0xab07
	ioctlDisconnect    = 0xab08
	ioctlSetTimeout    = 0xab09
	ioctlSetFlags      = 0xab0a
)

// attachIoctl is the pre-netlink interface: configure the device, give it
// one socket, and run NBD_DO_IT, which blocks until disconnection.
func attachIoctl(opts Options, info nbd.ExportInfo, sockFD int) (*Device, error) {
	index := opts.Index
	if index == AnyIndex {
		var err error
		if index, err = opts.sys().findFree(); err != nil {
			return nil, err
		}
	}
	path := devicePath(index)
	dev, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return nil, err // *PathError names the device
	}
	fd := int(dev.Fd())
	steps := []struct {
		name string
		req  uint
		arg  uint64
	}{
		{"NBD_SET_BLKSIZE", ioctlSetBlkSize, uint64(opts.BlockSize)},
		{"NBD_SET_SIZE_BLOCKS", ioctlSetSizeBlocks, info.Size / uint64(opts.BlockSize)},
		{"NBD_SET_FLAGS", ioctlSetFlags, uint64(info.Flags)},
		{"NBD_SET_TIMEOUT", ioctlSetTimeout, seconds(opts.Timeout)},
		{"NBD_SET_SOCK", ioctlSetSock, uint64(sockFD)},
	}
	for _, s := range steps {
		if _, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), uintptr(s.req), uintptr(s.arg)); errno != 0 {
			unix.Syscall(unix.SYS_IOCTL, uintptr(fd), ioctlClearSock, 0)
			dev.Close()
			return nil, fmt.Errorf("%s %s (%d): %w", path, s.name, s.arg, errno)
		}
	}
	d := &Device{Index: index, Path: path, Size: info.Size, opts: opts, connections: 1, dev: dev, doIt: make(chan error, 1)}
	go d.runDoIt()
	// NBD_DO_IT fails at once if the configuration was refused; give it a
	// moment to do so, then wait for the device to show its size.
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case err := <-d.doIt:
			dev.Close()
			return nil, fmt.Errorf("%s NBD_DO_IT: %w", path, err)
		case <-time.After(5 * time.Millisecond):
		}
		if busy, err := opts.sys().inUse(index); err == nil && busy {
			return d, nil
		}
	}
	return d, nil
}

// runDoIt runs NBD_DO_IT on an OS thread with every signal blocked: a
// signal delivered to the thread blocked in NBD_DO_IT (a SIGTERM to the
// process, say) makes the kernel tear the device down.
func (d *Device) runDoIt() {
	// The thread is not unlocked: with its altered signal mask it must
	// die with this goroutine rather than return to the pool.
	runtime.LockOSThread()
	var all unix.Sigset_t
	for i := range all.Val {
		all.Val[i] = ^uint64(0)
	}
	if err := unix.PthreadSigmask(unix.SIG_BLOCK, &all, nil); err != nil {
		d.doIt <- fmt.Errorf("blocking signals: %w", err)
		return
	}
	_, _, errno := unix.Syscall(unix.SYS_IOCTL, d.dev.Fd(), ioctlDoIt, 0)
	if errno != 0 {
		d.doIt <- errno
		return
	}
	d.doIt <- nil
}

func (d *Device) detachIoctl() error {
	fd := d.dev.Fd()
	if _, _, errno := unix.Syscall(unix.SYS_IOCTL, fd, ioctlDisconnect, 0); errno != 0 {
		return fmt.Errorf("nbd: detach %s: NBD_DISCONNECT: %w", d.Path, errno)
	}
	var doItErr error
	select {
	case doItErr = <-d.doIt:
	case <-time.After(30 * time.Second):
		return fmt.Errorf("nbd: detach %s: NBD_DO_IT did not return 30s after NBD_DISCONNECT", d.Path)
	}
	unix.Syscall(unix.SYS_IOCTL, fd, ioctlClearQue, 0)
	if _, _, errno := unix.Syscall(unix.SYS_IOCTL, fd, ioctlClearSock, 0); errno != 0 {
		d.dev.Close()
		return fmt.Errorf("nbd: detach %s: NBD_CLEAR_SOCK: %w", d.Path, errno)
	}
	if err := d.dev.Close(); err != nil {
		return fmt.Errorf("nbd: detach %s: %w", d.Path, err)
	}
	// NBD_DO_IT reports the disconnect we asked for as success; anything
	// else (a timeout) is worth knowing.
	if doItErr != nil && !errors.Is(doItErr, syscall.EPIPE) {
		return fmt.Errorf("nbd: detach %s: NBD_DO_IT returned %w", d.Path, doItErr)
	}
	return nil
}
