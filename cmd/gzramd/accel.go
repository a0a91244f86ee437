// Opening the GPU for --backend, and its metrics.

package main

import (
	"errors"
	"fmt"
	"log/slog"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/gzramd/gzramd/pkg/gpu"
	"github.com/gzramd/gzramd/pkg/metrics"
	"github.com/gzramd/gzramd/pkg/route"
)

// accelerator is what --backend resolves to: the GPU, or nothing (the CPU
// alone).
type accelerator struct {
	gpu  *gpu.Backend // nil: compress on the CPU
	info gpu.DeviceInfo
	mon  *gpu.Monitor // nil without NVML
}

// openAccelerator opens the GPU for --backend gpu (which must find one)
// or auto (when one is usable), its kernels writing algorithm's format;
// --backend cpu and a machine without a usable GPU under auto get none.
func openAccelerator(backend, algorithm string, device, batchPages, inFlight int, log *slog.Logger) (*accelerator, error) {
	a := &accelerator{}
	if backend == "cpu" {
		return a, nil
	}
	g, err := gpu.Open(gpu.Config{Device: device, Slots: inFlight, MaxBatchPages: batchPages, Algorithm: algorithm, Logger: log})
	if err != nil {
		if backend == "gpu" {
			return nil, fmt.Errorf("--backend gpu: %w", err)
		}
		if !errors.Is(err, gpu.ErrUnavailable) {
			log.Warn("GPU failed to start; compressing on the CPU", "err", err)
		} else {
			log.Info("no usable GPU; compressing on the CPU", "reason", err)
		}
		return a, nil
	}
	a.gpu, a.info = g, g.Info()
	if mon, err := gpu.OpenMonitor(device); err != nil {
		log.Info("GPU telemetry off", "reason", err)
	} else {
		a.mon = mon
	}
	return a, nil
}

// routeAccelerator is the GPU for pkg/route, or nil.
func (a *accelerator) routeAccelerator() route.Accelerator {
	if a.gpu == nil {
		return nil
	}
	return a.gpu
}

// name is the backend staged batches go to: "gpu" or "cpu".
func (a *accelerator) name() string {
	if a.gpu == nil {
		return "cpu"
	}
	return a.gpu.Name()
}

// collectors are the GPU's metrics: the router's counters of its batches
// and NVML's telemetry.
func (a *accelerator) collectors(index int, router *route.Router, log *slog.Logger) []prometheus.Collector {
	if a.gpu == nil {
		return nil
	}
	var telemetry func() (metrics.GPUTelemetry, error)
	if a.mon != nil {
		telemetry = func() (metrics.GPUTelemetry, error) {
			t, err := a.mon.Snapshot()
			return metrics.GPUTelemetry(t), err
		}
	}
	return []prometheus.Collector{metrics.NewGPU(index, func() metrics.GPUCounters {
		s := router.Stats()
		return metrics.GPUCounters{Batches: s.AcceleratorBatches, Fallbacks: s.Fallbacks, Timeouts: s.Timeouts,
			Skipped: s.Skipped + s.NoShadow, Small: s.Small}
	}, telemetry, log)}
}

// close releases the GPU, after the pipeline that used it is closed.
func (a *accelerator) close(log *slog.Logger) {
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
