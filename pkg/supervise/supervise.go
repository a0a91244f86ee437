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
	"fmt"
	"io"
	"log/slog"
	"os"
	"strconv"
	"syscall"
	"time"

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
	s := &supervisor{
		cfg:     cfg,
		log:     cfg.Logger,
		ctxDone: ctx.Done(),
		// What a death is handled in, made now, when memory is
		// plentiful: then nothing is to be allocated (see dying).
		scratch: newScratch(),
		delay:   cfg.MinDelay,
	}
	defer s.close()
	return s.run()
}

// supervisor is Run's state. Its methods are the events that change it,
// each called from run's goroutine, one at a time.
type supervisor struct {
	cfg     Config
	log     *slog.Logger
	ctxDone <-chan struct{} // nil once heard
	scratch []byte

	active  *child // the serving process
	standby *child // nil when none is started ahead

	// What the next serving process is told (see env).
	stopping   bool
	takeovers  int
	diedAt     time.Time
	handedOver bool
	relay      []Message // what the last serving process handed over

	// The backoff after deaths at start: the wait before the next start,
	// and how many deaths in a row came within StableAfter.
	delay time.Duration
	quick int

	standbyDue <-chan time.Time // when to start a standby; nil for not now

	// A standby that dies while no stop is asked for is warned of: the
	// next crash finds none ready. But a terminal's ^C, or a SIGTERM to
	// every gzramd process, kills the standby too, and its death may be
	// heard before the supervisor's own signal: one killed by SIGINT or
	// SIGTERM is unsettled until a stop comes (it was part of it) or
	// stopGrace passes (it was not).
	unsettled *standbyEnd
	settleDue <-chan time.Time
}

// run starts a serving process, waits for it to end, and starts the next,
// until one ends in a way that ends Run.
func (s *supervisor) run() (int, error) {
	for {
		if err := s.start(); err != nil {
			return ExitFailed, err
		}
		// It takes the state over from a process that ended before it
		// (died, or handed over): a failure of its own before it serves
		// is no reason to drop that state (see below).
		tookOver := s.takeovers > 0
		c := s.active
		end := s.wait()
		// Heard early, its teardown goes on (a GPU context's takes 100
		// ms or more); spawn's goroutine reaps it meanwhile.
		status, died := end.exit()
		s.handedOver = !died && status == ExitHandedOver
		served := s.collect(c)
		if s.handedOver {
			s.upgraded(c)
			continue
		}
		// A process that took the state over and failed before it served
		// (ExitFailed: say, its listen refused because the dead one's
		// listeners were still open, which they are until its teardown
		// ends, a CUDA context's taking 100 ms or more) ends nothing: the
		// state holds what the one before acknowledged, and ending Run
		// here would drop it with the kernel device waiting on it. It is
		// taken for a death at start: backed off, and GiveUp decides.
		failedTakeover := !died && status == ExitFailed && tookOver && !served && !s.stopping
		if !died && !failedTakeover {
			// Its own error line, the last, says why.
			return status, nil
		}
		if err := s.died(c, end, served, failedTakeover); err != nil {
			return ExitFailed, err
		}
	}
}

// wait hands each event to its method until the serving process ends, and
// returns how it ended.
func (s *supervisor) wait() ending {
	dying := s.active.died()
	for {
		var standbyExited <-chan error
		if s.standby != nil {
			standbyExited = s.standby.exited
		}
		select {
		case err := <-s.active.exited:
			return endingOf(s.active.cmd.ProcessState, err)
		case <-dying:
			dying = nil
			if ws, shutErr, ok := s.active.deadEarly(s.scratch[:dyingBuf]); ok {
				return ending{ws: ws, early: true, shutErr: shutErr}
			}
		case <-s.standbyDue:
			s.startStandby()
		case err := <-standbyExited:
			s.standbyEnded(err)
		case <-s.settleDue:
			s.settle()
		case sig := <-s.cfg.Signals:
			s.signal(sig)
		case <-s.ctxDone:
			s.ctxDone = nil
			s.stop()
			_ = s.active.cmd.Process.Signal(syscall.SIGTERM)
		}
	}
}

