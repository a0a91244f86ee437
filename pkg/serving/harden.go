// The swap-safety steps at start, each logged.

package serving

import (
	"fmt"
	"log/slog"
	"strings"

	"github.com/gzramd/gzramd/pkg/swapsafe"
)

// reexecAsIOFlusher is swapsafe.ReExecAsIOFlusher; a variable so the
// order of start-up stays readable in runServe.
var reexecAsIOFlusher = swapsafe.ReExecAsIOFlusher

// harden applies the swap-safety steps and logs each: what it did, or why
// it could not. A failure stops the daemon only with --require-hardening.
// With --harden it also faults in and keeps the plan's heap reserve; the
// reserve must stay reachable while the daemon serves.
func harden(cfg *Config, log *slog.Logger, reexecErr error) (*swapsafe.HeapReserve, error) {
	opts := swapsafe.Options{MemoryLimit: int64(cfg.GoMemoryLimit)}
	if cfg.Harden {
		adj := -1000
		opts.LockMemory = true
		opts.OOMScoreAdj = &adj
		opts.IOFlusher = true
		opts.Realtime = cfg.WantRealtime()
	}
	steps := swapsafe.Apply(opts)
	reserve := &swapsafe.HeapReserve{}
	if cfg.Harden {
		var step swapsafe.Step
		reserve, step = swapsafe.ReserveHeap(cfg.Plan.HeapReserve)
		steps = append(steps, step, swapsafe.ReserveThreads(cfg.Plan.Threads))
	}
	// After the reserve: the operator's --gc-percent wins over its pacing.
	steps = append(steps, swapsafe.Apply(swapsafe.Options{GCPercent: cfg.GCPercent})...)
	if cfg.Harden && !cfg.WantRealtime() {
		reason := "--realtime off"
		if cfg.Realtime == "auto" {
			reason = "--realtime auto: gzramd attaches no kernel device; give --realtime on if the kernel uses this export as swap"
		}
		log.Info("hardening step skipped", "step", "realtime", "reason", reason)
	}
	if !cfg.Harden {
		log.Warn("hardening off (--harden=false): the daemon may be swapped out or OOM-killed while serving swap")
	}
	if cfg.Harden && !cfg.Reexec {
		log.Warn("--io-flusher-reexec=false: threads are not IO flushers; memory allocation while serving swap may recurse into swap I/O")
	}
	var failed []string
	for _, s := range steps {
		if !logStep(log, s) {
			failed = append(failed, s.Name)
		}
	}
	if reexecErr != nil {
		log.Debug("io flusher re-exec", "err", reexecErr)
	}
	if cfg.RequireHardening && len(failed) > 0 {
		return nil, fmt.Errorf("--require-hardening: %s failed (see the log above)", strings.Join(failed, ", "))
	}
	return reserve, nil
}

// wantRealtime reports whether the daemon asks for SCHED_RR (--realtime).
// auto asks only when gzramd attaches the kernel device itself, which is
// then served for swap. Without real-time priority, a reply's socket
// buffer must be allocated above the min watermark, by direct reclaim if
// need be, and reclaim then waits on the very pages gzramd is to store:
// a 320 MiB guest swapping onto gzramd froze so in 3 runs of 3, and passed
// with it. But at real-time priority every wake-up of gzramd preempts its
// client: fio on the same 2 CPUs did 5 times fewer random writes.
func (c *Config) WantRealtime() bool {
	switch c.Realtime {
	case "on":
		return true
	case "auto":
		return c.Device != "" || c.Swap
	}
	return false
}

// logStep logs what a hardening step did, or why it failed and what the
// operator can do; it reports whether the step succeeded.
func logStep(log *slog.Logger, s swapsafe.Step) bool {
	if s.Err == nil {
		log.Info("hardening", "step", s.Name, "done", s.Done)
		return true
	}
	attrs := []any{"step", s.Name, "err", s.Err, "without_it", s.Without()}
	if s.Hint != "" {
		attrs = append(attrs, "hint", s.Hint)
	}
	log.Warn("hardening step failed; gzramd serves without it (it matters while the export is swap)", attrs...)
	return false
}
