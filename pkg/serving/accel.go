// Opening the GPU for --backend, now or late, its metrics, and what opening
// it changes: real-time scheduling, the dense tier's recompressor.

package serving

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/gzramd/gzramd/pkg/codec"
	"github.com/gzramd/gzramd/pkg/device"
	"github.com/gzramd/gzramd/pkg/gpu"
	"github.com/gzramd/gzramd/pkg/metrics"
	"github.com/gzramd/gzramd/pkg/route"
	"github.com/gzramd/gzramd/pkg/swapsafe"
)

// accelerator is what --backend resolves to: the GPU, or nothing (the CPU
// alone). In a serving process that took the device over, the GPU is
// opened while it serves (late, openLate): until then gpu is nil.
type accelerator struct {
	mu   sync.Mutex   // guards gpu, info and mon while openLate may set them
	gpu  *gpu.Backend // nil: compress on the CPU
	info gpu.DeviceInfo
	mon  *gpu.Monitor // nil without NVML
	late *lateGPU     // the router's accelerator until the GPU is open
	done bool         // closed: a GPU openLate opens now is closed at once
}

// current returns the GPU, its description and its telemetry, if open.
func (a *accelerator) current() (*gpu.Backend, gpu.DeviceInfo, *gpu.Monitor) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.gpu, a.info, a.mon
}

// staged reports whether staged writes go to a GPU, now or once it is open.
func (a *accelerator) staged() bool {
	g, _, _ := a.current()
	return g != nil || a.late != nil
}

// openLate opens the GPU for a serving process that took the device over
// and already serves on the CPU (lateGPU), and hands it to the router;
// onOpen runs once it is open (before the router uses it). If it cannot
// be opened, the device goes on on the CPU. onReady runs once the router
// has it.
func (a *accelerator) openLate(c gpuSetup, onOpen func(gpu.DeviceInfo), onReady func(*gpu.Backend), log *slog.Logger) {
	start := time.Now()
	if c.kernels.image == nil && c.kernels.err == nil {
		c.kernels = compileKernels(context.Background(), c.device, c.algorithm, c.dense)
	}
	opened, err := openAccelerator(c, log)
	if err == nil && opened.gpu == nil {
		return // --backend auto, and the GPU no longer usable: openAccelerator said so
	}
	if err != nil {
		log.Error("the GPU did not open after the takeover: compressing on the CPU", "err", err)
		return
	}
	onOpen(opened.info)
	if err := a.late.attach(opened.gpu); err != nil {
		log.Error("the GPU could not pin the staging and output memory after the takeover: compressing on the CPU", "err", err)
		opened.close(log)
		return
	}
	a.mu.Lock()
	a.gpu, a.info, a.mon = opened.gpu, opened.info, opened.mon
	done := a.done
	a.mu.Unlock()
	if done {
		opened.close(log)
		return
	}
	log.Info("the GPU is open: staged writes go to it again", "device", opened.info.Name,
		"opened_in", time.Since(start).Round(time.Millisecond))
	onReady(opened.gpu)
}

// gpuSetup is what opening the GPU takes: --backend, --algorithm,
// --gpu-device, the batches' shape, --dense-after, and the kernels
// compiled ahead.
type gpuSetup struct {
	backend, algorithm   string
	device               int
	batchPages, inFlight int
	dense                bool // the dense tier is on (its kernel compiled too)
	kernels              kernelImage
}

// autoGPUMinSize is the smallest device --backend auto serves with the
// GPU. The GPU's own memory is fixed, about 150 MiB on an H100 with LZ4
// or zstd (the CUDA context, pinned staging and outputs;
// bench/results/footprint-h100-2026-11-26.md): more than 2 % of what a
// smaller device can hold, and on a 1 GiB device more than zstd's better
// ratio can ever pay back. What it buys is CPU time, not memory (the GPU
// writes the same formats at the same ratio as the CPU): on a recorded
// swap trace 7-17 % of the daemon's CPU per GB with LZ4 and 40-50 % with
// zstd, which pays where much is swapped, on large devices.
const autoGPUMinSize = 8 << 30

