// Package supervise runs gzramd's serving process under a small parent
// that outlives it. The parent holds what a crash must not take: the
// state's memfds (pkg/pipeline.State), locked; the serving process gets
// them as descriptors and does everything else. When it dies — a panic, a
// signal, the OOM killer, a fault in a cgo call — the parent starts
// another, which takes the state over; the kernel's NBD device waits for
// it meanwhile.
//
// The parent is kept small and boring on purpose: it forks, waits,
// forwards signals and locks memory. It must not be the thing that
// crashes.
package supervise

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gzramd/gzramd/internal/memfd"
)

// Environment a serving process is started with.
const (
	// EnvServing marks the serving process: it serves, not supervises.
	EnvServing = "GZRAMD_SERVING"
	// EnvTakeovers is how many serving processes died before this one.
	EnvTakeovers = "GZRAMD_TAKEOVERS"
	// EnvDiedAt is when the last one died, in Unix nanoseconds: the pause
	// the takeover caused runs from then until the new one serves.
	EnvDiedAt = "GZRAMD_DIED_AT"
	// EnvStopping asks the serving process to stop as soon as it can
	// (turning swap off first): a stop was asked for while none ran.
	EnvStopping = "GZRAMD_STOPPING"
	// EnvParentDeath is the signal (a number) the serving process gets
	// when the supervisor dies; it sets it again after an exec of its own
	// (see Started.SetParentDeath).
	EnvParentDeath = "GZRAMD_PARENT_DEATH_SIGNAL"
	// EnvSupervisor is the supervisor's process ID.
	EnvSupervisor = "GZRAMD_SUPERVISOR_PID"
	// EnvHandedOver says the last serving process did not die but handed
	// over (ExitHandedOver): this one is an upgrade.
	EnvHandedOver = "GZRAMD_HANDED_OVER"
	// EnvStandby marks a standby serving process: it waits on its handover
	// socket, having done its start-up, until a serving process dies.
	EnvStandby = "GZRAMD_STANDBY"
)

// Exit statuses a serving process ends with on its own; any other end is
// a death, and another is started.
const (
	ExitStopped = 0 // stopped as asked, swap off
	ExitFailed  = 1 // failed, and cleaned up (never serving, or swap off)
	// ExitHandedOver: stopped at a request boundary for an upgrade (asked
	// with SIGHUP), the state sealed and the kernel device left waiting;
	// the next serving process, from the executable at Path as it is now,
	// starts at once and takes both over.
	ExitHandedOver = 3
)

// Config describes the serving process.
type Config struct {
	Path string   // its executable
	Args []string // its arguments, Path excluded
	Env  []string // its environment, before Run's additions
	// Files are its descriptors 3, 4, ... in order.
	Files []*memfd.File
	// Keeper, if not nil, locks the files' memory when a serving process
	// dies.
	Keeper         *Keeper
	Stdout, Stderr io.Writer
	Logger         *slog.Logger
	// Signals are forwarded to the serving process; SIGINT and SIGTERM
	// also mean a stop is asked for (see EnvStopping).
	Signals <-chan os.Signal
	// MinDelay and MaxDelay bound the wait before starting another
	// process after a death: it doubles while each dies within
	// StableAfter of its start without having said it served (Ready),
	// from MinDelay.
	MinDelay, MaxDelay, StableAfter time.Duration
	// ParentDeath is the signal a serving process gets when the
	// supervisor dies (0: none): SIGTERM to stop it in order where nothing
	// else holds the state, SIGKILL where systemd keeps the state for the
	// next supervisor, whose serving process takes it over.
	ParentDeath syscall.Signal
	// Started, if not nil, is told of each serving process started.
	Started func(pid, takeovers int)
	// Standby keeps the next serving process started ahead (see Run); it
	// needs Handover. StandbyAfter is how long a serving process serves
	// before its standby starts (default 2s).
	Standby      bool
	StandbyAfter time.Duration
	// Handover gives each serving process a handover socket (EnvHandover,
	// the descriptor after Files): what one sends there (Send) before it
	// ends with ExitHandedOver, the next receives (Receive); after any
	// other end it is dropped.
	Handover bool
	// GiveUp, if not nil, is asked after each death within StableAfter of
	// its start, with how many came so in a row: true ends Run with
	// ExitFailed (a state that holds nothing need not be served by a
	// process that cannot start). Without it, Run never gives up.
	GiveUp func(quickDeaths int) bool
}

