// The kernel device's transport (--transport): NBD, attached through the
// nbd module, or ublk, a device this process creates and serves itself.

package serving

import (
	"context"
	"fmt"
	"os"
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
// the device need not survive the serving process (--supervise=false),
// else nbd: a ublk device cannot be taken over yet. Without a kernel
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
		return TransportNBD, "a ublk device does not survive the serving process yet (no ublk user recovery); --supervise needs NBD", nil
	}
	if err := probe(); err != nil {
		return TransportNBD, "ublk is not usable here: " + err.Error(), nil
	}
	return TransportUblk, "/dev/ublk-control opens and --supervise is off", nil
}

// ProbeUblk is the probe of ResolveTransport on this machine.
func ProbeUblk() error { return ublk.Probe(ublk.DefaultControlPath) }

// ublkDevice is the ublk device the daemon serves the kernel
// (--transport ublk): ublk.Serve runs until stop, then removes it.
type ublkDevice struct {
	dev     ublk.Device
	ctx     context.Context // Serve's: done once stop was called
	stop    context.CancelFunc
	stopped chan struct{} // closed once Serve returned, err set
	err     error
}

// attachUblk creates the ublk device, serves it from the daemon's
// backend, and makes it swap (--swap). The device goes with this process:
// nothing takes it over (ublk.Serve creates it without user recovery).
func (d *daemon) attachUblk(ctx context.Context) error {
	// Not ctx: the device must outlive a cancelled start until stop has
	// turned its swap off.
	sctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	u := &ublkDevice{ctx: sctx, stop: cancel, stopped: make(chan struct{})}
	ready := make(chan ublk.Device, 1)
	cfg := ublk.Config{
		// Serving swap: its queues' allocations must not wait for the
		// writes they would serve (the rest of swap safety is the
		// process's, pkg/swapsafe, as for NBD).
		IOFlusher: d.cfg.Harden,
		Ready:     func(dev ublk.Device) { ready <- dev },
	}
	start := time.Now()
	go func() {
		u.err = ublk.Serve(sctx, cfg, d.served)
		close(u.stopped)
	}()
	select {
	case u.dev = <-ready:
	case <-u.stopped:
		cancel()
		return fmt.Errorf("--transport ublk: %w", u.err)
	}
	d.ublk.Store(u)
	go d.watchUblk(u)
	d.log.Info("kernel device created", "transport", TransportUblk, "device", u.dev.Block, "queues", u.dev.Queues,
		"depth", u.dev.Depth, "max_io_bytes", u.dev.MaxIOBytes, "took", time.Since(start).Round(time.Millisecond))
	d.log.Warn("the ublk device will not survive the serving process: what is swapped to it is lost if gzramd dies (no ublk user recovery yet)",
		"device", u.dev.Block)
	if !d.cfg.Swap {
		d.topUpHeap()
		return nil
	}
	return d.makeSwap(ctx, u.dev.Block, int64(d.cfg.Size), 4*u.dev.Queues)
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
	u.stop()
	<-u.stopped
	if u.err != nil {
		d.log.Error("removing the ublk device", "device", u.dev.Block, "err", u.err)
		return
	}
	d.log.Info("kernel device removed", "transport", TransportUblk, "device", u.dev.Block)
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
