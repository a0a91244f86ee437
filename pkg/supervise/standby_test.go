package supervise

import (
	"context"
	"log/slog"
	"os"
	"os/signal"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/gzramd/gzramd/internal/memfd"
)

// standbyChild plays a serving process that serves until SIGINT or
// SIGTERM, and its standby, which waits to take over, as gzramd's does,
// with no handler for either signal. With plan "crash" the standby
// SIGKILLs itself as it starts.
func standbyChild(plan string) int {
	start := FromEnv()
	sock, ok := start.HandoverSocket()
	if !ok {
		return 11
	}
	if start.Standby {
		if plan == "crash" {
			syscall.Kill(os.Getpid(), syscall.SIGKILL)
		}
		if _, err := Receive(sock, 0); err != nil {
			return 12
		}
		return 0 // released: it takes over, and this test wants none
	}
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	if _, err := Receive(sock, 5*time.Second); err != nil || Ready(sock) != nil {
		return 12
	}
	if FromEnv().Stopping {
		return 0
	}
	<-sigs
	return 0
}

// TestStandbyStoppedOnPurposeIsNoWarning: a terminal's ^C kills the
// standby (which has no handler) as the supervisor is asked to stop, and
// its death may be heard first; that is no warning. A standby that dies
// while no stop comes is one.
func TestStandbyStoppedOnPurposeIsNoWarning(t *testing.T) {
	defer func(g time.Duration) { stopGrace = g }(stopGrace)
	stopGrace = 500 * time.Millisecond
	const warning = "level=WARN msg=\"the standby serving process ended"
	for _, tc := range []struct {
		name, plan string
		kill       syscall.Signal // sent to the standby, 0 for none
		stop       bool           // a stop asked for after the kill
		warn       bool
	}{
		{"^C", "wait", syscall.SIGINT, true, false},
		{"SIGTERM to every process", "wait", syscall.SIGTERM, true, false},
		{"SIGINT to the standby alone", "wait", syscall.SIGINT, false, true},
		{"crash", "crash", 0, false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f, exe := memfdAndSelf(t, "standby-test")
			logs := &logLines{}
			sigs := make(chan os.Signal, 1)
			type result struct {
				status int
				err    error
			}
			done := make(chan result, 1)
			go func() {
				status, err := Run(context.Background(), Config{
					Path: exe, Env: append(os.Environ(), "SUPERVISE_TEST_STANDBY="+tc.plan),
					Files: []*memfd.File{f}, Stdout: os.Stdout, Stderr: os.Stderr,
					Logger:  slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
					Signals: sigs, Handover: true, Standby: true, StandbyAfter: 10 * time.Millisecond,
				})
				done <- result{status, err}
			}()
			started := logs.waitFor(t, "standby serving process started")
			pid, _ := strconv.Atoi(regexp.MustCompile(` pid=(\d+)`).FindStringSubmatch(started)[1])
			if tc.kill != 0 {
				// Once the standby is dead and reaped: its death is
				// heard before the stop, the order that once warned.
				syscall.Kill(pid, tc.kill)
				for syscall.Kill(pid, 0) == nil {
					time.Sleep(5 * time.Millisecond)
				}
				time.Sleep(50 * time.Millisecond)
			}
			if tc.warn {
				logs.waitFor(t, warning)
			}
			sigs <- syscall.SIGTERM
			r := <-done
			if r.err != nil || r.status != ExitStopped {
				t.Fatalf("Run: status %d, %v", r.status, r.err)
			}
			if got := strings.Contains(logs.String(), warning); got != tc.warn {
				t.Errorf("warned of the standby's end: %t, want %t; the log:\n%s", got, tc.warn, logs)
			}
			if !tc.warn && !strings.Contains(logs.String(), "ended with the stop") {
				t.Errorf("the standby's end not logged; the log:\n%s", logs)
			}
		})
	}
}

// logLines is a log a test waits on.
type logLines struct {
	mu  sync.Mutex
	buf strings.Builder
}

func (l *logLines) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

func (l *logLines) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

// waitFor returns the first line that holds s, once there is one.
func (l *logLines) waitFor(t *testing.T, s string) string {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		for line := range strings.Lines(l.String()) {
			if strings.Contains(line, s) {
				return line
			}
		}
	}
	t.Fatalf("no %q in the log:\n%s", s, l)
	return ""
}
