package main

import (
	"errors"
	"fmt"
	"log/slog"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/gzramd/gzramd/pkg/codec"
	"github.com/gzramd/gzramd/pkg/gpu"
	"github.com/gzramd/gzramd/pkg/metrics"
)

// backends is what --backend and --algorithm resolve to.
type backends struct {
	primary    codec.BatchCompressor // gets batches of at least minPrimary pages
	cpu        codec.BatchCompressor // takes the rest
	minPrimary int
	gpuName    string // "" without a GPU
	// gpuBlocks: threads waiting for the GPU sleep rather than spin.
	gpuBlocks  bool
	collectors []prometheus.Collector
	close      func()
}

// openBackends picks the compression backends: the CPU always; the GPU,
// guarded by the CPU (a batch the GPU fails or overruns is redone on the
// CPU), for --backend gpu (which must find one) or auto (when one is
// usable, LZ4 only).
func openBackends(cfg *serveConfig, cpuCodec codec.Codec, log *slog.Logger) (*backends, error) {
	cpu := codec.NewCPUBatch(cpuCodec, 0)
	b := &backends{primary: cpu, cpu: cpu, minPrimary: 1, close: func() {}}
	if cfg.backend == "cpu" {
		return b, nil
	}
	if cfg.algorithm != "lz4" {
		log.Info("compressing on the CPU: the GPU compresses LZ4 only", "algorithm", cfg.algorithm)
		return b, nil
	}
	g, err := gpu.Open(gpu.Config{
		Device: cfg.gpuDevice, Slots: cfg.batchInFlight, MaxBatchPages: cfg.batchPages, Logger: log,
	})
	if err != nil {
		if cfg.backend == "gpu" {
			return nil, fmt.Errorf("--backend gpu: %w", err)
		}
		if !errors.Is(err, gpu.ErrUnavailable) {
			log.Warn("GPU failed to start; compressing on the CPU", "err", err)
		} else {
			log.Info("no usable GPU; compressing on the CPU", "reason", err)
		}
		return b, nil
	}
	info := g.Info()
	guard := gpu.WithFallback(g, cpu, gpu.FallbackOptions{Logger: log})
	b.primary = guard
	b.minPrimary = cfg.gpuMinPages
	b.gpuName = info.Name
	b.gpuBlocks = info.BlockingSync
	var closers []func() error
	closers = append(closers, g.Close)
	var telemetry func() (metrics.GPUTelemetry, error)
	if mon, err := gpu.OpenMonitor(cfg.gpuDevice); err != nil {
		log.Info("GPU telemetry off", "reason", err)
	} else {
		closers = append(closers, mon.Close)
		telemetry = func() (metrics.GPUTelemetry, error) {
			t, err := mon.Snapshot()
			return metrics.GPUTelemetry(t), err
		}
	}
	b.collectors = append(b.collectors, metrics.NewGPU(cfg.gpuDevice, func() metrics.GPUCounters {
		s := guard.Stats()
		return metrics.GPUCounters{Primary: s.Primary, CPU: s.CPU, Fallbacks: s.Fallbacks, Timeouts: s.Timeouts, Skipped: s.Skipped}
	}, telemetry, log))
	b.close = func() {
		for i := len(closers) - 1; i >= 0; i-- {
			if err := closers[i](); err != nil {
				log.Warn("closing the GPU", "err", err)
			}
		}
	}
	log.Info("compressing on the GPU", "gpu", info.Name, "index", info.Index,
		"sms", info.Multiprocessors, "min_batch_pages", b.minPrimary)
	return b, nil
}
