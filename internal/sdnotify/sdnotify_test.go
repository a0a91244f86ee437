package sdnotify

import (
	"net"
	"os"
	"strconv"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/gzramd/gzramd/internal/testneeds"
)

// TestNotifyAbstractSocket: a message, with a descriptor, reaches a
// socket in the abstract namespace; without a socket, nothing is sent.
func TestNotifyAbstractSocket(t *testing.T) {
	name := "gzramd-sdnotify-test-" + strconv.Itoa(os.Getpid())
	conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: "\x00" + name, Net: "unixgram"})
	if err != nil {
		testneeds.Machine(t, "abstract unix sockets (a Linux network namespace has them): %v", err)
	}
	defer conn.Close()
	n := New("@" + name)
	if err := n.Notify("READY=1"); err != nil {
		t.Fatal(err)
	}
	buf, oob := make([]byte, 64), make([]byte, 64)
	k, _, _, _, err := conn.ReadMsgUnix(buf, oob)
	if err != nil || string(buf[:k]) != "READY=1" {
		t.Errorf("got %q, %v", buf[:k], err)
	}
	if err := n.NotifyWithFDs("FDSTORE=1", int(os.Stdin.Fd())); err != nil {
		t.Fatal(err)
	}
	k, oobn, _, _, err := conn.ReadMsgUnix(buf, oob)
	if err != nil || string(buf[:k]) != "FDSTORE=1" {
		t.Fatalf("got %q, %v", buf[:k], err)
	}
	cms, err := unix.ParseSocketControlMessage(oob[:oobn])
	if err != nil || len(cms) != 1 {
		t.Fatalf("control messages %v, %v", cms, err)
	}
	fds, err := unix.ParseUnixRights(&cms[0])
	if err != nil || len(fds) != 1 {
		t.Fatalf("rights %v, %v", fds, err)
	}
	unix.Close(fds[0])
	if err := New("").Notify("READY=1"); err != nil || New("").Enabled() {
		t.Errorf("without NOTIFY_SOCKET notify must do nothing, got %v", err)
	}
}

func TestWatchdogInterval(t *testing.T) {
	for _, tc := range []struct {
		usec, pid string
		want      string
	}{
		{"", "", "0s"},
		{"30000000", "", "15s"},
		{"30000000", strconv.Itoa(os.Getpid()), "15s"},
		{"30000000", "1", "0s"}, // meant for another process
		{"banana", "", "0s"},
	} {
		t.Setenv("WATCHDOG_USEC", tc.usec)
		t.Setenv("WATCHDOG_PID", tc.pid)
		if got := WatchdogInterval().String(); got != tc.want {
			t.Errorf("WATCHDOG_USEC=%q WATCHDOG_PID=%q: %s, want %s", tc.usec, tc.pid, got, tc.want)
		}
	}
}
