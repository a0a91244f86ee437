// A running daemon: the data path, the kernel device, serving, and stopping safely.

package serving

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"runtime"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/gzramd/gzramd/internal/sdnotify"
	"github.com/gzramd/gzramd/pkg/blockdev"
	"github.com/gzramd/gzramd/pkg/codec"
	"github.com/gzramd/gzramd/pkg/device"
	"github.com/gzramd/gzramd/pkg/gpu"
	"github.com/gzramd/gzramd/pkg/iolog"
	"github.com/gzramd/gzramd/pkg/metrics"
	"github.com/gzramd/gzramd/pkg/nbd"
	"github.com/gzramd/gzramd/pkg/nbddev"
	"github.com/gzramd/gzramd/pkg/pipeline"
	"github.com/gzramd/gzramd/pkg/supervise"
	"github.com/gzramd/gzramd/pkg/swapctl"
	"github.com/gzramd/gzramd/pkg/swapsafe"
)

// daemon is a running gzramd: the data path, its listeners, the HTTP
// endpoint and, with --device/--swap, the kernel device.
type daemon struct {
	cfg     *Config
	version string // gzramd's, for the logs, /status and the metrics
	log     *slog.Logger
	started time.Time
	notify  *sdnotify.Notifier
	accel   *accelerator
	pipe    *pipeline.Pipeline
	dev     *device.Device // pipe.Device
	// recovered is what the data path was taken over with, when a
	// serving process before this one died; nil when it started empty.
	recovered *device.Recovered
	// start is what the supervisor told this process (the zero value
	// without one): start.DiedAt is when the last serving process died.
	// takeovers counts them over the state's life, pause how long the
	// kernel device went without a server then (set once this one serves).
	start     supervise.Started
	takeovers uint64
	pause     atomic.Int64
	srv       *nbd.Server
	tracker   swapctl.Tracker
	// conns counts the open NBD connections by client, for the metrics
	// and the labels /status shows.
	conns *metrics.Connections
	host  swapctl.Host // the kernel's swap list and block devices
	reg   *prometheus.Registry
	trace *iolog.Recorder // --record-trace

	lis      *listeners            // from run on
	report   reporter              // reads the daemon for /status and the metrics
	reserve  *swapsafe.HeapReserve // topped up before serving swap
	lockHeap bool                  // mlockall took, so the heap is kept locked too
	gpuSetup gpuSetup              // how the GPU opens, for openLate
	// kernel is the NBD kernel device we attached (--device); /status reads it
	// from the HTTP server's goroutines.
	kernel atomic.Pointer[nbddev.Device]
	// ublk serves the kernel device with --transport ublk instead,
	// created and served by this process; served is the backend both
	// transports serve (the device, or a faults build's stand-in).
	ublk   ublkServer
	served blockdev.Backend
	swapOn bool // we ran swapon on the kernel device (kernelPath)
	// stopKeeping stops replacing the kernel's closed connections
	// (keepConnected), before the kernel device is detached.
	stopKeeping func()
	// handover is the socket to the supervisor for the live connections
	// at an upgrade (nil without one); adopt are the connections the
	// serving process before this one handed over, until served, and
	// adoptedKernel how many of them are the kernel device's.
	handover      *os.File
	adopt         []supervise.Message
	adoptedKernel int
	// state is what the data path lives in; orphaned is set once the
	// supervisor died and this process serves on (see orphan.go), until
	// the next supervisor's serving process asks for the connections
	// (successor: the socket to send them on, handoverTo once asked).
	state      *pipeline.State
	orphaned   bool
	successor  chan *os.File
	handoverTo *os.File
}

// storeArenaSize is the page store's mapping step in the daemon.
const storeArenaSize = 8 << 20

