package main

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
func harden(cfg *serveConfig, log *slog.Logger, reexecErr error) error {
	opts := swapsafe.Options{MemoryLimit: int64(cfg.goMemoryLimit), GCPercent: cfg.gcPercent}
	if cfg.harden {
		adj := -1000
		opts.LockMemory = true
		opts.OOMScoreAdj = &adj
		opts.IOFlusher = true
	}
	steps := swapsafe.Apply(opts)
	if !cfg.harden {
		log.Warn("hardening off (--harden=false): the daemon may be swapped out or OOM-killed while serving swap")
	}
	if cfg.harden && !cfg.reexec {
		log.Warn("--io-flusher-reexec=false: threads are not IO flushers; memory allocation while serving swap may recurse into swap I/O")
	}
	var failed []string
	for _, s := range steps {
		if s.Err == nil {
			log.Info("hardening", "step", s.Name, "done", s.Done)
			continue
		}
		attrs := []any{"step", s.Name, "err", s.Err}
		if s.Hint != "" {
			attrs = append(attrs, "hint", s.Hint)
		}
		log.Warn("hardening step failed", attrs...)
		failed = append(failed, s.Name)
	}
	if reexecErr != nil {
		log.Debug("io flusher re-exec", "err", reexecErr)
	}
	if cfg.requireHardening && len(failed) > 0 {
		return fmt.Errorf("--require-hardening: %s failed (see the log above)", strings.Join(failed, ", "))
	}
	return nil
}
