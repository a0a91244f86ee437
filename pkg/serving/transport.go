// The kernel device's transport (--transport): NBD, attached through the
// nbd module, or ublk, a device this process creates and serves itself.

package serving

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/gzramd/gzramd/pkg/ublk"
)

// The transports of --transport.
const (
	TransportNBD  = "nbd"
	TransportUblk = "ublk"
	TransportAuto = "auto"
)

// ResolveTransport decides the kernel device's transport from
// --transport, and why where it was not asked for by name. auto is ublk
// where probe (ublk.Probe on the control device, in the daemon) passes and
// the kernel device need not survive the serving process (--supervise=false),
// else nbd: the ublk takeover is new, and auto keeps the supervised
// daemon on the one the survive scenarios have long proved. Without a kernel
// device (--device, --swap) there is nothing to decide (nbd, the
// export's), nor with --device /dev/nbdN. An explicit ublk that probe
// fails is an error saying what is missing.
func (c *Config) ResolveTransport(probe func() error) (transport, why string, err error) {
	switch {
	case c.Transport == TransportNBD:
		return TransportNBD, "", nil
	case c.Device == "" && !c.Swap:
		return TransportNBD, "no kernel device (--device, --swap): only the NBD export", nil
	case c.Transport == TransportUblk:
		if err := probe(); err != nil {
			return "", "", fmt.Errorf("--transport ublk: %w", err)
		}
		return TransportUblk, "", nil
	case c.Device != "auto" && !(c.Device == "" && c.Swap):
		return TransportNBD, "--device " + c.Device + " names an NBD device", nil
	case c.Supervise:
		return TransportNBD, "under the supervisor auto keeps NBD, whose takeover has the longer record; --transport ublk asks for ublk's", nil
	}
	if err := probe(); err != nil {
		return TransportNBD, "ublk is not usable here: " + err.Error(), nil
	}
	return TransportUblk, "/dev/ublk-control opens and --supervise is off", nil
}

// ProbeUblk is the probe of ResolveTransport on this machine.
func ProbeUblk() error { return ublk.Probe(ublk.DefaultControlPath) }

// ublkDevice is the ublk device the daemon serves the kernel
// (--transport ublk): ublk.Serve (or ublk.Recover, for one taken over)
// runs until stop, then removes it, or leaves it to the next serving
// process (ublk.ErrLeave).
type ublkDevice struct {
	dev     ublk.Device
	ctx     context.Context // Serve's: done once stop was called
	stop    context.CancelCauseFunc
	stopped chan struct{} // closed once Serve returned, err set
	err     error
}

// attachUblk serves the ublk device from the daemon's backend and makes it
// swap (--swap). Under a supervisor the device outlives this process
// (ublk.Config.Recoverable), tagged with the state's id: a serving process
// that takes the state over, after a death or at an upgrade, finds the
// device by the tag and serves it again (ublk.Recover), the requests the
// kernel held for it meanwhile included. Otherwise, or where no device
// waits, it creates one.
func (d *daemon) attachUblk(ctx context.Context) error {
	// Not ctx: the device must outlive a cancelled start until stop has
	// turned its swap off.
	sctx, cancel := context.WithCancelCause(context.WithoutCancel(ctx))
	u := &ublkDevice{ctx: sctx, stop: cancel, stopped: make(chan struct{})}
	ready := make(chan ublk.Device, 1)
	tag, recoverable := d.ublkTag()
	cfg := ublk.Config{
		// Serving swap: its queues' allocations must not wait for the
		// writes they would serve (the rest of swap safety is the
		// process's, pkg/swapsafe, as for NBD).
		IOFlusher:   d.cfg.Harden,
		Recoverable: recoverable,
		Tag:         tag,
		Ready:       func(dev ublk.Device) { ready <- dev },
	}
	if d.ublkRequests != nil {
		cfg.Observer = d.ublkRequests
	}
	start := time.Now()
	if !recoverable {
		d.removeLeftUblk()
	}
	id, taken := d.waitingUblk(tag, recoverable)
	go func() {
		if taken {
			u.err = ublk.Recover(sctx, cfg, id, d.served)
		} else {
			u.err = ublk.Serve(sctx, cfg, d.served)
		}
		close(u.stopped)
	}()
	select {
	case u.dev = <-ready:
	case <-u.stopped:
		cancel(nil)
		if taken {
			return fmt.Errorf("--transport ublk: taking over /dev/ublkb%d: %w", id, u.err)
		}
		return fmt.Errorf("--transport ublk: %w", u.err)
	}
	d.ublk.Store(u)
	go d.watchUblk(u)
	took := time.Since(start).Round(time.Millisecond)
	if taken {
		return d.tookOverUblk(ctx, u.dev, took)
	}
	d.log.Info("kernel device created", "transport", TransportUblk, "device", u.dev.Block, "queues", u.dev.Queues,
		"depth", u.dev.Depth, "max_io_bytes", u.dev.MaxIOBytes, "survives_this_process", recoverable, "took", took)
	if !recoverable {
		d.log.Warn("the ublk device will not survive the serving process: what is swapped to it is lost if gzramd dies (no supervisor: --supervise=false)",
			"device", u.dev.Block)
	}
	if !d.cfg.Swap {
		d.topUpHeap()
		return nil
	}
	return d.makeSwap(ctx, u.dev.Block, int64(d.cfg.Size), 4*u.dev.Queues)
}