// resolveBackend is the backend --backend asks for, as far as it can be
// told before the GPU is opened: auto is the CPU without write-behind
// (--staging 0) and for a device under autoGPUMinSize, which why says.
func (c *Config) ResolveBackend() (backend, why string) {
	if c.Backend != "auto" {
		return c.Backend, ""
	}
	switch {
	case c.Staging == 0:
		return "cpu", "--staging 0 turns write-behind off, and the GPU works only on staged writes"
	case int64(c.Size) < autoGPUMinSize:
		return "cpu", fmt.Sprintf("--backend auto uses a GPU only for a device of %s or more, where what it saves in CPU pays for its own memory (about 150 MiB); --backend gpu uses it anyway", Size(autoGPUMinSize).String())
	}
	return "auto", ""
}

// OpenBackend is --backend's policy, for the flag named flag: cpu opens no
// GPU; gpu must open one (open's error is the caller's); auto takes one if
// open gives one, and otherwise none, with unused saying why, for the
// caller to log.
func OpenBackend(flag, backend string, open func() (*gpu.Backend, error)) (g *gpu.Backend, unused, err error) {
	if backend == "cpu" {
		return nil, nil, nil
	}
	g, err = open()
	switch {
	case err == nil:
		return g, nil, nil
	case backend == "gpu":
		return nil, nil, fmt.Errorf("%s gpu: %w", flag, err)
	default:
		return nil, err, nil
	}
}

// setUpAccelerator opens the GPU the configuration asks for, or leaves it
// to openLate where the serving process before this one died (at died),
// and returns how it opens, for openLate. opened runs once it is open.
func setUpAccelerator(cfg *Config, died time.Time, kernels kernelImage, opened func(gpu.DeviceInfo), log *slog.Logger) (*accelerator, gpuSetup, error) {
	backend, why := cfg.ResolveBackend()
	if why != "" {
		log.Info("compressing on the CPU: "+why, "backend", cfg.Backend)
	}
	setup := gpuSetup{backend: backend, algorithm: cfg.Algorithm, device: cfg.GPUDevice,
		batchPages: cfg.BatchPages, inFlight: cfg.BatchInFlight, dense: cfg.DenseAfter != 0, kernels: kernels}
	if !died.IsZero() && (backend == "gpu" || backend == "auto" && kernels.image != nil) {
		// A takeover after a death: every request waits for it, so serve
		// first, on the CPU, and open the GPU meanwhile (openLate). With
		// auto, only where the kernels compiled (a standby's, ahead): the
		// GPU is there.
		return &accelerator{late: &lateGPU{}}, setup, nil
	}
	a, err := openAccelerator(setup, log)
	if err != nil {
		return nil, setup, err
	}
	if a.gpu != nil {
		opened(a.info)
	}
	return a, setup, nil
}