// Run starts the serving process, and another each time one dies, until
// one exits on its own; it returns that one's exit status. When ctx ends,
// the serving process is sent SIGTERM, and Run goes on until it exits.
//
// With Standby, the next serving process is started ahead, once the
// current one has served for StandbyAfter, and waits on its handover
// socket: at a death it is told to go on at once, having done all its
// start-up (hardening, memory locked) while memory was plentiful, not at
// the moment the kernel's reclaim is stuck on the device it is to serve.
func Run(ctx context.Context, cfg Config) (int, error) {
	if cfg.MinDelay <= 0 {
		cfg.MinDelay = 100 * time.Millisecond
	}
	if cfg.MaxDelay < cfg.MinDelay {
		cfg.MaxDelay = max(10*time.Second, cfg.MinDelay)
	}
	if cfg.StableAfter <= 0 {
		cfg.StableAfter = 30 * time.Second
	}
	if cfg.StandbyAfter <= 0 {
		cfg.StandbyAfter = 2 * time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	log := cfg.Logger
	stopping := false
	takeovers := 0
	var diedAt time.Time
	delay := cfg.MinDelay
	quick := 0
	ctxDone := ctx.Done()
	// What a death is handled in, made now, when memory is plentiful:
	// then nothing is to be allocated (see dying).
	scratch := newScratch()
	var relay []Message // what the last serving process handed over, for the next
	handedOver := false
	var standby *child
	defer func() {
		if standby != nil {
			standby.discard()
		}
	}()
	// A standby that dies while no stop is asked for is warned of: the
	// next crash finds none ready. But a terminal's ^C, or a SIGTERM to
	// every gzramd process, kills the standby too, and its death may be
	// heard before the supervisor's own signal: one killed by SIGINT or
	// SIGTERM is unsettled until a stop comes (it was part of it) or
	// stopGrace passes (it was not).
	var unsettled *standbyEnd
	var settleDue <-chan time.Time
	settle := func() {
		if unsettled != nil {
			unsettled.log(log, stopping)
			unsettled, settleDue = nil, nil
		}
	}
	defer settle()
	startEnv := func() []string {
		env := []string{EnvTakeovers + "=" + strconv.Itoa(takeovers)}
		if !diedAt.IsZero() {
			env = append(env, EnvDiedAt+"="+strconv.FormatInt(diedAt.UnixNano(), 10))
		}
		if stopping {
			env = append(env, EnvStopping+"=1")
		}
		if handedOver {
			env = append(env, EnvHandedOver+"=1")
		}
		return env
	}
	var active *child
	for {
		if standby != nil && standby.alive() {
			active, standby = standby, nil
			active.start = time.Now()
			log.Info("the standby serving process takes over", "pid", active.cmd.Process.Pid, "takeovers", takeovers)
		} else {
			if standby != nil {
				standby.discard()
				standby = nil
			}
			var err error
			if active, err = cfg.spawn(startEnv(), false); err != nil {
				closeAll(relay)
				return ExitFailed, err
			}
		}
		active.release(relay, startEnv(), log)
		relay = nil
		// It takes the state over from a process that ended before it
		// (died, or handed over): a failure of its own before it serves
		// is no reason to drop that state (see failedTakeover below).
		tookOver := takeovers > 0
		if cfg.Started != nil {
			cfg.Started(active.cmd.Process.Pid, takeovers)
		}
		var standbyDue <-chan time.Time
		if cfg.Standby && cfg.Handover {
			standbyDue = time.After(cfg.StandbyAfter)
		}
		var end ending
		dying := active.died()
	wait:
		for {
			var standbyExited <-chan error
			if standby != nil {
				standbyExited = standby.exited
			}
			select {
			case err := <-active.exited:
				end = endingOf(active.cmd.ProcessState, err)
				break wait
			case <-dying:
				dying = nil
				if ws, shutErr, ok := active.deadEarly(scratch[:dyingBuf]); ok {
					end = ending{ws: ws, early: true, shutErr: shutErr}
					break wait
				}
			case <-standbyDue:
				standbyDue = nil
				var err error
				if standby, err = cfg.spawn(nil, true); err != nil {
					log.Warn("starting a standby serving process", "err", err)
					standby = nil
				} else {
					log.Info("standby serving process started", "pid", standby.cmd.Process.Pid)
				}
			case err := <-standbyExited:
				settle()
				end := standbyEnd{pid: standby.cmd.Process.Pid, how: endingOf(standby.cmd.ProcessState, err)}
				standby.exited = closedErr(err)
				standby.discard()
				standby = nil
				standbyDue = time.After(cfg.StableAfter)
				if !stopping && end.how.stopSignal() {
					unsettled, settleDue = &end, time.After(stopGrace)
				} else {
					end.log(log, stopping)
				}
			case <-settleDue:
				settle()
			case sig := <-cfg.Signals:
				if sig == syscall.SIGINT || sig == syscall.SIGTERM {
					stopping = true
					settle()
				}
				_ = active.cmd.Process.Signal(sig)
			case <-ctxDone:
				ctxDone = nil
				stopping = true
				settle()
				_ = active.cmd.Process.Signal(syscall.SIGTERM)
			}
		}
		cmd, start := active.cmd, active.start
		// Heard early, its teardown goes on (a GPU context's takes 100
		// ms or more); spawn's goroutine reaps it meanwhile.
		status, died := end.exit()
		served := false
		if pair := active.pair; pair != nil {
			<-active.given
			if !died && status == ExitHandedOver {
				relay = pair.taken(nil)
			} else {
				pair.taken(scratch)
			}
			served = pair.ready
			pair.mine.Close()
		}
		handedOver = !died && status == ExitHandedOver
		if handedOver {
			// An upgrade: no death, no wait. The state's memory is
			// locked here until the next one maps and locks it. The
			// standby is of the old executable: the next is not.
			if standby != nil {
				standby.discard()
				standby = nil
			}
			diedAt = time.Now()
			takeovers++
			cfg.keep(log)
			log.Info("the serving process handed over; starting the next to take its state over",
				"pid", cmd.Process.Pid, "lived", diedAt.Sub(start).Round(time.Millisecond), "takeovers", takeovers)
			continue
		}
		// A process that took the state over and failed before it served
		// (ExitFailed: say, its listen refused because the dead one's
		// listeners were still open, which they are until its teardown
		// ends, a CUDA context's taking 100 ms or more) ends nothing: the
		// state holds what the one before acknowledged, and ending Run
		// here would drop it with the kernel device waiting on it. It is
		// taken for a death at start: backed off, and GiveUp decides.
		failedTakeover := !died && status == ExitFailed && tookOver && !served && !stopping
		if !died && !failedTakeover {
			// Its own error line, the last, says why.
			return status, nil
		}
		now := time.Now()
		lived := now.Sub(start)
		if !failedTakeover {
			// A failed takeover keeps the death it failed to take over
			// from: the device has gone without a server since then.
			diedAt = now
		}
		takeovers++
		cfg.keep(log)
		if lived >= cfg.StableAfter || served {
			// A process that served is no crash at start: the next
			// starts at once, however soon this one died.
			delay, quick = cfg.MinDelay, 0
		} else if quick++; cfg.GiveUp != nil && cfg.GiveUp(quick) {
			log.Error("the serving process keeps dying as it starts; giving up", "deaths", quick, "how", end)
			return ExitFailed, fmt.Errorf("supervise: the serving process died %d times in a row within %v of its start", quick, cfg.StableAfter)
		}
		wait := delay
		if served || (standby != nil && standby.alive()) {
			wait = 0 // the device waits for a server: no time to lose
		}
		if failedTakeover {
			log.Error("the serving process failed before it served the state it took over; starting another to take it over",
				"pid", cmd.Process.Pid, "how", end, "lived", lived.Round(time.Millisecond),
				"takeovers", takeovers, "in", wait, "standby", standby != nil)
		} else {
			log.Error("the serving process died; starting another to take its state over",
				"pid", cmd.Process.Pid, "how", end, "lived", lived.Round(time.Millisecond),
				"takeovers", takeovers, "in", wait, "standby", standby != nil, "heard", end.heard())
		}
		if wait > 0 {
			select {
			case <-time.After(wait):
			case <-ctxDone:
				ctxDone = nil
				stopping = true
			}
		}
		if lived < cfg.StableAfter && !served {
			delay = min(2*delay, cfg.MaxDelay)
		}
	}
}

// stopGrace is how long a standby killed by SIGINT or SIGTERM waits for
// the supervisor to be asked to stop before its death is warned of (see
// Run): the signal reaches both at once, and is heard within
// milliseconds.
var stopGrace = time.Second

// standbyEnd is a standby's death, to be logged.
type standbyEnd struct {
	pid int
	how ending
}

// log logs it: as a warning unless the supervisor is stopping, which kills
// the standby anyway.
func (e *standbyEnd) log(log *slog.Logger, stopping bool) {
	if stopping {
		log.Info("the standby serving process ended with the stop", "pid", e.pid, "how", e.how)
		return
	}
	log.Warn("the standby serving process ended while it waited; starting another later", "pid", e.pid, "how", e.how)
}

func closedErr(err error) chan error {
	c := make(chan error, 1)
	c <- err
	return c
}

// child is a serving process: started, and, once released, serving.
type child struct {
	cmd  *exec.Cmd
	pair *handoverPair // nil without Config.Handover
	// handoverFD is the handover socket's descriptor number in the
	// child (-1 without one): its sockets are shut at its death, but
	// for that one, which the supervisor reads after.
	handoverFD int
	start      time.Time
	exited     chan error
	given      chan struct{} // closed once release's messages are taken
	// life and pidfd hear of its death early (see lifeline); nil and -1
	// where they could not be made, and the death is heard by wait(2).
	// The pidfd is closed once the process is reaped, under mu.
	life  *lifeline
	mu    sync.Mutex
	pidfd int
}

// spawn starts a serving process with env added to Config.Env. It waits on
// its handover socket (if any) until release; a standby gets no start
// environment but the supervisor's (release sends the rest).
func (cfg *Config) spawn(env []string, standby bool) (*child, error) {
	cmd := exec.Command(cfg.Path, cfg.Args...)
	cmd.Env = append(cfg.Env[:len(cfg.Env):len(cfg.Env)], EnvServing+"=1", EnvSupervisor+"="+strconv.Itoa(os.Getpid()))
	cmd.Env = append(cmd.Env, env...)
	if standby {
		cmd.Env = append(cmd.Env, EnvStandby+"=1")
	}
	if cfg.ParentDeath != 0 {
		cmd.Env = append(cmd.Env, EnvParentDeath+"="+strconv.Itoa(int(cfg.ParentDeath)))
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: cfg.ParentDeath}
	}
	for _, f := range cfg.Files {
		cmd.ExtraFiles = append(cmd.ExtraFiles, f.OSFile())
	}
	c := &child{cmd: cmd, pidfd: -1, handoverFD: -1}
	if cfg.Handover {
		var err error
		if c.pair, err = newHandoverPair(); err != nil {
			return nil, err
		}
		c.handoverFD = 3 + len(cmd.ExtraFiles)
		cmd.Env = append(cmd.Env, EnvHandover+"="+strconv.Itoa(c.handoverFD))
		cmd.ExtraFiles = append(cmd.ExtraFiles, c.pair.child)
	}
	if life, err := newLifeline(); err != nil {
		cfg.Logger.Warn("no lifeline for the serving process: a death is heard only once its teardown ends", "err", err)
	} else {
		c.life = life
		cmd.Env = append(cmd.Env, EnvLifeline+"="+strconv.Itoa(3+len(cmd.ExtraFiles)))
		cmd.ExtraFiles = append(cmd.ExtraFiles, life.file.OSFile())
	}
	cmd.Stdout, cmd.Stderr = cfg.Stdout, cfg.Stderr
	// Its own process group is not wanted: a terminal's ^C reaches
	// both. So the serving process hears it twice, from the terminal
	// and forwarded by Run, and a standby dies of it (see standbyEnd).
	c.start = time.Now()
	if err := cmd.Start(); err != nil {
		if c.pair != nil {
			c.pair.close()
		}
		if c.life != nil {
			c.life.close()
		}
		return nil, fmt.Errorf("supervise: starting the serving process: %w", err)
	}
	if c.pair != nil {
		c.pair.child.Close()
	}
	if c.life != nil {
		// Not yet waited for: the PID is the child's.
		var err error
		if c.pidfd, err = unix.PidfdOpen(cmd.Process.Pid, 0); err != nil {
			cfg.Logger.Warn("no pidfd for the serving process: a death is heard only once its teardown ends", "err", err)
			c.pidfd = -1
			c.life.close()
			c.life = nil
		} else {
			c.life.started()
		}
	}
	c.exited = make(chan error, 1)
	go func() {
		err := cmd.Wait()
		// Run goes on first: unmapping the lifeline takes the mmap lock,
		// which a thread of this process faulting under memory pressure
		// may hold.
		c.exited <- err
		c.mu.Lock()
		if c.pidfd >= 0 {
			unix.Close(c.pidfd)
			c.pidfd = -1
		}
		c.mu.Unlock()
		if c.life != nil {
			c.life.close()
		}
	}()
	return c, nil
}

