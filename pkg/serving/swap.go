// The kernel device and swap: attaching it, making it swap, and stopping safely while it is.

package serving

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/gzramd/gzramd/pkg/nbddev"
	"github.com/gzramd/gzramd/pkg/swapctl"
	"github.com/gzramd/gzramd/pkg/swapsafe"
)

// parseDevice accepts /dev/nbdN, nbdN or "auto" (any free kernel device).
func ParseDevice(s string) (index int, err error) {
	if s == "auto" {
		return -1, nil
	}
	n, ok := strings.CutPrefix(strings.TrimPrefix(s, "/dev/"), "nbd")
	if ok {
		if i, err := strconv.Atoi(n); err == nil && i >= 0 && strconv.Itoa(i) == n {
			return i, nil
		}
	}
	return 0, errors.New("want /dev/nbdN (e.g. /dev/nbd0) or auto")
}

// swapoffTimeout bounds swapoff at stop; it can take minutes when much
// is swapped out, and systemd's TimeoutStopSec must be longer.
const swapoffTimeout = 30 * time.Minute

// sysModuleNBD exists while the nbd module is loaded (or built in).
var sysModuleNBD = "/sys/module/nbd"

// attach connects the kernel device (--device) and makes it swap (--swap).
// A serving process that took the data path over from one that died
// takes its kernel device over too: the device has been holding its I/O
// for a new server (and re-sends what was in flight), and it is swap
// already, with pages in it; it gets no self-test.
func (d *daemon) attach(ctx context.Context) error {
	if d.cfg.Device == "" {
		d.topUpHeap()
		return nil
	}
	if d.cfg.Transport == TransportUblk {
		return d.attachUblk(ctx)
	}
	index, _ := ParseDevice(d.cfg.Device) // validated
	if _, err := os.Stat(sysModuleNBD); err != nil {
		return fmt.Errorf("--device %s: the kernel's nbd module is not loaded (run modprobe nbd; it ships with the kernel)", d.cfg.Device)
	}
	opts := nbddev.Options{
		Export: d.cfg.Export, Index: index, Connections: d.cfg.KernelConns,
		Timeout: d.cfg.KernelTimeout, DeadConnTimeout: d.cfg.KernelDeadTimeout,
	}
	if d.cfg.Socket != "" {
		opts.Network, opts.Address = "unix", d.cfg.Socket
	} else {
		opts.Network, opts.Address = "tcp", TCPAddr(d.cfg.TCP)
	}
	if d.recovered != nil && d.adoptedKernel > 0 {
		kd, err := d.keptAttached(opts)
		if err == nil {
			return d.takeOver(ctx, kd, "kernel device kept its connections: handed over at a request boundary, no disconnect", time.Time{})
		}
		d.log.Warn("the handed-over connections' kernel device is not found; reattaching", "err", err)
	}
	if d.recovered != nil {
		taken, err := d.reattach(ctx, opts)
		if err != nil {
			return err
		}
		if taken {
			return nil
		}
	}
	kd, err := nbddev.Attach(ctx, opts)
	if err != nil {
		return fmt.Errorf("--device %s: %w", d.cfg.Device, err)
	}
	d.kernel.Store(kd)
	d.log.Info("kernel device attached", "device", kd.Path, "netlink", kd.Netlink, "size", kd.Size,
		"request_timeout", kd.Timeout(), "dead_connection_timeout", kd.DeadConnTimeout(), "backend", kd.BackendID)
	if err := kd.SurvivesRestart(); err != nil {
		d.log.Warn("the kernel device will not survive a restart of the serving process: what is swapped to it is lost if gzramd dies", "err", err)
	}
	d.limitRequests(kd)
	if !d.cfg.Swap {
		d.topUpHeap()
		d.keepConnected(kd)
		return nil
	}
	if err := d.makeSwap(ctx, kd.Path, int64(kd.Size), 4*d.cfg.KernelConns); err != nil {
		return err
	}
	d.keepConnected(kd)
	return nil
}

// reattach takes over the kernel device a serving process before this one
// attached, if one waits for this export. It reports false, and no
// error, when none does: it was never attached, or was detached.
func (d *daemon) reattach(ctx context.Context, opts nbddev.Options) (bool, error) {
	opts.Index = nbddev.AnyIndex // the one whose backend is this export, whatever --device says
	start := time.Now()
	rctx, cancel := context.WithTimeout(ctx, reattachTimeout)
	kd, err := nbddev.Reattach(rctx, opts)
	cancel()
	if errors.Is(err, nbddev.ErrNoDevice) {
		d.log.Warn("no kernel device waits for this export; attaching one afresh", "why", err)
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("--device %s: taking over the kernel device of the serving process before this one: %w", d.cfg.Device, err)
	}
	return true, d.takeOver(ctx, kd, "kernel device taken over: its held and re-sent requests go to this process", start)
}

