// Package serving is gzramd's serving process: the one that holds the
// data path and serves it over NBD, under a supervisor (pkg/supervise)
// that starts another when it dies. Run starts it up in order (hardening,
// the state, what the process before it handed over), attaches the kernel
// device or takes it over (pkg/nbddev), and serves until a stop, an
// upgrade's handover, or a failure; with the GPU, a process that takes
// over from one that died serves on the CPU until the GPU is open.
//
// This file: Run, the start-up in its order.
package serving

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"

	"github.com/gzramd/gzramd/pkg/pipeline"
	"github.com/gzramd/gzramd/pkg/supervise"
)

// Run is the serving process: it hardens itself, takes the state (its
// supervisor's, or a new one of its own without one), takes the device
// over from the process before it if there was one, and serves until it
// is told to stop, hands over, or fails. cfg must be valid; version is
// gzramd's, for the logs, /status and the metrics.
func Run(ctx context.Context, cfg *Config, version string, level slog.Level) error {
	start := supervise.FromEnv()
	// Before anything else starts: on success this does not return, and
	// the process starts again with every thread an IO flusher.
	var reexecErr error
	if cfg.Harden && cfg.Reexec {
		if cfg.Transport == TransportUblk {
			stackShrinkOff()
		}
		reexecErr = reexecAsIOFlusher()
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	// Before the thread reserve (harden): the lifeline keeps a thread of
	// its own, which must not be one of those reserved for serving.
	if err := start.HoldLifeline(); err != nil {
		log.Warn("the supervisor will hear of this process's death only once its teardown ends", "err", err)
	}
	// Before hardening: the compiler runs neither at real-time priority
	// nor counted in this process. A standby compiles now, ahead of the
	// takeover.
	// A serving process started to take over from one that died, with
	// --backend gpu, compiles them later, while it already serves on the
	// CPU (openLate): every request waits for a takeover.
	var kernels kernelImage
	backend, _ := cfg.ResolveBackend()
	if backend != "cpu" && !(backend == "gpu" && !start.DiedAt.IsZero()) {
		kernels = compileKernels(ctx, cfg.GPUDevice, cfg.Algorithm, cfg.DenseAfter != 0)
	}
	reserve, locked, err := harden(cfg, log, reexecErr, start.Standby)
	if err != nil {
		return err
	}
	if gone, err := start.SetParentDeath(); err != nil {
		log.Warn("the serving process will not hear of its supervisor's death", "err", err)
	} else if gone {
		return errors.New("the supervisor died before the serving process started")
	}
	defer reserve.KeepAlive()
	stopProfile, err := startCPUProfile()
	if err != nil {
		return err
	}
	defer stopProfile()
	st, err := servingState(cfg, start)
	if err != nil {
		return err
	}
	defer st.Close()
	handover, handed, start, err := receiveHandover(start, log)
	if err != nil {
		return err
	}
	orphans, err := takeFromOrphan(st, start, log)
	if err != nil {
		return err
	}
	d, err := newDaemon(cfg, version, st, start, kernels, log)
	if err != nil {
		return err
	}
	d.handover, d.adopt = handover, append(handed, orphans...)
	if cfg.Harden {
		d.reserve, d.lockHeap = reserve, locked
	}
	return d.run(ctx)
}

// servingState is the state a serving process serves: the supervisor's
// files, or a new one of its own without a supervisor.
func servingState(cfg *Config, start supervise.Started) (*pipeline.State, error) {
	if !start.Serving {
		return pipeline.NewState("gzramd-" + cfg.Export)
	}
	files, err := start.Files(pipeline.StateFileNames)
	if err != nil {
		return nil, fmt.Errorf("the state from the supervisor: %w", err)
	}
	return pipeline.StateFrom(files)
}