func newDaemon(cfg *Config, version string, st *pipeline.State, start supervise.Started, kernels kernelImage, log *slog.Logger) (_ *daemon, err error) {
	d := &daemon{cfg: cfg, version: version, start: start, log: log, started: time.Now(), notify: sdnotify.FromEnv(), state: st, successor: make(chan *os.File, 1)}
	d.report = reporter{d}
	defer func() {
		if err != nil {
			d.close()
		}
	}()
	if d.accel, d.gpuSetup, err = setUpAccelerator(cfg, start.DiedAt, kernels, func(info gpu.DeviceInfo) { gpuOpened(cfg, info, log) }, log); err != nil {
		return nil, err
	}
	batchObs := metrics.NewBatches()
	batchObs.Track("cpu")
	if d.accel.staged() {
		batchObs.Track("gpu")
	}
	if err = d.openPipeline(batchObs); err != nil {
		return nil, err
	}
	d.noteTakeover()
	d.dev = d.pipe.Device
	if g, _, _ := d.accel.current(); g != nil {
		denseOnGPU(cfg, d.dev, g, log)
	}
	nbdObs, err := d.newNBDServer()
	if err != nil {
		return nil, err
	}
	d.ublk = ublkServer{backend: d.served, depth: cfg.UblkDepth, ioFlusher: cfg.Harden, log: log}
	if cfg.Transport == TransportUblk {
		d.ublk.requests = metrics.NewUblk()
	}
	if d.reg, err = metrics.NewRegistry(d.collectors(nbdObs, batchObs)...); err != nil {
		return nil, fmt.Errorf("registering metrics: %w", err)
	}
	return d, nil
}

// openPipeline opens the data path over the state, taking over what a
// serving process before this one left there (d.recovered).
func (d *daemon) openPipeline(batchObs *metrics.Batches) (err error) {
	cfg := d.cfg
	d.pipe, d.recovered, err = pipeline.Open(pipeline.Config{
		State: d.state,
		Size:  int64(cfg.Size), Algorithm: cfg.Algorithm,
		MemLimit: int64(cfg.MemLimit), Prefault: int64(cfg.Prefault),
		// Under mlockall each arena is populated when mapped: map it in
		// small steps, ahead of need (Prefault), not 64 MiB at a time.
		ArenaSize:     storeArenaSize,
		HugeThreshold: cfg.HugeThreshold, ObjectPages: cfg.ObjectPages,
		Dense:       device.DenseConfig{After: cfg.DenseAfter, CPU: cfg.DenseCPU, Level: cfg.DenseLevel},
		Accelerator: standInGPU(d.accel.routeAccelerator()), MinAcceleratorPages: cfg.GPUMinPages,
		StagingBytes: int64(cfg.Staging), StagingWait: cfg.StagingWait, BatchPages: cfg.BatchPages,
		BatchDeadline: cfg.BatchDeadline, BatchWorkers: cfg.BatchInFlight,
		Observer: batchObs, Logger: d.log,
	})
	return err
}

// noteTakeover counts the takeovers the state has seen and logs this one,
// if the device was taken over.
func (d *daemon) noteTakeover() {
	info, _ := d.state.Info()
	d.takeovers = info.Takeovers
	switch {
	case d.recovered != nil && d.start.HandedOver:
		d.log.Info("took the device over from the serving process before this one, which handed it over (an upgrade)",
			"found", d.recovered.String(), "takeovers", info.Takeovers, "state", info.ID)
	case d.recovered != nil:
		d.log.Warn("took the device over from a serving process that died", "found", d.recovered.String(),
			"takeovers", info.Takeovers, "state", info.ID)
	}
}

// newNBDServer makes the NBD server of the export, with the trace
// recorder of --record-trace, and returns its metrics.
func (d *daemon) newNBDServer() (_ *metrics.NBD, err error) {
	cfg, log := d.cfg, d.log
	var rec nbd.Recorder // stays nil, not a nil *iolog.Recorder, unless recording
	if cfg.RecordTrace != "" {
		if d.trace, err = iolog.Create(cfg.RecordTrace, cfg.Export, log); err != nil {
			return nil, fmt.Errorf("--record-trace: %w", err)
		}
		rec = d.trace
	}
	nbdObs := metrics.NewNBD()
	d.conns = metrics.NewConnections(func() []nbd.ConnInfo { return d.srv.Connections() })
	d.served, d.host = withFaults(d.dev, d.recovered != nil && !d.start.HandedOver, log)
	d.srv, err = nbd.NewServer([]nbd.Export{{Name: cfg.Export, Description: "gzramd compressed RAM device", Backend: d.served}},
		nbd.Options{Logger: log, Observer: nbdObs, Inline: cfg.NBDInline != "off",
			InlineHelpers:  inlineHelpers(cfg, runtime.GOMAXPROCS(0)),
			ReserveBuffers: connBuffers(cfg), Recorder: rec,
			MaxConnections: maxConnections(cfg), Own: d.ownConn})
	if err != nil {
		return nil, err
	}
	return nbdObs, nil
}