// start starts the next serving process, or lets the standby take over,
// and releases it with what the one before handed over.
func (s *supervisor) start() error {
	if s.standby != nil && s.standby.alive() {
		s.active, s.standby = s.standby, nil
		s.active.start = time.Now()
		s.log.Info("the standby serving process takes over", "pid", s.active.cmd.Process.Pid, "takeovers", s.takeovers)
	} else {
		if s.standby != nil {
			s.standby.discard()
			s.standby = nil
		}
		c, err := s.cfg.spawn(s.env(), false)
		if err != nil {
			closeAll(s.relay)
			return err
		}
		s.active = c
	}
	s.active.release(s.relay, s.env(), s.log)
	s.relay = nil
	if s.cfg.Started != nil {
		s.cfg.Started(s.active.cmd.Process.Pid, s.takeovers)
	}
	s.standbyDue = nil
	if s.cfg.Standby && s.cfg.Handover {
		s.standbyDue = time.After(s.cfg.StandbyAfter)
	}
	return nil
}

// env is the start environment of the next serving process.
func (s *supervisor) env() []string {
	env := []string{EnvTakeovers + "=" + strconv.Itoa(s.takeovers)}
	if !s.diedAt.IsZero() {
		env = append(env, EnvDiedAt+"="+strconv.FormatInt(s.diedAt.UnixNano(), 10))
	}
	if s.stopping {
		env = append(env, EnvStopping+"=1")
	}
	if s.handedOver {
		env = append(env, EnvHandedOver+"=1")
	}
	return env
}

// collect takes what the ended serving process c sent on its handover
// socket: kept for the next after a handover, closed after any other end.
// It reports whether c said it served (Ready).
func (s *supervisor) collect(c *child) (served bool) {
	pair := c.pair
	if pair == nil {
		return false
	}
	<-c.given
	if s.handedOver {
		s.relay = pair.taken(nil)
	} else {
		pair.taken(s.scratch)
	}
	pair.mine.Close()
	return pair.ready
}

// upgraded is the end of an upgrade asked for with SIGHUP: c handed over
// (ExitHandedOver). No death, no wait: the next starts at once. The
// state's memory is locked here until the next one maps and locks it.
func (s *supervisor) upgraded(c *child) {
	// The standby is of the old executable: the next is not.
	if s.standby != nil {
		s.standby.discard()
		s.standby = nil
	}
	s.diedAt = time.Now()
	s.takeovers++
	s.keep()
	s.log.Info("the serving process handed over; starting the next to take its state over",
		"pid", c.cmd.Process.Pid, "lived", s.diedAt.Sub(c.start).Round(time.Millisecond), "takeovers", s.takeovers)
}