// died returns the channel closed when the lifeline says the process is
// dying (nil without one).
func (c *child) died() <-chan struct{} {
	if c.life == nil {
		return nil
	}
	return c.life.died
}

// deadEarly is asked once the lifeline says the process is dying, before
// wait(2) can tell: it returns the process's wait status if it died
// (exitOf), and then shuts down its sockets (dying.shutSockets; shutErr
// says why not all, for the log). ok is false if it ended on its own, or
// if that could not be told; the caller then waits for wait(2). It
// allocates nothing (see dying).
func (c *child) deadEarly(buf []byte) (ws syscall.WaitStatus, shutErr error, ok bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.pidfd < 0 {
		return 0, nil, false // reaped: wait(2) tells
	}
	d := dying{pid: c.cmd.Process.Pid, pidfd: c.pidfd, buf: buf}
	ws, ok = d.end(time.Second)
	if !ok {
		return 0, nil, false
	}
	if _, died := exitOf(ws, nil); !died {
		return 0, nil, false
	}
	_, shutErr = d.shutSockets(c.handoverFD)
	return ws, shutErr, true
}

// release lets the serving process go on: the connections handed over, and
// its start environment (for a standby, which was started without it).
func (c *child) release(msgs []Message, env []string, log *slog.Logger) {
	c.given = make(chan struct{})
	if c.pair == nil {
		closeAll(msgs)
		close(c.given)
		return
	}
	msgs = append([]Message{{Data: []byte(envMessage + strings.Join(env, "\n"))}}, msgs...)
	go func() {
		defer close(c.given)
		if err := c.pair.give(msgs); err != nil {
			log.Warn("handing the last serving process's connections to the next failed; the kernel device reconnects instead", "err", err)
		}
	}()
}