// collectors are the daemon's metrics.
func (d *daemon) collectors(nbdObs *metrics.NBD, batchObs *metrics.Batches) []prometheus.Collector {
	cfg := d.cfg
	collectors := append([]prometheus.Collector{nbdObs, batchObs, metrics.NewDevice(metrics.Info{
		Version: d.version, Export: cfg.Export, Algorithm: cfg.Algorithm,
		Backend: d.accel.name(), DiskSize: int64(cfg.Size),
	}, d.dev.Stats, d.pipe.Router.Stats), metrics.NewKernel(d.report.kernelState), metrics.NewHeld(d.report.holdings),
		metrics.NewSelf(d.report.selfMemory, d.log), d.conns, transportInfo(cfg.Transport),
		metrics.NewTakeover(func() metrics.Takeovers {
			return metrics.Takeovers{Count: d.takeovers, LastPause: time.Duration(d.pause.Load())}
		}),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "gzramd_nbd_payload_buffers_allocated_total",
			Help: "NBD payload buffers allocated: the reserve made at start, then any request that needed more (an allocation on the request path).",
		}, func() float64 { return float64(d.srv.PayloadBuffersAllocated()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "gzramd_nbd_connections_refused_total",
			Help: "NBD connections closed at accept: --max-connections connections other than the kernel device's were open.",
		}, func() float64 { return float64(d.srv.ConnectionsRefused()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "gzramd_nbd_handshake_timeouts_total",
			Help: "NBD connections closed because their handshake did not finish in time.",
		}, func() float64 { return float64(d.srv.HandshakeTimeouts()) }),
	}, d.accel.collectors(cfg.GPUDevice, d.pipe.Router, d.log)...)
	if d.trace != nil {
		collectors = append(collectors, metrics.NewTrace(d.trace))
	}
	if d.ublk.requests != nil {
		collectors = append(collectors, d.ublk.requests)
	}
	return collectors
}

// close releases what newDaemon and run built, in reverse order.
func (d *daemon) close() {
	if d.lis != nil {
		d.lis.close()
	}
	if d.trace != nil {
		d.trace.Close() // the NBD server is shut down: nothing more to record; it logs how it went
	}
	if d.pipe != nil {
		if err := d.pipe.Close(); err != nil {
			d.log.Warn("closing the data path", "err", err)
		}
	}
	if d.accel != nil {
		d.accel.close(d.log) // after the pipeline: staging lives in its memory
	}
}

// run serves until a signal asks it to stop and stopping is safe.
func (d *daemon) run(ctx context.Context) error {
	defer d.close()
	sigs := d.notifySignals()
	defer sigs.stop()

	d.lis = &listeners{cfg: d.cfg, log: d.log, srv: d.srv, diedAt: d.start.DiedAt, recovered: d.recovered != nil}
	errc, err := d.lis.serve(&d.tracker, d.reg, d.report.serveStatus)
	if err != nil {
		return err
	}
	d.adoptedKernel = d.adoptConnections()
	if d.handover != nil {
		// It serves: a death from now on is no crash at start, and the
		// supervisor starts the next at once.
		if err := supervise.Ready(d.handover); err != nil {
			d.log.Warn("telling the supervisor this process serves", "err", err)
		}
	}
	bg := &background{pipe: d.pipe, reserve: d.reserve, lockHeap: d.lockHeap, prefault: d.cfg.Prefault, log: d.log}
	stopBackground := bg.start()
	defer stopBackground()

	// One collection while memory is plentiful: the runtime builds the
	// pointer masks of large types (the store, the device) on their first
	// scan, in fresh memory; a guest froze on a GC worker doing that
	// under memory pressure.
	runtime.GC()
	d.report.logHoldings()

	serveErr := d.attachAndServe(ctx, sigs, errc)
	if errors.Is(serveErr, errHandOver) {
		d.handOver()
		return serveErr
	}
	d.stop()
	return serveErr
}

// daemonSignals are the signals the serving process acts on, a channel
// each: term (SIGINT, SIGTERM), dump (SIGUSR1), upgrade (SIGHUP) and
// orphan (SupervisorGone).
type daemonSignals struct {
	term, dump, upgrade, orphan chan os.Signal
}