// takeOver makes kd, the kernel device of the serving process before this
// one, this one's: swap on it is ours to turn off at stop.
func (d *daemon) takeOver(ctx context.Context, kd *nbddev.Device, msg string, start time.Time) error {
	d.kernel.Store(kd)
	swap := d.host.IsSwap(kd.Path)
	if !swap && swapctl.InUse(kd.Path) {
		// Held open exclusively, as swap is, though /proc/swaps names
		// it some other way: it holds pages; nothing here may write it.
		d.log.Warn("the kernel device taken over is in use though /proc/swaps does not name it; treating it as the swap it was", "device", kd.Path)
		swap = true
	}
	args := []any{"device", kd.Path, "connections", kd.Connections(), "swap", swap}
	if !start.IsZero() {
		args = append(args, "took", time.Since(start).Round(time.Millisecond))
	}
	d.log.Warn(msg, staleWorkers(kd, args)...)
	d.limitRequests(kd)
	switch {
	case swap:
		// Swap the process before this one turned on (the command line is
		// the same): it is ours to turn off at stop.
		d.swapOn = d.cfg.Swap
		d.topUpHeap()
	case d.cfg.Swap:
		// The process before this one died before swapon: nothing is
		// swapped there yet, and the kernel device is checked as a fresh one is.
		if err := d.makeSwap(ctx, kd.Path, int64(kd.Size), 4*d.cfg.KernelConns); err != nil {
			return err
		}
	default:
		d.topUpHeap()
	}
	d.keepConnected(kd)
	return nil
}

// reattachTimeout bounds taking a waiting kernel device over: dialing the
// export for each connection and waiting for the kernel to find the dead
// process's sockets gone, which it does as soon as their last reference
// closes.
const reattachTimeout = 30 * time.Second

// limitRequests keeps the kernel's requests within the buffers each
// connection holds resident (connBufferReserve): larger ones would
// allocate while serving.
func (d *daemon) limitRequests(kd *nbddev.Device) {
	if !d.cfg.Harden {
		return
	}
	if err := kd.LimitRequests(MaxKernelRequest); err != nil {
		d.log.Warn("kernel requests not limited: requests over the reserved buffer sizes will allocate while serving", "err", err)
	} else {
		d.log.Info("kernel requests limited", "device", kd.Path, "max_sectors_kb", MaxKernelRequest>>10)
	}
}

// makeSwap checks the kernel device at path, of size bytes, with a
// write, read back and discard (parallel requests at once, at most 16),
// and turns swap on.
func (d *daemon) makeSwap(ctx context.Context, path string, size int64, parallel int) error {
	start := time.Now()
	if err := swapctl.SelfTest(ctx, path, size, min(parallel, 16)); err != nil {
		return fmt.Errorf("%s: not making it swap: %w", path, err)
	}
	d.log.Info("kernel device self-test passed: wrote, read back and discarded", "device", path,
		"bytes", min(size, swapctl.SelfTestBytes), "took", time.Since(start).Round(time.Millisecond))
	d.topUpHeap()
	if err := swapctl.Enable(ctx, path, d.cfg.SwapPriority); err != nil {
		return fmt.Errorf("--swap on %s: %w", path, err)
	}
	d.swapOn = true
	d.log.Info("swap on", "device", path, "priority", d.cfg.SwapPriority, "discard", true, "transport", d.cfg.Transport)
	return nil
}

// kernelPath is the kernel device this process attached or created
// (/dev/nbdN, /dev/ublkbN), or "" without one.
func (d *daemon) kernelPath() string {
	if kd := d.kernel.Load(); kd != nil {
		return kd.Path
	}
	if u := d.ublk.current(); u != nil {
		return u.dev.Block
	}
	return ""
}