// alive reports whether the process has not exited yet.
func (c *child) alive() bool {
	select {
	case err := <-c.exited:
		c.exited = closedErr(err)
		return false
	default:
		return true
	}
}

// discard ends a standby that will not serve.
func (c *child) discard() {
	_ = c.cmd.Process.Kill()
	<-c.exited
	if c.pair != nil {
		closeAll(c.pair.taken(nil))
		c.pair.mine.Close()
	}
}

// keep locks the state's memory while no serving process holds it.
func (cfg *Config) keep(log *slog.Logger) {
	if cfg.Keeper == nil {
		return
	}
	go func() {
		if held, err := cfg.Keeper.Lock(); err != nil {
			log.Error("locking the state's memory after the serving process ended", "err", err)
		} else {
			log.Info("state memory locked by the supervisor", "bytes", held)
		}
	}()
}

// SetParentDeath has this serving process get the signal its supervisor
// asked for (ParentDeath) when the supervisor dies: an exec of the
// process's own (a binary with file capabilities) clears it. It reports
// whether the supervisor died already.
func (s Started) SetParentDeath() (supervisorGone bool, err error) {
	if s.ParentDeath == 0 {
		return false, nil
	}
	if err := unix.Prctl(unix.PR_SET_PDEATHSIG, uintptr(s.ParentDeath), 0, 0, 0); err != nil {
		return false, fmt.Errorf("supervise: prctl(PR_SET_PDEATHSIG): %w", err)
	}
	return !s.SupervisorAlive(), nil
}

