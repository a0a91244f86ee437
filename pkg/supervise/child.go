// A serving process as the supervisor sees it: started, released, and
// how it ended.

package supervise

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

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

func closedErr(err error) chan error {
	c := make(chan error, 1)
	c <- err
	return c
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
