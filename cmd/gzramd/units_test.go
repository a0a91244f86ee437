package main

import (
	"os"
	"strconv"
	"testing"
	"time"
)

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

func TestNotifyAbstractSocket(t *testing.T) {
	fake := listenNotify(t, true)
	n := &notifier{addr: fake.addr}
	if err := n.notify("READY=1"); err != nil {
		t.Fatal(err)
	}
	if m, ok := fake.expect("", 10*time.Second); !ok || m.text != "READY=1" {
		t.Errorf("got %q", m.text)
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