// notifySignals starts receiving the signals the serving process acts on.
func (d *daemon) notifySignals() *daemonSignals {
	s := &daemonSignals{term: make(chan os.Signal, 4)}
	// Never stopped: a stop signal after the stop (a terminal's ^C comes
	// twice, the supervisor forwarding its own) would otherwise kill the
	// process as it exits, and the supervisor would take that for a death.
	signal.Notify(s.term, syscall.SIGINT, syscall.SIGTERM)
	s.dump = make(chan os.Signal, 1)
	signal.Notify(s.dump, syscall.SIGUSR1)
	s.upgrade = make(chan os.Signal, 1)
	signal.Notify(s.upgrade, syscall.SIGHUP)
	s.orphan = make(chan os.Signal, 1)
	signal.Notify(s.orphan, SupervisorGone)
	if d.start.Serving && !d.start.SupervisorAlive() && d.start.ParentDeath == SupervisorGone {
		// The supervisor died while this process started, and its signal
		// came before anything listened for it (Go ignores SIGUSR2 then).
		s.orphan <- SupervisorGone
	}
	return s
}

// stop stops the signals but term's (see notifySignals), in the reverse
// order of their start.
func (s *daemonSignals) stop() {
	signal.Stop(s.orphan)
	signal.Stop(s.upgrade)
	signal.Stop(s.dump)
}

// attachAndServe attaches the kernel device (--device), says that it
// serves, and serves until wait returns.
func (d *daemon) attachAndServe(ctx context.Context, sigs *daemonSignals, errc <-chan error) error {
	if err := d.attach(ctx); err != nil {
		d.log.Error("stopping", "err", err)
		return err
	}
	d.announceReady()
	if d.start.Stopping {
		// A stop was asked for while no serving process ran.
		d.log.Info("stopping as the supervisor asked")
		sigs.term <- syscall.SIGTERM
	}
	return d.wait(ctx, sigs.term, sigs.dump, sigs.upgrade, sigs.orphan, errc)
}

// announceReady logs that the daemon serves (and the pause, after a
// takeover), opens the GPU late where it was left for later, and tells
// systemd.
func (d *daemon) announceReady() {
	d.log.Info("gzramd ready", "version", d.version, "size", d.cfg.Size.String(), "algorithm", d.cfg.Algorithm,
		"backend", d.accel.name(), "transport", d.cfg.Transport, "device", d.kernelPath(), "mem_limit", d.cfg.MemLimit.String(), statusAttr(d.cfg.Metrics))
	if d.recovered != nil && !d.start.DiedAt.IsZero() {
		pause := time.Since(d.start.DiedAt)
		d.pause.Store(int64(pause))
		d.log.Warn("serving again after the takeover", "pause", pause.Round(time.Millisecond), "takeovers", d.takeovers)
	}
	if d.accel.late != nil {
		go d.accel.openLate(d.gpuSetup,
			func(info gpu.DeviceInfo) { gpuOpened(d.cfg, info, d.log) },
			func(g *gpu.Backend) { denseOnGPU(d.cfg, d.dev, g, d.log) }, d.log)
	}
	if err := d.notify.Notify("READY=1\nSTATUS=serving " + d.cfg.Export); err != nil {
		d.log.Warn("sd_notify READY=1 failed", "err", err)
	}
}

// errHandOver ends a serving process that hands over to the next for an
// upgrade (SIGHUP; its supervisor starts the next at once).
var errHandOver = ExitStatus(supervise.ExitHandedOver)

// handOver stops serving at a request boundary for the next serving
// process: the requests in flight are answered, and the live connections
// go to the supervisor, for the next one (the kernel device keeps its
// sockets and sees nothing; without a handover socket they close, and it
// waits for the next process to reconnect it). Swap stays on. What
// is staged is committed as the data path closes (run's deferred close).
func (d *daemon) handOver() {
	_ = d.notify.Notify("RELOADING=1\nSTATUS=handing over to the next serving process")
	if d.stopKeeping != nil {
		d.stopKeeping()
	}
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	d.ublk.leave()
	if err := d.handOverConnections(ctx); err != nil {
		d.log.Warn("handing the connections over did not finish cleanly; the kernel device reconnects to the next serving process", "err", err)
	}
	if d.lis.http != nil {
		_ = d.lis.http.Shutdown(ctx)
	}
	d.log.Info("handed over: requests in flight answered, the next serving process gets the connections",
		"took", time.Since(start).Round(time.Millisecond))
}