// keepConnected replaces the kernel's connections that close while this
// process serves: the kernel shuts a connection down when a request on it
// outlasts the request timeout (and may shut down a socket it has just
// taken, see pkg/nbd's reconnect.go), and a kernel device with no connection
// fails its I/O once the dead-connection timeout passes. The kernel's
// connections are the ones this process dialed itself, which only a Unix
// socket tells (the peer's pid).
func (d *daemon) keepConnected(kd *nbddev.Device) {
	if kd.SurvivesRestart() != nil {
		return
	}
	if d.cfg.Socket == "" {
		d.log.Warn("kernel connections that close are not replaced over TCP (the server cannot tell them from other clients); use --socket", "device", kd.Path)
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	d.stopKeeping = func() {
		cancel()
		<-done
	}
	go func() {
		defer close(done)
		self := os.Getpid()
		t := time.NewTicker(100 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			missing := kd.Connections() - d.tracker.CountFrom(self)
			if missing <= 0 {
				continue
			}
			start := time.Now()
			rctx, rcancel := context.WithTimeout(ctx, 10*time.Second)
			err := kd.Reconnect(rctx, missing)
			rcancel()
			if err != nil {
				if ctx.Err() == nil {
					d.log.Error("replacing kernel connections that closed", "device", kd.Path, "missing", missing, "err", err)
				}
				continue
			}
			args := []any{"device", kd.Path, "connections", missing, "took", time.Since(start).Round(time.Millisecond)}
			d.log.Warn("replaced kernel connections that closed", staleWorkers(kd, args)...)
		}
	}()
}

// topUpHeap faults in the heap's free pages once start-up is done (see
// swapsafe.HeapReserve.TopUp), when the daemon holds a reserve and may
// lock it: unlocked, the pages could be reclaimed again anyway.
func (d *daemon) topUpHeap() {
	if d.reserve == nil || !d.lockHeap {
		return
	}
	reportSteps(d.log, d.cfg, []swapsafe.Step{d.reserve.TopUp()}, false)
}

// readyToStop decides whether a stop request can be honoured now. Swap
// that gzramd turned on itself is turned off first; active swap on the
// export that it did not turn on blocks the stop (the kernel would lose
// the swapped pages, and the processes that own them) unless --force.
func (d *daemon) readyToStop(ctx context.Context) bool {
	own := d.kernelPath()
	swaps, err := d.host.Ours(own, &d.tracker)
	if err != nil {
		d.log.Warn("cannot tell whether the export is active swap; stopping", "err", err)
		return true
	}
	if len(swaps) == 0 {
		return true
	}
	_ = d.notify.Notify("STOPPING=1")
	for _, s := range swaps {
		if d.swapOn && own != "" && swapctl.SameFile(s.Path, own) {
			d.log.Info("turning swap off before stopping; the kernel reads the swapped pages back", "device", s.Path, "used_bytes", s.Used)
			_ = d.notify.Notify("STATUS=swapoff " + s.Path)
			sctx, cancel := context.WithTimeout(ctx, swapoffTimeout)
			// Our path, not the list's: the list's may be another
			// mount namespace's (swapctl.SameFile).
			err := swapctl.Disable(sctx, own)
			cancel()
			if err == nil {
				d.swapOn = false
				d.log.Info("swap off", "device", s.Path)
				continue
			}
			if !d.host.IsSwap(s.Path) { // someone else (systemd at shutdown) turned it off first
				d.swapOn = false
				d.log.Info("swap off", "device", s.Path, "note", err.Error())
				continue
			}
			d.log.Error("swapoff failed", "device", s.Path, "err", err)
		}
		if d.cfg.Force {
			d.log.Warn("--force: stopping while the export is active swap; processes with pages there will fail",
				"device", s.Path, "used_bytes", s.Used)
			continue
		}
		d.log.Error("refusing to stop: the export is active swap; run swapoff, or restart with --force",
			"device", s.Path, "used_bytes", s.Used, "fix", "swapoff "+s.Path)
		_ = d.notify.Notify("STATUS=refusing to stop: " + s.Path + " is active swap; run swapoff " + s.Path)
		return false
	}
	return true
}

// stop detaches the kernel device, finishes the requests in flight and
// closes the endpoints.
func (d *daemon) stop() {
	_ = d.notify.Notify("STOPPING=1")
	if d.stopKeeping != nil {
		d.stopKeeping()
	}
	if kd := d.kernel.Load(); kd != nil {
		if err := kd.Detach(); err != nil {
			d.log.Error("detaching the kernel device", "device", kd.Path, "err", err)
		} else {
			d.log.Info("kernel device detached", "device", kd.Path)
		}
	}
	d.ublk.stop()
	d.log.Info("stopping: waiting for requests in flight")
	shutdownCtx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := d.srv.Shutdown(shutdownCtx); err != nil {
		d.log.Warn("NBD shutdown did not finish cleanly", "err", err)
	}
	if d.lis.http != nil {
		_ = d.lis.http.Shutdown(shutdownCtx)
	}
	st := d.dev.Stats()
	d.log.Info("stopped", "stored_pages", st.StoredPages, "same_pages", st.SamePages,
		"orig_data_bytes", st.OrigDataSize, "compr_data_bytes", st.ComprDataSize)
}

// staleWorkers adds to a log line's args how long new sockets waited for
// the kernel's receive workers of dead connections, which run on
// (nbddev/workers.go), and how many were left, where they did.
func staleWorkers(kd *nbddev.Device, args []any) []any {
	if waited, left := kd.StaleWorkers(); waited >= time.Millisecond || left > 0 {
		args = append(args, "waited_for_old_receive_workers", waited.Round(time.Millisecond), "old_receive_workers_left", left)
	}
	return args
}