// unsupervisedTag tags the ublk devices gzramd serves without a
// supervisor ("gzramd"): a device one of them left when it died is
// stopped by the driver and kept until deleted, and the next start
// deletes it (removeLeftUblk).
const unsupervisedTag = 0x646d61727a67

// ublkTag is the tag of the ublk device, and whether the device is to
// outlive this process: under a supervisor, which holds the state the
// next serving process takes over, the state's id names it.
func (d *daemon) ublkTag() (uint64, bool) {
	if !d.start.Serving || d.state == nil {
		return unsupervisedTag, false
	}
	info, err := d.state.Info()
	if err != nil || len(info.ID) < 16 {
		d.log.Warn("the state's id is not readable: the ublk device will not survive the serving process", "err", err)
		return unsupervisedTag, false
	}
	tag, err := strconv.ParseUint(info.ID[:16], 16, 64)
	if err != nil || tag == 0 || tag == unsupervisedTag {
		return unsupervisedTag, false
	}
	return tag, true
}

// removeLeftUblk deletes the ublk devices unsupervised gzramds left when
// they died: stopped, their disks and swap gone with them, kept by the
// driver until deleted.
func (d *daemon) removeLeftUblk() {
	ids, err := ublk.RemoveLeft("", unsupervisedTag)
	for _, id := range ids {
		d.log.Warn("removed a ublk device a gzramd left when it died without a supervisor (what was swapped there was lost then)",
			"device", fmt.Sprintf("/dev/ublkb%d", id))
	}
	if err != nil {
		d.log.Warn("removing ublk devices left by dead gzramds", "err", err)
	}
}

// waitingUblk finds the ublk device a serving process before this one
// left with the state this one took over, if one waits.
func (d *daemon) waitingUblk(tag uint64, recoverable bool) (int, bool) {
	if d.recovered == nil || !recoverable {
		return 0, false
	}
	id, quiesced, err := ublk.Find("", tag)
	if err != nil {
		d.log.Warn("no ublk device waits for this state; creating one afresh", "why", err)
		return 0, false
	}
	d.log.Info("taking over the ublk device the serving process before this one left", "device", fmt.Sprintf("/dev/ublkb%d", id), "quiesced", quiesced)
	return id, true
}

// tookOverUblk makes dev, the ublk device of the serving process before
// this one, this one's: swap on it is ours to turn off at stop.
func (d *daemon) tookOverUblk(ctx context.Context, dev ublk.Device, took time.Duration) error {
	swap := d.host.IsSwap(dev.Block)
	d.log.Warn("kernel device taken over: its held and re-sent requests go to this process", "transport", TransportUblk,
		"device", dev.Block, "queues", dev.Queues, "swap", swap, "took", took)
	switch {
	case swap:
		d.swapOn = d.cfg.Swap
		d.topUpHeap()
	case d.cfg.Swap:
		// The process before this one died before swapon.
		return d.makeSwap(ctx, dev.Block, int64(d.cfg.Size), 4*dev.Queues)
	default:
		d.topUpHeap()
	}
	return nil
}

// watchUblk logs the ublk device's end if it comes before stop asked for
// it: a queue failed, and the kernel device fails its I/O.
func (d *daemon) watchUblk(u *ublkDevice) {
	<-u.stopped
	if u.ctx.Err() == nil {
		d.log.Error("the ublk device stopped serving on its own: its I/O fails from now on", "device", u.dev.Block, "err", u.err)
	}
}

// stopUblk stops and removes the ublk device, once swap on it is off.
func (d *daemon) stopUblk() {
	u := d.ublk.Load()
	if u == nil {
		return
	}
	u.stop(nil)
	<-u.stopped
	if u.err != nil {
		d.log.Error("removing the ublk device", "device", u.dev.Block, "err", u.err)
		return
	}
	d.log.Info("kernel device removed", "transport", TransportUblk, "device", u.dev.Block)
}

// leaveUblk leaves the ublk device to the next serving process at a
// handover: the requests in hand are answered, and the kernel holds the
// rest for the next, which takes the device over. Swap stays on.
func (d *daemon) leaveUblk() {
	u := d.ublk.Load()
	if u == nil {
		return
	}
	start := time.Now()
	u.stop(ublk.ErrLeave)
	<-u.stopped
	if u.err != nil {
		d.log.Error("leaving the ublk device to the next serving process", "device", u.dev.Block, "err", u.err)
		return
	}
	d.log.Info("ublk device left to the next serving process", "device", u.dev.Block, "took", time.Since(start).Round(time.Millisecond))
}

// transportInfo is gzramd_transport_info: constant 1, labelled with the
// kernel device's transport, for dashboards to tell the two apart.
func transportInfo(transport string) prometheus.Collector {
	return prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name:        "gzramd_transport_info",
		Help:        "Constant 1, labelled with how the kernel device is served: nbd (also without a kernel device: the NBD export) or ublk (--transport).",
		ConstLabels: prometheus.Labels{"transport": transport},
	}, func() float64 { return 1 })
}

// stackShrinkOff keeps the garbage collector from shrinking goroutine
// stacks (GODEBUG=gcshrinkstackoff=1) in the process the re-exec starts:
// each ublk queue grows its stack before it serves, and growing it again
// while serving swap would allocate (ublk's doc, Serving swap). The
// runtime reads GODEBUG only at start, so this takes effect there.
func stackShrinkOff() {
	v := os.Getenv("GODEBUG")
	if strings.Contains(v, "gcshrinkstackoff=") {
		return
	}
	if v != "" {
		v += ","
	}
	os.Setenv("GODEBUG", v+"gcshrinkstackoff=1")
}
