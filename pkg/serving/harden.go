// The swap-safety steps at start, each logged.

package serving

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strings"

	"github.com/gzramd/gzramd/kernels"
	"github.com/gzramd/gzramd/pkg/swapsafe"
)

// reexecAsIOFlusher is swapsafe.ReExecAsIOFlusher; a variable so the
// order of start-up stays readable in runServe.
var reexecAsIOFlusher = swapsafe.ReExecAsIOFlusher

// harden applies the swap-safety steps and logs each: what it did, or why
// it could not. A failure stops the daemon only with --require-hardening.
// With --harden it also faults in and keeps the plan's heap reserve; the
// reserve must stay reachable while the daemon serves. locked reports
// whether mlockall took: without it, keeping the heap locked would only
// fail again every few seconds.
// A standby's report repeats its serving process's: for a plain export it
// goes to DEBUG.
func harden(cfg *Config, log *slog.Logger, reexecErr error, standby bool) (reserve *swapsafe.HeapReserve, locked bool, err error) {
	opts := swapsafe.Options{MemoryLimit: int64(cfg.GoMemoryLimit)}
	if cfg.Harden {
		adj := -1000
		opts.LockMemory = true
		opts.OOMScoreAdj = &adj
		opts.IOFlusher = true
		opts.Realtime = cfg.WantRealtime()
		opts.Unlocked = kernels.All()
	}
	steps := swapsafe.Apply(opts)
	reserve = &swapsafe.HeapReserve{}
	if cfg.Harden {
		var step swapsafe.Step
		reserve, step = swapsafe.ReserveHeap(cfg.Plan.HeapReserve)
		if standby {
			// Until it takes over, a standby keeps the reserve's pacing
			// and span records, not its memory: TopUp faults that in
			// as it takes the kernel device over.
			reserve.GiveBack()
			step.Done += "; given back until this standby takes over"
		}
		steps = append(steps, step, swapsafe.ReserveThreads(cfg.Plan.Threads))
	}
	// After the reserve: the operator's --gc-percent wins over its pacing.
	steps = append(steps, swapsafe.Apply(swapsafe.Options{GCPercent: cfg.GCPercent})...)
	if cfg.Harden && !cfg.WantRealtime() {
		reason := "--realtime off"
		if cfg.Realtime == "auto" {
			reason = "--realtime auto: gzramd attaches no kernel device; give --realtime on if the kernel uses this export as swap"
		}
		level := slog.LevelInfo
		if !cfg.ForSwap() {
			level = slog.LevelDebug
		}
		log.Log(context.Background(), level, "hardening step skipped", "step", "realtime", "reason", reason)
	}
	if !cfg.Harden {
		log.Warn("hardening off (--harden=false): the daemon may be swapped out or OOM-killed while serving swap")
	}
	if cfg.Harden && !cfg.Reexec {
		log.Warn("--io-flusher-reexec=false: threads are not IO flushers; memory allocation while serving swap may recurse into swap I/O")
	}
	failed := reportSteps(log, cfg, steps, standby)
	if reexecErr != nil {
		log.Debug("io flusher re-exec", "err", reexecErr)
	}
	if cfg.RequireHardening && len(failed) > 0 {
		return nil, false, fmt.Errorf("--require-hardening: %s failed (see the log above)", strings.Join(failed, ", "))
	}
	return reserve, opts.LockMemory && !slices.Contains(failed, "mlockall"), nil
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

// reportSteps logs what each hardening step did, or why it failed and
// what the operator can do, and returns the names of those that failed.
// A failure matters only while the export is swap: then each is a WARN.
// A plain export, as an ordinary user tries gzramd, gets one INFO line for
// them all, and each at DEBUG; a standby's (quiet) is all at DEBUG, for it
// says again what its serving process said.
func reportSteps(log *slog.Logger, cfg *Config, steps []swapsafe.Step, quiet bool) []string {
	level, done := slog.LevelWarn, slog.LevelInfo
	if !cfg.ForSwap() {
		level = slog.LevelDebug
		if quiet {
			done = slog.LevelDebug
		}
	}
	var failed []string
	for _, s := range steps {
		if s.Err == nil {
			log.Log(context.Background(), done, "hardening", "step", s.Name, "done", s.Done)
			continue
		}
		failed = append(failed, s.Name)
		attrs := []any{"step", s.Name, "err", s.Err, "without_it", s.Without()}
		if s.Hint != "" {
			attrs = append(attrs, "hint", s.Hint)
		}
		log.Log(context.Background(), level, "hardening step failed; gzramd serves without it (it matters while the export is swap)", attrs...)
	}
	if level != slog.LevelWarn && len(failed) > 0 {
		log.Log(context.Background(), done, skippedSummary(len(failed), os.Geteuid() == 0), "skipped", strings.Join(failed, ","),
			"why", "--log-level debug says what each needs")
	}
	return failed
}

// skippedSummary is the one line for the hardening steps a plain export
// goes without.
func skippedSummary(n int, root bool) string {
	steps := "hardening steps"
	if n == 1 {
		steps = "hardening step"
	}
	who := "running without root"
	if root {
		who = "running without a needed capability or limit"
	}
	return fmt.Sprintf("%s: %d %s skipped; fine for trying gzramd, not for swap (--swap, --device or --realtime on warn of each)", who, n, steps)
}

// ForSwap reports whether the export is swap as far as gzramd can tell:
// it makes it swap (--swap), attaches a kernel device (--device), or is
// told that the kernel swaps on it (--realtime on, --require-hardening).
// Only then does a hardening step that failed put anything at risk.
func (c *Config) ForSwap() bool {
	return c.Swap || c.Device != "" || c.Realtime == "on" || c.RequireHardening
}
