package supervise

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gzramd/gzramd/internal/memfd"
)

// handoverChild plays serving processes that hand over: the first sends
// two messages, one with a descriptor (a memfd holding "live"), and exits
// with ExitHandedOver; the second receives them and writes what it got to
// the file on fd 3, then exits 0.
func handoverChild() int {
	sock, ok := FromEnv().HandoverSocket()
	if !ok {
		return 11
	}
	if os.Getenv("SUPERVISE_TEST_HANDOVER") == "ready" {
		// Serves, then dies, twice; the third exits.
		if _, err := Receive(sock, 5*time.Second); err != nil || Ready(sock) != nil {
			return 12
		}
		if n, _ := strconv.Atoi(os.Getenv(EnvTakeovers)); n < 2 {
			syscall.Kill(os.Getpid(), syscall.SIGKILL)
		}
		return 0
	}
	got, err := Receive(sock, 5*time.Second)
	if err != nil {
		return 12
	}
	if n, _ := strconv.Atoi(os.Getenv(EnvTakeovers)); n == 0 {
		if len(got) != 0 {
			return 13
		}
		live, err := memfd.Create("live")
		if err != nil {
			return 14
		}
		live.Grow(4096)
		mem, _ := live.Map(0, 4096)
		copy(mem, "live")
		if Send(sock, Message{Data: []byte("first"), File: live.OSFile()}) != nil ||
			Send(sock, Message{Data: []byte(strings.Repeat("x", 100<<10))}) != nil {
			return 15
		}
		return ExitHandedOver
	}
	var line []string
	for _, m := range got {
		d := string(m.Data)
		if len(d) > 10 {
			d = fmt.Sprintf("x*%d", len(d))
		}
		if m.File != nil {
			f, err := memfd.Open(int(m.File.Fd()))
			if err != nil {
				return 16
			}
			mem, _ := f.Map(0, 4096)
			d += "+" + strings.TrimRight(string(mem), "\x00")
		}
		line = append(line, d)
	}
	log, err := memfd.Open(3)
	if err != nil {
		return 17
	}
	s := strings.Join(line, " ")
	log.Grow(int64(len(s)))
	mem, _ := log.Map(0, len(s))
	copy(mem, s)
	return 0
}

// TestHandoverRelaysConnections: what a serving process sends on its
// handover socket before it exits with ExitHandedOver reaches the next,
// descriptors included, through the supervisor.
func TestHandoverRelaysConnections(t *testing.T) {
	f, exe := memfdAndSelf(t, "handover-test")
	status, err := Run(context.Background(), Config{
		Path: exe, Env: append(os.Environ(), "SUPERVISE_TEST_HANDOVER=1"),
		Files: []*memfd.File{f}, Stdout: os.Stdout, Stderr: os.Stderr, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Handover: true,
	})
	if err != nil || status != ExitStopped {
		t.Fatalf("Run: status %d, %v", status, err)
	}
	size, _ := f.Size()
	mem, err := f.Map(0, int(size))
	if err != nil {
		t.Fatal(err)
	}
	if got, want := string(mem), "first+live x*102400"; got != want {
		t.Fatalf("the second serving process received %q, want %q", got, want)
	}
}

// TestServedDeathRestartsAtOnce: a serving process that said it served
// (Ready) and died is replaced without the crash-at-start backoff.
func TestServedDeathRestartsAtOnce(t *testing.T) {
	f, exe := memfdAndSelf(t, "ready-test")
	var logs strings.Builder
	status, err := Run(context.Background(), Config{
		Path: exe, Env: append(os.Environ(), "SUPERVISE_TEST_HANDOVER=ready"),
		Files: []*memfd.File{f}, Stdout: os.Stdout, Stderr: os.Stderr,
		Logger: slog.New(slog.NewTextHandler(&logs, nil)), Handover: true,
		MinDelay: time.Hour, // a backoff would never end
	})
	if err != nil || status != ExitStopped {
		t.Fatalf("Run: status %d, %v", status, err)
	}
	if n := strings.Count(logs.String(), "in=0s"); n != 2 {
		t.Errorf("%d restarts at once, want 2:\n%s", n, logs.String())
	}
}

// memfdAndSelf returns a memfd named name, closed when the test ends, and
// this test binary's path, which the tests' serving processes run.
func memfdAndSelf(t *testing.T, name string) (*memfd.File, string) {
	t.Helper()
	f, err := memfd.Create(name)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	return f, exe
}