// openAccelerator opens the GPU for --backend gpu (which must find one)
// or auto (when one is usable), its kernels writing the algorithm's
// format; --backend cpu and a machine without a usable GPU under auto get
// none.
func openAccelerator(c gpuSetup, log *slog.Logger) (*accelerator, error) {
	a := &accelerator{}
	g, unused, err := OpenBackend("--backend", c.backend, func() (*gpu.Backend, error) {
		g, err := gpu.Open(gpu.Config{Device: c.device, Bays: c.inFlight, MaxBatchPages: c.batchPages,
			Algorithm: c.algorithm, Image: c.kernels.image, DeepImage: c.kernels.deep, WorkQueues: GPUWorkQueues(c.algorithm), Logger: log})
		if err != nil && c.kernels.image != nil {
			// An image the driver refuses (a driver upgraded since)
			// costs the JIT compiler in this process, not the GPU.
			log.Warn("the GPU refused the kernels compiled ahead; compiling them here", "err", err)
			g, err = gpu.Open(gpu.Config{Device: c.device, Bays: c.inFlight, MaxBatchPages: c.batchPages,
				Algorithm: c.algorithm, DeepImage: c.kernels.deep, WorkQueues: GPUWorkQueues(c.algorithm), Logger: log})
		}
		return g, err
	})
	switch {
	case err != nil:
		return nil, err
	case unused != nil && !errors.Is(unused, gpu.ErrUnavailable):
		log.Warn("GPU failed to start; compressing on the CPU", "err", unused)
	case unused != nil:
		log.Info("no usable GPU; compressing on the CPU", "reason", unused)
	}
	if g == nil {
		return a, nil
	}
	if !g.Info().Compiled && c.kernels.err != nil {
		log.Warn("the GPU kernels were compiled in the serving process, which keeps the driver's PTX compiler (about 20 MiB, locked): compiling them ahead failed",
			"err", c.kernels.err)
	}
	if c.kernels.deepErr != nil {
		log.Warn("the dense tier's GPU kernel was not compiled ahead: the serving process compiles it when the tier starts, and keeps the driver's PTX compiler (about 20 MiB, locked)",
			"err", c.kernels.deepErr)
	}
	a.gpu, a.info = g, g.Info()
	if mon, err := gpu.OpenMonitor(c.device); err != nil {
		log.Info("GPU telemetry off", "reason", err)
	} else {
		a.mon = mon
	}
	return a, nil
}

// gpuWorkQueues is the hardware work queues gzramd's CUDA context gets
// (gpu.Config.WorkQueues; CUDA_DEVICE_MAX_CONNECTIONS in the environment
// wins). Each costs the host about 7 MiB: on an H100 (driver 580) a bare
// context took 109, 124 and 137 MiB of MemAvailable with 1, 2 and 4
// queues, 165 with the driver's default. One is enough for LZ4: the
// recorded swap trace moved as much with it, at the same CPU per GB, and
// the kernels compressed 6.8 GB/s (10.2 with the default), far above what
// NBD brings. zstd's batches take longer and overlap less on one queue
// (2.1 GB/s; 3.6 with two, 9.0 with the default), so it gets two.
func GPUWorkQueues(algorithm string) int {
	if algorithm == "zstd" {
		return 2
	}
	return 1
}

// kernelImage is the GPU kernels compiled ahead for the serving process,
// or why they are not: the algorithm's, and the dense tier's.
type kernelImage struct {
	image, deep  []byte
	err, deepErr error
}

// compileKernels compiles the algorithm's kernels for GPU index device in
// a process of its own (`gzramd gpu-compile`), so that the driver's PTX
// compiler, its 20 MiB library and the heap it fills, never come into the
// serving process; and the dense tier's kernel, where the dense tier is
// on, in another. A standby calls it at its start, while memory is
// plentiful, and so loads no compiler either when it takes over.
func compileKernels(ctx context.Context, device int, algorithm string, dense bool) kernelImage {
	var k kernelImage
	k.image, k.err = runGPUCompile(ctx, "--gpu-device", strconv.Itoa(device), "--algorithm", algorithm)
	if k.err == nil && dense {
		k.deep, k.deepErr = runGPUCompile(ctx, "--gpu-device", strconv.Itoa(device), "--dense")
	}
	return k
}

// runGPUCompile runs `gzramd gpu-compile args` and returns the image it
// writes.
func runGPUCompile(ctx context.Context, args ...string) ([]byte, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("finding gzramd's executable: %w", err)
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, exe, append([]string{"gpu-compile"}, args...)...)
	var out, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &stderr
	// The compiler dies with the process that asked for it: a serving
	// process killed while it compiles (a cold takeover compiles while it
	// serves) left it running, and 100 kills in a row left dozens, which
	// held up the next start's own compile past 20 s. The kernel sends
	// the signal when the thread that started it ends, so the thread is
	// kept until the compiler exits.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if err := cmd.Run(); err != nil {
		if msg := strings.TrimSpace(stderr.String()); msg != "" {
			err = fmt.Errorf("%w: %s", err, msg)
		}
		return nil, fmt.Errorf("gzramd gpu-compile: %w", err)
	}
	return out.Bytes(), nil
}

