package main

import (
	"errors"
	"log/slog"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/gzramd/gzramd/pkg/codec"
)

// backends is what --backend and --algorithm resolve to.
type backends struct {
	primary    codec.BatchCompressor // gets batches of at least minPrimary pages
	cpu        codec.BatchCompressor // takes the rest and every fallback
	minPrimary int
	gpuName    string // "" without a GPU
	collectors []prometheus.Collector
	close      func()
}

// openBackends picks the compression backends: the CPU always, the GPU
// for --backend gpu (required) or auto (when one is usable).
func openBackends(cfg *serveConfig, cpuCodec codec.Codec, log *slog.Logger) (*backends, error) {
	cpu := codec.NewCPUBatch(cpuCodec, 0)
	b := &backends{primary: cpu, cpu: cpu, minPrimary: 1, close: func() {}}
	switch {
	case cfg.backend == "gpu":
		return nil, usageErr(errors.New("invalid --backend gpu: this build has no GPU backend; use --backend cpu or auto"))
	case cfg.backend == "auto" && cfg.algorithm == "lz4":
		log.Info("no GPU backend in this build; compressing on the CPU", "algorithm", cfg.algorithm)
	}
	return b, nil
}
