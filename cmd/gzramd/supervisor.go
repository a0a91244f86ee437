// `gzramd serve` as the supervisor of the serving process (pkg/supervise).

package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/gzramd/gzramd/internal/sdnotify"
	"github.com/gzramd/gzramd/kernels"
	"github.com/gzramd/gzramd/pkg/pipeline"
	"github.com/gzramd/gzramd/pkg/serving"
	"github.com/gzramd/gzramd/pkg/supervise"
	"github.com/gzramd/gzramd/pkg/swapsafe"
)

// runSupervisor is `gzramd serve` with --supervise: it holds the state
// (from systemd's file descriptor store, or new) and runs the serving
// process — this binary again, with the same arguments — over it, and
// another whenever one dies.
func runSupervisor(ctx context.Context, cfg *serving.Config, log *slog.Logger) error {
	log = hardenSupervisor(ctx, cfg, log)
	st, parentDeath, err := supervisorState(cfg, log)
	if err != nil {
		return err
	}
	defer st.Close()
	keeper := supervise.NewKeeper(st.Files())
	defer keeper.Close()

	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGUSR1)
	defer signal.Stop(sigs)
	exe, err := os.Executable()
	if err != nil {
		return fmt.Errorf("finding gzramd's executable to run the serving process: %w", err)
	}
	status, err := supervise.Run(ctx, supervise.Config{
		Path: exe, Args: os.Args[1:], Env: childEnv(),
		Files: st.Files(), Keeper: keeper, Stdout: os.Stdout, Stderr: os.Stderr,
		Logger: log, Signals: sigs, ParentDeath: parentDeath, Handover: true, Standby: cfg.Standby,
		Started: func(pid, takeovers int) {
			log.Info("serving process started", "pid", pid, "takeovers", takeovers)
		},
		GiveUp: func(int) bool {
			// A state that holds nothing loses nothing: a process that
			// cannot start (a bad GPU, a busy socket) is an error to
			// report, not to retry for ever.
			info, err := st.Info()
			return err == nil && !info.Sealed
		},
	})
	if err != nil {
		return err
	}
	if status != supervise.ExitStopped {
		return serving.ExitStatus(status)
	}
	return nil
}

// hardenSupervisor makes the supervisor fit to hold swap's memory, as the
// serving process makes itself, and returns its logger.
func hardenSupervisor(ctx context.Context, cfg *serving.Config, log *slog.Logger) *slog.Logger {
	// First, as the serving process does: on success this does not
	// return, and the supervisor starts again with every thread an IO
	// flusher, and every process it starts one from its first
	// instruction (the flag is inherited, so they need no re-exec of
	// their own). Otherwise a fork after a death, in direct reclaim,
	// writes swap to the very kernel device that waits for the next serving
	// process: a guest swapping onto gzramd hung so, the supervisor in
	// clone() (test/e2e survive, kills 1-3 s apart).
	var reexecErr error
	if cfg.Harden && cfg.Reexec {
		reexecErr = swapsafe.ReExecAsIOFlusher()
	}
	log = log.With("role", "supervisor")
	if reexecErr != nil {
		log.Debug("io flusher re-exec", "err", reexecErr)
	}
	// A plain export loses nothing without these: its serving process,
	// which takes the same steps and more, sums them up in one line.
	level := slog.LevelWarn
	if !cfg.ForSwap() {
		level = slog.LevelDebug
	}
	adj := -1000
	for _, s := range swapsafe.Apply(supervisorHardening(cfg, &adj)) {
		if s.Err != nil {
			without := s.Without()
			if s.Name == "oom_score_adj" {
				without = "the OOM killer may choose the supervisor: the serving process goes on alone, with no standby and no restart if it dies"
			}
			log.Log(ctx, level, "supervisor hardening step failed; gzramd serves without it", "step", s.Name, "err", s.Err, "without_it", without, "hint", s.Hint)
		}
	}
	return log
}

// supervisorState is the state the serving processes run over: the one
// systemd's file descriptor store handed back, or a new one (kept there
// where it can be), and the signal the serving process is to get when the
// supervisor dies.
func supervisorState(cfg *serving.Config, log *slog.Logger) (*pipeline.State, syscall.Signal, error) {
	st, err := stateFromSystemd()
	if err != nil {
		return nil, 0, err
	}
	// Where systemd keeps the state, the serving process serves on when
	// the supervisor dies, and hands over to the next supervisor's
	// (orphan.go). Elsewhere the state lives only while a process holds
	// it, so the serving process stops in order (swap off).
	parentDeath := syscall.SIGTERM
	if st != nil {
		parentDeath = serving.SupervisorGone
		info, _ := st.Info()
		log.Info("state handed back by systemd's file descriptor store", "id", info.ID, "holds_data", info.Sealed, "takeovers", info.Takeovers)
	} else {
		if st, err = pipeline.NewState("gzramd-" + cfg.Export); err != nil {
			return nil, 0, err
		}
		n := sdnotify.New(os.Getenv("NOTIFY_SOCKET"))
		if err := storeState(n, st); err != nil {
			log.Warn("the state is not in systemd's file descriptor store: if the supervisor dies, the serving process stops in order", "err", err)
		} else if n.Enabled() {
			parentDeath = serving.SupervisorGone
		}
	}
	return st, parentDeath, nil
}

// childEnv is the serving process's environment: the supervisor's, but
// for WATCHDOG_PID (systemd's watchdog is for the serving process, which
// pings it once it checked it serves).
func childEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "WATCHDOG_PID=") {
			env = append(env, kv)
		}
	}
	return env
}

// supervisorHardening is what the supervisor applies to itself, or checks
// (IO flusher: the re-exec): its memory locked, never OOM-killed, its
// allocations never writing swap, and real-time when the serving process
// will be (--realtime). Real-time from the start matters after a crash: a
// serving process started while the kernel device waits for a server is
// real-time from its first instruction (the policy is inherited across
// fork and exec), so its start-up may allocate below the min watermark,
// where everyone else's reclaim is stuck on swap writes to that very
// kernel device; so may the supervisor, which locks the state's pages then (its
// page tables). Without it, a guest swapping onto gzramd hung at the
// first kill, the new process and the supervisor in direct reclaim
// (test/e2e survive).
func supervisorHardening(cfg *serving.Config, adj *int) swapsafe.Options {
	return swapsafe.Options{
		LockMemory:  cfg.Harden,
		Unlocked:    kernels.All(), // as the serving process (serving.harden)
		OOMScoreAdj: oomAdj(cfg, adj),
		Realtime:    cfg.Harden && cfg.WantRealtime(),
		IOFlusher:   cfg.Harden && cfg.Reexec,
	}
}

func oomAdj(cfg *serving.Config, adj *int) *int {
	if cfg.Harden {
		return adj
	}
	return nil
}
