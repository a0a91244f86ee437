// The kernel device and swap: attaching it, making it swap, and stopping safely while it is.

package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/gzramd/gzramd/pkg/nbd"
	"github.com/gzramd/gzramd/pkg/swapctl"
)

// parseDevice accepts /dev/nbdN, nbdN or "auto" (any free device).
func parseDevice(s string) (index int, err error) {
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
func (d *daemon) attach(ctx context.Context) error {
	if d.cfg.device == "" {
		d.topUpHeap()
		return nil
	}
	index, _ := parseDevice(d.cfg.device) // validated
	if _, err := os.Stat(sysModuleNBD); err != nil {
		return fmt.Errorf("--device %s: the kernel's nbd module is not loaded (run modprobe nbd; it ships with the kernel)", d.cfg.device)
	}
	opts := nbd.KernelOptions{
		Export: d.cfg.export, Index: index, Connections: d.cfg.kernelConns, Timeout: d.cfg.kernelTimeout,
	}
	if d.cfg.socket != "" {
		opts.Network, opts.Address = "unix", d.cfg.socket
	} else {
		opts.Network, opts.Address = "tcp", tcpAddr(d.cfg.tcp)
	}
	kd, err := nbd.AttachKernel(ctx, opts)
	if err != nil {
		return fmt.Errorf("--device %s: %w", d.cfg.device, err)
	}
	d.kernel.Store(kd)
	d.log.Info("kernel device attached", "device", kd.Path, "netlink", kd.Netlink, "size", kd.Size)
	if d.cfg.harden {
		// Requests up to the sizes of the buffers each connection keeps
		// resident (connBufferReserve): larger ones would allocate.
		if err := kd.LimitRequests(maxKernelRequest); err != nil {
			d.log.Warn("kernel requests not limited: requests over the reserved buffer sizes will allocate while serving", "err", err)
		} else {
			d.log.Info("kernel requests limited", "device", kd.Path, "max_sectors_kb", maxKernelRequest>>10)
		}
	}
	if !d.cfg.swap {
		d.topUpHeap()
		return nil
	}
	start := time.Now()
	if err := swapctl.SelfTest(ctx, kd.Path, int64(kd.Size), min(4*d.cfg.kernelConns, 16)); err != nil {
		return fmt.Errorf("%s: not making it swap: %w", kd.Path, err)
	}
	d.log.Info("kernel device self-test passed: wrote, read back and discarded", "device", kd.Path,
		"bytes", min(int64(kd.Size), swapctl.SelfTestBytes), "took", time.Since(start).Round(time.Millisecond))
	d.topUpHeap()
	if err := swapctl.Enable(ctx, kd.Path, d.cfg.swapPriority); err != nil {
		return fmt.Errorf("--swap on %s: %w", kd.Path, err)
	}
	d.swapOn = true
	d.log.Info("swap on", "device", kd.Path, "priority", d.cfg.swapPriority, "discard", true)
	return nil
}

// topUpHeap faults in the heap's free pages once start-up is done (see
// swapsafe.HeapReserve.TopUp), when the daemon holds a reserve.
func (d *daemon) topUpHeap() {
	if d.reserve == nil {
		return
	}
	logStep(d.log, d.reserve.TopUp())
}

// readyToStop decides whether a stop request can be honoured now. Swap
// that gzramd turned on itself is turned off first; active swap on the
// export that it did not turn on blocks the stop (the kernel would lose
// the swapped pages, and the processes that own them) unless --force.
func (d *daemon) readyToStop(ctx context.Context) bool {
	own := ""
	if kd := d.kernel.Load(); kd != nil {
		own = kd.Path
	}
	swaps, err := d.host.Ours(own, &d.tracker)
	if err != nil {
		d.log.Warn("cannot tell whether the export is active swap; stopping", "err", err)
		return true
	}
	if len(swaps) == 0 {
		return true
	}
	_ = d.notify.notify("STOPPING=1")
	for _, s := range swaps {
		if d.swapOn && own != "" && swapctl.SameFile(s.Path, own) {
			d.log.Info("turning swap off before stopping; the kernel reads the swapped pages back", "device", s.Path, "used_bytes", s.Used)
			_ = d.notify.notify("STATUS=swapoff " + s.Path)
			sctx, cancel := context.WithTimeout(ctx, swapoffTimeout)
			err := swapctl.Disable(sctx, s.Path)
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
		if d.cfg.force {
			d.log.Warn("--force: stopping while the export is active swap; processes with pages there will fail",
				"device", s.Path, "used_bytes", s.Used)
			continue
		}
		d.log.Error("refusing to stop: the export is active swap; run swapoff, or restart with --force",
			"device", s.Path, "used_bytes", s.Used, "fix", "swapoff "+s.Path)
		_ = d.notify.notify("STATUS=refusing to stop: " + s.Path + " is active swap; run swapoff " + s.Path)
		return false
	}
	return true
}

// stop detaches the kernel device, finishes the requests in flight and
// closes the endpoints.
func (d *daemon) stop() {
	_ = d.notify.notify("STOPPING=1")
	if kd := d.kernel.Load(); kd != nil {
		if err := kd.Detach(); err != nil {
			d.log.Error("detaching the kernel device", "device", kd.Path, "err", err)
		} else {
			d.log.Info("kernel device detached", "device", kd.Path)
		}
	}
	d.log.Info("stopping: waiting for requests in flight")
	shutdownCtx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := d.srv.Shutdown(shutdownCtx); err != nil {
		d.log.Warn("NBD shutdown did not finish cleanly", "err", err)
	}
	if d.httpSrv != nil {
		_ = d.httpSrv.Shutdown(shutdownCtx)
	}
	st := d.dev.Stats()
	d.log.Info("stopped", "stored_pages", st.StoredPages, "same_pages", st.SamePages,
		"orig_data_bytes", st.OrigDataSize, "compr_data_bytes", st.ComprDataSize)
}
