// systemd's sd_notify protocol: READY, STOPPING, STATUS and the watchdog.

package main

import (
	"net"
	"os"
	"strconv"
	"time"
)

// notifier speaks systemd's sd_notify protocol: datagrams such as
// "READY=1" to the Unix socket named by $NOTIFY_SOCKET (a leading '@'
// means the abstract namespace). Without $NOTIFY_SOCKET it does nothing.
type notifier struct {
	addr string
}

func newNotifier() *notifier {
	n := &notifier{addr: os.Getenv("NOTIFY_SOCKET")}
	// Children (mkswap, swapon) must not talk to systemd in our name.
	os.Unsetenv("NOTIFY_SOCKET")
	return n
}

func (n *notifier) enabled() bool { return n.addr != "" }

// notify sends state; errors are returned for logging, never fatal.
func (n *notifier) notify(state string) error {
	if n.addr == "" {
		return nil
	}
	addr := n.addr
	if addr[0] == '@' {
		addr = "\x00" + addr[1:]
	}
	c, err := net.DialUnix("unixgram", nil, &net.UnixAddr{Name: addr, Net: "unixgram"})
	if err != nil {
		return err
	}
	defer c.Close()
	_, err = c.Write([]byte(state))
	return err
}

// watchdogInterval returns how often to send WATCHDOG=1: half of
// $WATCHDOG_USEC, when the watchdog is meant for this process ($WATCHDOG_PID
// unset or ours); 0 when there is no watchdog.
func watchdogInterval() time.Duration {
	usec, err := strconv.ParseInt(os.Getenv("WATCHDOG_USEC"), 10, 64)
	if err != nil || usec <= 0 {
		return 0
	}
	if p := os.Getenv("WATCHDOG_PID"); p != "" && p != strconv.Itoa(os.Getpid()) {
		return 0
	}
	return time.Duration(usec) * time.Microsecond / 2
}
