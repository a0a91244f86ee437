// Package sdnotify speaks systemd's sd_notify protocol: READY, STOPPING,
// STATUS, the watchdog, and descriptors for its file descriptor store.
package sdnotify

import (
	"fmt"
	"os"
	"strconv"
	"time"

	"golang.org/x/sys/unix"
)

// Notifier sends datagrams such as "READY=1" to the Unix socket named by
// $NOTIFY_SOCKET (a leading '@' means the abstract namespace). Without
// one it does nothing.
type Notifier struct {
	addr string
}

// FromEnv returns the Notifier for $NOTIFY_SOCKET, and unsets it:
// children (mkswap, swapon) must not talk to systemd in this process's
// name.
func FromEnv() *Notifier {
	n := New(os.Getenv("NOTIFY_SOCKET"))
	os.Unsetenv("NOTIFY_SOCKET")
	return n
}

// New returns a Notifier for the socket at addr ("" for none).
func New(addr string) *Notifier { return &Notifier{addr: addr} }

// Enabled reports whether there is a socket to notify.
func (n *Notifier) Enabled() bool { return n.addr != "" }

// Notify sends state; errors are returned for logging, never fatal.
func (n *Notifier) Notify(state string) error {
	return n.NotifyWithFDs(state)
}

// NotifyWithFDs sends state with descriptors attached
// (sd_pid_notify_with_fds), as FDSTORE=1 wants.
func (n *Notifier) NotifyWithFDs(state string, fds ...int) error {
	if n.addr == "" {
		return nil
	}
	addr := n.addr
	if addr[0] == '@' {
		addr = "\x00" + addr[1:]
	}
	s, err := unix.Socket(unix.AF_UNIX, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("sd_notify: %w", err)
	}
	defer unix.Close(s)
	var oob []byte
	if len(fds) > 0 {
		oob = unix.UnixRights(fds...)
	}
	if err := unix.Sendmsg(s, []byte(state), oob, &unix.SockaddrUnix{Name: addr}, 0); err != nil {
		return fmt.Errorf("sd_notify: %w", err)
	}
	return nil
}

// WatchdogInterval returns how often to send WATCHDOG=1: half of
// $WATCHDOG_USEC, when the watchdog is meant for this process
// ($WATCHDOG_PID unset or ours); 0 when there is no watchdog.
func WatchdogInterval() time.Duration {
	usec, err := strconv.ParseInt(os.Getenv("WATCHDOG_USEC"), 10, 64)
	if err != nil || usec <= 0 {
		return 0
	}
	if p := os.Getenv("WATCHDOG_PID"); p != "" && p != strconv.Itoa(os.Getpid()) {
		return 0
	}
	return time.Duration(usec) * time.Microsecond / 2
}