// waitStatus is the wait status of a process Wait returned err for: ok is
// false where it was not waited for properly.
func waitStatus(ps *os.ProcessState, err error) (ws syscall.WaitStatus, ok bool) {
	var exit *exec.ExitError
	if (err != nil && !errors.As(err, &exit)) || ps == nil {
		return 0, false
	}
	ws, ok = ps.Sys().(syscall.WaitStatus)
	return ws, ok
}

// exitOf says how a serving process ended: on its own with a status, or
// died (a signal, a Go panic's status 2, any status of neither). err is
// Wait's error where ws could not be had (waitStatus).
func exitOf(ws syscall.WaitStatus, err error) (status int, died bool) {
	if err != nil || ws.Signaled() {
		return 0, true // not even waited for properly: treat as a death
	}
	switch s := ws.ExitStatus(); s {
	case ExitStopped, ExitFailed, ExitHandedOver:
		return s, false
	default:
		return s, true
	}
}

func describeExit(ws syscall.WaitStatus, err error) string {
	if err != nil {
		return err.Error()
	}
	if ws.Signaled() {
		return "killed by " + unix.SignalName(ws.Signal())
	}
	return fmt.Sprintf("exit status %d", ws.ExitStatus())
}

// ending is how a serving process ended, as wait(2) or its lifeline
// (early) told.
type ending struct {
	ws      syscall.WaitStatus
	err     error // the process could not be waited for properly
	early   bool
	shutErr error // early: why its sockets were not all shut
}

// heard says how the death was heard, for the log.
func (e ending) heard() string {
	switch {
	case !e.early:
		return "wait"
	case e.shutErr != nil:
		return "lifeline; its sockets close with its teardown: " + e.shutErr.Error()
	}
	return "lifeline"
}

func endingOf(ps *os.ProcessState, err error) ending {
	ws, ok := waitStatus(ps, err)
	if !ok {
		if err == nil {
			err = errors.New("no wait status")
		}
		return ending{err: err}
	}
	return ending{ws: ws}
}

// stopSignal reports whether the process was killed by a signal that asks
// gzramd to stop.
func (e ending) stopSignal() bool {
	return e.err == nil && e.ws.Signaled() && (e.ws.Signal() == syscall.SIGINT || e.ws.Signal() == syscall.SIGTERM)
}

func (e ending) exit() (status int, died bool) { return exitOf(e.ws, e.err) }
func (e ending) String() string                { return describeExit(e.ws, e.err) }
