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
// where probe (ublk.Probe on the control device, in the daemon) passes,
// supervised or not (a supervised ublk device is taken over by ublk user
// recovery, as the survive-ublk scenarios prove), else nbd. Without a kernel
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
	}
	if err := probe(); err != nil {
		return TransportNBD, "ublk is not usable here: " + err.Error(), nil
	}
	return TransportUblk, "/dev/ublk-control opens", nil
}

// ProbeUblk is the probe of ResolveTransport on this machine.
func ProbeUblk() error { return ublk.Probe(ublk.DefaultControlPath) }

// attachUblk serves the ublk device from the daemon's backend and makes it
// swap (--swap). Under a supervisor the device outlives this process
// (ublk.Config.Recoverable), tagged with the state's id: a serving process
// that takes the state over, after a death or at an upgrade, finds the
// device by the tag and serves it again (ublk.Recover), the requests the
// kernel held for it meanwhile included. Otherwise, or where no device
// waits, it creates one.
func (d *daemon) attachUblk(ctx context.Context) error {
	start := time.Now()
	tag, recoverable := d.ublkTag()
	if !recoverable {
		d.ublk.removeLeft()
	}
	id, taken := 0, false
	if d.recovered != nil && recoverable {
		id, taken = d.ublk.waiting(tag)
	}
	dev, err := d.ublk.serve(ctx, tag, recoverable, id, taken)
	if err != nil {
		return err
	}
	took := time.Since(start).Round(time.Millisecond)
	if taken {
		return d.tookOverUblk(ctx, dev, took)
	}
	d.log.Info("kernel device created", "transport", TransportUblk, "device", dev.Block, "queues", dev.Queues,
		"depth", dev.Depth, "max_io_bytes", dev.MaxIOBytes, "survives_this_process", recoverable, "took", took)
	if !recoverable {
		why := "no supervisor: --supervise=false"
		if d.cfg.KernelDeadTimeout < 0 {
			why = "--kernel-dead-timeout -1s"
		}
		d.log.Warn("the ublk device will not survive the serving process: what is swapped to it is lost if gzramd dies ("+why+")",
			"device", dev.Block)
	}
	if !d.cfg.Swap {
		d.topUpHeap()
		return nil
	}
	return d.makeSwap(ctx, dev.Block, int64(d.cfg.Size), 4*dev.Queues)
}

// ublkTag is the tag of the ublk device, and whether the device is to
// outlive this process: under a supervisor, which holds the state the
// next serving process takes over, the state's id names it. With
// --kernel-dead-timeout -1s the device is to fail its I/O as soon as its
// server dies, as an NBD device does: it is made without recovery, and
// tagged as an unsupervised one's, for the next start to remove.
func (d *daemon) ublkTag() (uint64, bool) {
	if !d.start.Serving || d.state == nil || d.cfg.KernelDeadTimeout < 0 {
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
