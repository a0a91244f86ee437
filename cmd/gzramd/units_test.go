package main

import (
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

func TestParseSwaps(t *testing.T) {
	in := "Filename\t\t\t\tType\t\tSize\t\tUsed\t\tPriority\n" +
		"/dev/nbd0                               partition\t1048572\t\t2048\t\t100\n" +
		"/swap\\040file                           file\t\t524284\t\t0\t\t-2\n"
	got, err := parseSwaps(strings.NewReader(in))
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[0] != (swapEntry{"/dev/nbd0", 2048 << 10}) || got[1].Path != "/swap file" {
		t.Errorf("parseSwaps = %+v", got)
	}
	if _, err := parseSwaps(strings.NewReader("h\n/dev/x partition 1 lots 0\n")); err == nil {
		t.Error("a malformed Used field was accepted")
	}
}

func TestParseDevice(t *testing.T) {
	for in, want := range map[string]int{"/dev/nbd0": 0, "nbd15": 15, "auto": -1} {
		if got, err := parseDevice(in); err != nil || got != want {
			t.Errorf("parseDevice(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"/dev/sda", "/dev/nbd", "/dev/nbd-1", "/dev/nbd01", "nbd1x", ""} {
		if _, err := parseDevice(in); err == nil {
			t.Errorf("parseDevice(%q) accepted", in)
		}
	}
}

func TestSizes(t *testing.T) {
	for in, want := range map[string]int64{"4096": 4096, "8GiB": 8 << 30, "1.5G": 3 << 29, "512 MiB": 512 << 20, "1GB": 1e9, "2k": 2048} {
		if got, err := parseSize(in); err != nil || got != want {
			t.Errorf("parseSize(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"", "-1G", "G", "1 parsec", "1e30TiB"} {
		if _, err := parseSize(in); err == nil {
			t.Errorf("parseSize(%q) accepted", in)
		}
	}
	for n, want := range map[int64]string{0: "0B", 1023: "1023B", 4096: "4K", 1536: "1.5K", 64 << 20: "64M", 3 << 30: "3G"} {
		if got := humanBytes(n); got != want {
			t.Errorf("humanBytes(%d) = %q, want %q", n, got, want)
		}
	}
}

// ourSwaps must find an NBD swap device whose set-up process is a peer on
// one of our sockets, and only that one.
func TestOurSwapsByPeer(t *testing.T) {
	dir := t.TempDir()
	procSwaps, sysBlock = filepath.Join(dir, "swaps"), filepath.Join(dir, "block")
	t.Cleanup(func() { procSwaps, sysBlock = "/proc/swaps", "/sys/block" })
	writeSwapsFile(t, procSwaps, "/dev/nbd2", "/dev/nbd5", "/dev/sdb2")
	writePID(t, filepath.Join(sysBlock, "nbd2"), os.Getpid()) // connected to us below
	writePID(t, filepath.Join(sysBlock, "nbd5"), 1)           // someone else's server

	var tr connTracker
	l, err := net.Listen("unix", filepath.Join(dir, "s"))
	if err != nil {
		t.Fatal(err)
	}
	tl := tr.wrap(l)
	defer tl.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, err := tl.Accept()
		if err == nil {
			accepted <- c
		}
	}()
	if got, err := ourSwaps("", &tr); err != nil || len(got) != 0 {
		t.Errorf("with nobody connected, ourSwaps = %v, %v", got, err)
	}
	c, err := net.Dial("unix", filepath.Join(dir, "s"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	sc := <-accepted
	got, err := ourSwaps("", &tr)
	if err != nil || len(got) != 1 || got[0].Path != "/dev/nbd2" {
		t.Errorf("ourSwaps = %v, %v; want /dev/nbd2 only", got, err)
	}
	// A device we attached ourselves counts by its path.
	if got, _ := ourSwaps("/dev/nbd5", &tr); len(got) != 2 {
		t.Errorf("with /dev/nbd5 our own, ourSwaps = %v", got)
	}
	sc.Close()
	if n := tr.count(); n != 0 {
		t.Errorf("%d connections tracked after close", n)
	}
}

func writeSwapsFile(t *testing.T, path string, devs ...string) {
	t.Helper()
	s := "Filename\tType\tSize\tUsed\tPriority\n"
	for _, d := range devs {
		s += d + "\tpartition\t1024\t8\t-2\n"
	}
	if err := os.WriteFile(path, []byte(s), 0o644); err != nil {
		t.Fatal(err)
	}
}

func writePID(t *testing.T, dir string, pid int) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "pid"), []byte(strconv.Itoa(pid)+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestNotifyAbstractSocket(t *testing.T) {
	name := "gzramd-test-" + strconv.Itoa(os.Getpid())
	conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: "\x00" + name, Net: "unixgram"})
	if err != nil {
		t.Skip("no abstract unix sockets here:", err)
	}
	defer conn.Close()
	n := &notifier{addr: "@" + name}
	if err := n.notify("READY=1"); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 64)
	k, err := conn.Read(buf)
	if err != nil || string(buf[:k]) != "READY=1" {
		t.Errorf("got %q, %v", buf[:k], err)
	}
	if err := (&notifier{}).notify("READY=1"); err != nil {
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
		if got := watchdogInterval().String(); got != tc.want {
			t.Errorf("WATCHDOG_USEC=%q WATCHDOG_PID=%q: %s, want %s", tc.usec, tc.pid, got, tc.want)
		}
	}
}