// wait returns when the daemon should stop: a fatal serving error, or a
// stop request that is safe to honour.
func (d *daemon) wait(ctx context.Context, sigs, dump, upgrade, orphan <-chan os.Signal, errc <-chan error) error {
	var watchdog <-chan time.Time
	if iv := sdnotify.WatchdogInterval(); iv > 0 {
		t := time.NewTicker(iv)
		defer t.Stop()
		watchdog = t.C
		d.log.Info("systemd watchdog on", "ping_every", iv)
	}
	// recheck ticks while a stop waits for swap on the export to go.
	var recheck <-chan time.Time
	var ticker *time.Ticker
	defer func() {
		if ticker != nil {
			ticker.Stop()
		}
	}()
	var serveErr error
	pending := func() bool {
		if d.readyToStop(ctx) {
			return true
		}
		if ticker == nil {
			ticker = time.NewTicker(5 * time.Second)
			recheck = ticker.C
		}
		return false
	}
	for {
		select {
		case sig := <-sigs:
			d.log.Info("stop requested", "signal", sig.String())
			if pending() {
				return serveErr
			}
		case <-recheck:
			if d.readyToStop(ctx) {
				return serveErr
			}
		case err := <-errc:
			// A listener failed; connections already open still work, so
			// swap on the export is turned off (or waited for) as on a
			// signal before the daemon goes.
			d.log.Error("stopping", "err", err)
			serveErr = err
			if pending() {
				return serveErr
			}
		case <-ctx.Done():
			return nil
		case <-watchdog:
			if err := d.healthy(); err != nil {
				d.log.Error("health check failed; not pinging the systemd watchdog", "err", err)
				continue
			}
			_ = d.notify.Notify("WATCHDOG=1")
		case <-orphan:
			if !d.orphaned {
				d.orphaned = true
				d.log.Warn("the supervisor died: serving on until the next supervisor's serving process takes over")
				d.listenForSuccessor(d.state)
			}
		case f := <-d.successor:
			d.log.Info("the next supervisor's serving process asks for the connections: handing over")
			d.handoverTo = f
			return errHandOver
		case <-upgrade:
			if !d.start.Serving {
				d.log.Warn("SIGHUP ignored: without a supervisor (--supervise=false) there is no next serving process to hand over to")
				continue
			}
			d.log.Info("SIGHUP: handing over to a new serving process (an upgrade: the supervisor starts the executable as it is now)")
			return errHandOver
		case <-dump:
			d.log.Warn("SIGUSR1: writing every goroutine's stack to stderr")
			_, _ = os.Stderr.Write(goroutineStacks())
		}
	}
}

// healthy reads a page through the device, which takes the page lock and
// the decode path: a daemon wedged on a lock misses the watchdog.
func (d *daemon) healthy() error {
	buf := make([]byte, codec.PageSize)
	done := make(chan error, 1)
	go func() { done <- d.dev.ReadAt(context.Background(), buf, 0) }()
	select {
	case err := <-done:
		return err
	case <-time.After(10 * time.Second):
		return errors.New("reading page 0 took longer than 10s")
	}
}

// goroutineStacks is every goroutine's stack, as a panic prints them.
func goroutineStacks() []byte {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) || len(buf) >= 64<<20 {
			return buf[:n]
		}
		buf = make([]byte, 2*len(buf))
	}
}

// MaxKernelRequest is the largest request the kernel device is allowed to
// send (nbddev.Device.LimitRequests): the largest reserved buffer.
const MaxKernelRequest = nbd.ReserveBufferMax

// maxConnections is nbd.Options.MaxConnections from --max-connections.
// The kernel's connections arrive uncounted over the Unix socket (their
// peer is this process: ownConn); over TCP nothing tells them from other
// clients, so the limit makes room for them on top.
func maxConnections(cfg *Config) int {
	if cfg.MaxConns <= 0 {
		return 0
	}
	if cfg.Device != "" && cfg.Transport != TransportUblk && cfg.Socket == "" {
		return cfg.MaxConns + cfg.KernelConns
	}
	return cfg.MaxConns
}

// ownConn reports whether nc is the kernel device's: dialed by this
// process (SO_PEERCRED, as the tracker recorded at accept), or handed over
// as the kernel's at an upgrade. Those never count against
// --max-connections, so no client can starve the kernel device of them.
func (d *daemon) ownConn(nc net.Conn) bool {
	return d.tracker.PeerOf(nc) == os.Getpid()
}

// inlineHelpers decides nbd.Options.InlineHelpers from
// --nbd-inline-helpers: nbd.AutoInlineHelpers unless given.
func inlineHelpers(cfg *Config, cpus int) int {
	if cfg.NBDInlineHelpers >= 0 {
		return cfg.NBDInlineHelpers
	}
	return nbd.AutoInlineHelpers(cpus)
}
