// A serving process whose supervisor died: it serves on, and hands over to the next supervisor's serving process.

package serving

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strconv"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gzramd/gzramd/pkg/pipeline"
	"github.com/gzramd/gzramd/pkg/supervise"
	"github.com/gzramd/gzramd/pkg/swapctl"
)

// Where systemd keeps the state, a supervisor that dies is started again
// by systemd, and its serving process takes the state over. Its serving
// process must not die with it: the kernel device would wait for the next
// one, and so would every process with pages on it, systemd among them,
// which then cannot start the next supervisor (a guest froze so, until the
// dead-connection timeout failed the swapped pages and init died). So the
// serving process serves on, an orphan, and hands its connections over at
// a request boundary, as at an upgrade, when the next supervisor's serving
// process asks for them on the state's rendezvous socket.

// rendezvousName is the abstract Unix socket where a serving process whose
// supervisor died waits for the next one: one per state.
func rendezvousName(st *pipeline.State) (string, error) {
	info, err := st.Info()
	if err != nil {
		return "", err
	}
	return "@gzramd-serving-" + info.ID, nil
}

// orphanHandover is how long a serving process waits for an orphan to
// hand over and exit.
const orphanHandover = 30 * time.Second

// takeFromOrphan asks the serving process of the supervisor before this
// one's, if it serves on, for its connections, and waits for it to exit:
// only then may this process take the state over. Nothing listening is
// no error: no orphan serves.
func takeFromOrphan(st *pipeline.State, start supervise.Started, log *slog.Logger) ([]supervise.Message, error) {
	if !start.Serving {
		return nil, nil
	}
	name, err := rendezvousName(st)
	if err != nil {
		return nil, err
	}
	c, err := net.DialUnix("unixpacket", nil, &net.UnixAddr{Name: name, Net: "unixpacket"})
	if err != nil {
		return nil, nil // no orphan
	}
	defer c.Close()
	pid := 0
	if cred := swapctl.PeerCred(c); cred != nil {
		pid = int(cred.Pid)
	}
	log.Warn("a serving process of an earlier supervisor serves on; asking it to hand over", "pid", pid)
	f, err := c.File()
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if err := supervise.Send(f, supervise.Message{Data: []byte("hand over")}); err != nil {
		return nil, fmt.Errorf("asking the orphaned serving process %d to hand over: %w", pid, err)
	}
	msgs, err := supervise.Receive(f, orphanHandover)
	if err != nil {
		return nil, fmt.Errorf("the orphaned serving process %d did not hand over: %w", pid, err)
	}
	if pid > 0 {
		if err := waitGone(pid, orphanHandover); err != nil {
			for _, m := range msgs {
				if m.File != nil {
					m.File.Close()
				}
			}
			return nil, fmt.Errorf("the orphaned serving process %d handed over but did not exit: %w", pid, err)
		}
	}
	log.Info("the orphaned serving process handed over and exited", "pid", pid, "connections", len(msgs))
	return msgs, nil
}

// listenForSuccessor waits, once the supervisor died, for the next
// supervisor's serving process, and passes its request on to the daemon's
// main loop (d.successor).
func (d *daemon) listenForSuccessor(st *pipeline.State) {
	name, err := rendezvousName(st)
	if err != nil {
		d.log.Error("the next serving process cannot find this one; it will reattach the device instead", "err", err)
		return
	}
	l, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: name, Net: "unixpacket"})
	if err != nil {
		d.log.Error("the next serving process cannot find this one; it will reattach the device instead", "err", err)
		return
	}
	go func() {
		defer l.Close()
		for {
			c, err := l.AcceptUnix()
			if err != nil {
				return
			}
			uid := -1
			if cred := swapctl.PeerCred(c); cred != nil {
				uid = int(cred.Uid)
			}
			if uid != os.Geteuid() {
				d.log.Warn("refusing a handover request from another user", "uid", uid)
				c.Close()
				continue
			}
			f, err := c.File()
			c.Close()
			if err != nil {
				continue
			}
			if _, err := supervise.ReceiveOne(f, 5*time.Second); err != nil {
				f.Close()
				continue
			}
			d.successor <- f
			return
		}
	}()
}

// waitGone waits for process pid to exit. An exited process not yet
// reaped counts as gone: its parent, once the supervisor died, is init,
// which may itself be waiting for a page from the very kernel device
// this process is about to serve.
func waitGone(pid int, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	for time.Now().Before(deadline) {
		if err := unix.Kill(pid, 0); errors.Is(err, unix.ESRCH) || exited(pid) {
			return nil
		}
		time.Sleep(5 * time.Millisecond)
	}
	return fmt.Errorf("process %d still runs after %v", pid, limit)
}

// exited reports whether process pid is a zombie (or being reaped).
func exited(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return errors.Is(err, os.ErrNotExist)
	}
	// pid (comm) state ...: comm may hold spaces and parentheses.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 || i+2 >= len(b) {
		return false
	}
	state := b[i+2]
	return state == 'Z' || state == 'X'
}