// routeAccelerator is the GPU for pkg/route, or nil.
func (a *accelerator) routeAccelerator() route.Accelerator {
	switch {
	case a.late != nil:
		return a.late
	case a.gpu == nil:
		return nil
	}
	return a.gpu
}

// name is the backend staged batches go to: "gpu" or "cpu".
func (a *accelerator) name() string {
	if !a.staged() {
		return "cpu"
	}
	return "gpu"
}

// collectors are the GPU's metrics: the router's counters of its batches
// and NVML's telemetry.
func (a *accelerator) collectors(index int, router *route.Router, log *slog.Logger) []prometheus.Collector {
	if !a.staged() {
		return nil
	}
	telemetry := func() (metrics.GPUTelemetry, error) {
		_, _, mon := a.current()
		if mon == nil {
			return metrics.GPUTelemetry{}, metrics.ErrNoTelemetry
		}
		t, err := mon.Snapshot()
		return metrics.GPUTelemetry(t), err
	}
	return []prometheus.Collector{metrics.NewGPU(index, func() metrics.GPUCounters {
		s := router.Stats()
		return metrics.GPUCounters{Batches: s.AcceleratorBatches, Fallbacks: s.Fallbacks, Timeouts: s.Timeouts,
			Skipped: s.Skipped + s.NoShadow, Small: s.Small}
	}, telemetry, log)}
}

// close releases the GPU, after the pipeline that used it is closed.
func (a *accelerator) close(log *slog.Logger) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.done = true
	if a.mon != nil {
		if err := a.mon.Close(); err != nil {
			log.Warn("closing GPU telemetry", "err", err)
		}
	}
	if a.gpu != nil {
		if err := a.gpu.Close(); err != nil {
			log.Warn("closing the GPU", "err", err)
		}
	}
}

// gpuOpened is what opening the GPU changes beside the router: the CUDA
// driver spins while it waits for the GPU unless its context could be made
// to block (gpu.DeviceInfo.BlockingSync), and at real-time priority that
// spinning would take whole CPUs from everything else.
func gpuOpened(cfg *Config, info gpu.DeviceInfo, log *slog.Logger) {
	if !cfg.Harden || !cfg.WantRealtime() || info.BlockingSync {
		return
	}
	if err := swapsafe.DropRealtime(); err != nil {
		log.Warn("dropping real-time scheduling for the GPU backend failed", "err", err)
	} else {
		log.Warn("real-time scheduling off: the GPU driver busy-waits, and must not do so at real-time priority")
	}
}

// denseOnGPU has the dense tier recompress on g: with its high-effort
// frames of 4 pages (gpu.DeepGroups) where their kernel loads, and with
// the fast tier's frames of a group where it does not.
func denseOnGPU(cfg *Config, dev *device.Device, g *gpu.Backend, log *slog.Logger) {
	if cfg.DenseAfter == 0 {
		return
	}
	var gc codec.GroupCompressor = g
	kind := "fast"
	if deep, err := g.DeepGroups(); err != nil {
		log.Warn("the dense tier's high-effort kernel did not load: it recompresses with the fast tier's", "err", err)
	} else {
		gc, kind = deep, "deep"
		if !deep.Compiled() {
			kind = "deep, compiled in this process"
		}
	}
	if err := dev.SetDenseGPU(gc); err != nil {
		log.Warn("the dense tier recompresses on the CPU", "err", err)
		return
	}
	log.Info("the dense tier recompresses on the GPU", "kernel", kind, "groups_a_batch", gc.MaxGroups(), "frame_pages", gc.FramePages())
}