// died is a death of the serving process c, or its failed takeover (see
// run): it backs off before run starts the next, or, where GiveUp says so,
// returns the error Run ends with.
func (s *supervisor) died(c *child, end ending, served, failedTakeover bool) error {
	now := time.Now()
	lived := now.Sub(c.start)
	if !failedTakeover {
		// A failed takeover keeps the death it failed to take over
		// from: the device has gone without a server since then.
		s.diedAt = now
	}
	s.takeovers++
	s.keep()
	if lived >= s.cfg.StableAfter || served {
		// A process that served is no crash at start: the next
		// starts at once, however soon this one died.
		s.delay, s.quick = s.cfg.MinDelay, 0
	} else if s.quick++; s.cfg.GiveUp != nil && s.cfg.GiveUp(s.quick) {
		s.log.Error("the serving process keeps dying as it starts; giving up", "deaths", s.quick, "how", end)
		return fmt.Errorf("supervise: the serving process died %d times in a row within %v of its start", s.quick, s.cfg.StableAfter)
	}
	wait := s.delay
	if served || (s.standby != nil && s.standby.alive()) {
		wait = 0 // the device waits for a server: no time to lose
	}
	if failedTakeover {
		s.log.Error("the serving process failed before it served the state it took over; starting another to take it over",
			"pid", c.cmd.Process.Pid, "how", end, "lived", lived.Round(time.Millisecond),
			"takeovers", s.takeovers, "in", wait, "standby", s.standby != nil)
	} else {
		s.log.Error("the serving process died; starting another to take its state over",
			"pid", c.cmd.Process.Pid, "how", end, "lived", lived.Round(time.Millisecond),
			"takeovers", s.takeovers, "in", wait, "standby", s.standby != nil, "heard", end.heard())
	}
	if wait > 0 {
		select {
		case <-time.After(wait):
		case <-s.ctxDone:
			s.ctxDone = nil
			s.stopping = true
		}
	}
	if lived < s.cfg.StableAfter && !served {
		s.delay = min(2*s.delay, s.cfg.MaxDelay)
	}
	return nil
}

// signal forwards sig to the serving process; SIGINT and SIGTERM are a
// stop too. SIGHUP asks it for an upgrade, which ends in upgraded.
func (s *supervisor) signal(sig os.Signal) {
	if sig == syscall.SIGINT || sig == syscall.SIGTERM {
		s.stop()
	}
	_ = s.active.cmd.Process.Signal(sig)
}

// stop is a stop asked for, by SIGINT, SIGTERM or Run's context: a
// serving process started from now on is told so (EnvStopping), and an
// unsettled standby's end was part of it.
func (s *supervisor) stop() {
	s.stopping = true
	s.settle()
}

// startStandby starts the next serving process ahead (Config.Standby).
func (s *supervisor) startStandby() {
	s.standbyDue = nil
	c, err := s.cfg.spawn(nil, true)
	if err != nil {
		s.log.Warn("starting a standby serving process", "err", err)
		return
	}
	s.standby = c
	s.log.Info("standby serving process started", "pid", c.cmd.Process.Pid)
}

// standbyEnded is the standby's end while it waited, which err is
// wait(2)'s for; another is started StableAfter later.
func (s *supervisor) standbyEnded(err error) {
	s.settle()
	end := standbyEnd{pid: s.standby.cmd.Process.Pid, how: endingOf(s.standby.cmd.ProcessState, err)}
	s.standby.exited = closedErr(err)
	s.standby.discard()
	s.standby = nil
	s.standbyDue = time.After(s.cfg.StableAfter)
	if !s.stopping && end.how.stopSignal() {
		s.unsettled, s.settleDue = &end, time.After(stopGrace)
	} else {
		end.log(s.log, s.stopping)
	}
}

// settle logs the unsettled standby's end, now that a stop came or
// stopGrace passed.
func (s *supervisor) settle() {
	if s.unsettled != nil {
		s.unsettled.log(s.log, s.stopping)
		s.unsettled, s.settleDue = nil, nil
	}
}

// keep locks the state's memory while no serving process holds it.
func (s *supervisor) keep() {
	k := s.cfg.Keeper
	if k == nil {
		return
	}
	go func() {
		if held, err := k.Lock(); err != nil {
			s.log.Error("locking the state's memory after the serving process ended", "err", err)
		} else {
			s.log.Info("state memory locked by the supervisor", "bytes", held)
		}
	}()
}

// close ends Run: the unsettled standby's end logged, and a standby that
// will not serve now ended.
func (s *supervisor) close() {
	s.settle()
	if s.standby != nil {
		s.standby.discard()
	}
}

// stopGrace is how long a standby killed by SIGINT or SIGTERM waits for
// the supervisor to be asked to stop before its death is warned of (see
// supervisor.unsettled): the signal reaches both at once, and is heard
// within milliseconds.
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
