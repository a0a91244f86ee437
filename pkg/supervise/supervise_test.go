package supervise

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gzramd/gzramd/internal/memfd"
	"github.com/gzramd/gzramd/internal/testneeds"
)

// TestMain plays the serving process when the supervisor starts this
// binary: SUPERVISE_TEST_CHILD says how it ends, by the takeover count.
func TestMain(m *testing.M) {
	if plan := os.Getenv("SUPERVISE_TEST_CHILD"); plan != "" {
		os.Exit(testChild(plan))
	}
	if os.Getenv("SUPERVISE_TEST_HANDOVER") != "" {
		os.Exit(handoverChild())
	}
	if path := os.Getenv("SUPERVISE_TEST_LIFELINE"); path != "" {
		os.Exit(lifelineChild(path))
	}
	if plan := os.Getenv("SUPERVISE_TEST_STANDBY"); plan != "" {
		os.Exit(standbyChild(plan))
	}
	os.Exit(m.Run())
}

// testChild ends as the plan's field for its takeover count says: "kill"
// (SIGKILL itself), "panic", "exit0", "exit1", "exit7", or "wait" (for
// SIGTERM, then exit 0; at once when started told to stop). It first appends a line to the file on fd 3:
// its takeover count, died-at and stopping variables.
func testChild(plan string) int {
	if err := FromEnv().HoldLifeline(); err != nil {
		return 8
	}
	n, _ := strconv.Atoi(os.Getenv(EnvTakeovers))
	steps := strings.Split(plan, ",")
	f, err := memfd.Open(3)
	if err != nil {
		return 9
	}
	size, _ := f.Size()
	line := fmt.Sprintf("%d %s \"%t\" %q\n", n, os.Getenv(EnvServing), os.Getenv(EnvDiedAt) != "", os.Getenv(EnvStopping))
	f.Grow(size + int64(len(line)))
	mem, _ := f.Map(0, int(size)+len(line))
	copy(mem[size:], line)
	step := steps[min(n, len(steps)-1)]
	switch step {
	case "kill":
		syscall.Kill(os.Getpid(), syscall.SIGKILL)
		time.Sleep(time.Hour)
	case "panic":
		panic("serving process panics")
	case "wait":
		if os.Getenv(EnvStopping) != "" {
			return 0 // as a serving process told to stop at its start
		}
		sigs := make(chan os.Signal, 1)
		signal.Notify(sigs, syscall.SIGTERM)
		<-sigs
		return 0
	}
	s, _ := strconv.Atoi(strings.TrimPrefix(step, "exit"))
	return s
}

func runPlan(t *testing.T, plan string, signals <-chan os.Signal, ctx context.Context) (int, []string, error) {
	return runPlanGivingUp(t, plan, signals, ctx, nil)
}

func runPlanGivingUp(t *testing.T, plan string, signals <-chan os.Signal, ctx context.Context, giveUp func(int) bool) (int, []string, error) {
	t.Helper()
	f, err := memfd.Create("supervise-test")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var logs bytes.Buffer
	status, err := Run(ctx, Config{
		Path: os.Args[0], Env: append(os.Environ(), "SUPERVISE_TEST_CHILD="+plan),
		Files: []*memfd.File{f}, Stdout: io.Discard, Stderr: io.Discard,
		Logger:  slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
		Signals: signals, MinDelay: time.Millisecond, MaxDelay: 4 * time.Millisecond,
		GiveUp: giveUp,
	})
	size, _ := f.Size()
	var lines []string
	if size > 0 {
		mem, err := f.Map(0, int(size))
		if err != nil {
			t.Fatal(err)
		}
		lines = strings.Split(strings.TrimSpace(string(mem)), "\n")
		unix.Munmap(mem)
	}
	t.Logf("supervisor's log:\n%s", logs.String())
	return status, lines, err
}

// TestRestartsUntilExit: deaths of every kind start another serving
// process, with the takeover count and when the last died; an exit of
// its own ends Run with its status (a failure, but for one that took the
// state over: TestFailedTakeoverIsRetried).
func TestRestartsUntilExit(t *testing.T) {
	status, lines, err := runPlan(t, "kill,panic,exit7,exit0", nil, context.Background())
	if err != nil || status != ExitStopped {
		t.Fatalf("Run: status %d, %v; want %d", status, err, ExitStopped)
	}
	want := []string{`0 1 "false" ""`, `1 1 "true" ""`, `2 1 "true" ""`, `3 1 "true" ""`}
	if strings.Join(lines, "|") != strings.Join(want, "|") {
		t.Fatalf("serving processes saw\n%s\nwant\n%s", strings.Join(lines, "\n"), strings.Join(want, "\n"))
	}
	if status, _, err := runPlan(t, "exit0", nil, context.Background()); status != ExitStopped || err != nil {
		t.Fatalf("a process that stops: status %d, %v", status, err)
	}
	// The first, which took nothing over, fails: nothing is lost by
	// ending there.
	if status, lines, err := runPlan(t, "exit1", nil, context.Background()); status != ExitFailed || err != nil || len(lines) != 1 {
		t.Fatalf("a first process that fails: status %d, %v, %d processes", status, err, len(lines))
	}
	status, lines, err = runPlanGivingUp(t, "panic", nil, context.Background(), func(n int) bool { return n >= 3 })
	if err == nil || status != ExitFailed || len(lines) != 3 {
		t.Fatalf("giving up after 3 deaths: status %d, %v, %d processes", status, err, len(lines))
	}
}

// TestFailedTakeoverIsRetried: a serving process that took the state over
// from one that died, and failed before it served (as one whose listen
// is refused while the dead one's teardown still holds its listeners:
// issue 35's cold takeovers on the GPU), does not end Run, which would
// drop the state and what it holds: another takes it over, after the
// backoff of a death at start, told when the first died; GiveUp decides
// how many such failures are enough. A stop asked for meanwhile still
// ends it.
func TestFailedTakeoverIsRetried(t *testing.T) {
	status, lines, err := runPlan(t, "kill,exit1,exit1,exit0", nil, context.Background())
	if err != nil || status != ExitStopped {
		t.Fatalf("Run: status %d, %v; want %d, the last one's", status, err, ExitStopped)
	}
	want := []string{`0 1 "false" ""`, `1 1 "true" ""`, `2 1 "true" ""`, `3 1 "true" ""`}
	if strings.Join(lines, "|") != strings.Join(want, "|") {
		t.Fatalf("serving processes saw\n%s\nwant\n%s", strings.Join(lines, "\n"), strings.Join(want, "\n"))
	}
	// The death at start counts with the failures that follow it.
	status, lines, err = runPlanGivingUp(t, "kill,exit1", nil, context.Background(), func(n int) bool { return n >= 3 })
	if err == nil || status != ExitFailed || len(lines) != 3 {
		t.Fatalf("giving up after a death and 2 failed takeovers: status %d, %v, %d processes", status, err, len(lines))
	}
}

// TestStopIsForwardedAndSurvivesADeath: a stop asked for reaches the
// serving process; one that dies meanwhile is replaced by one told to
// stop.
func TestStopIsForwardedAndSurvivesADeath(t *testing.T) {
	sigs := make(chan os.Signal, 1)
	var once sync.Once
	go func() {
		time.Sleep(100 * time.Millisecond)
		once.Do(func() { sigs <- syscall.SIGTERM })
	}()
	// The first waits for the signal... and exits 0.
	status, lines, err := runPlan(t, "wait", sigs, context.Background())
	if err != nil || status != ExitStopped || !stoppedOnce(lines) {
		t.Fatalf("Run: status %d, %v, %q", status, err, lines)
	}
	// Stopped by the context while the first is dying: the next one is
	// told to stop.
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		time.Sleep(50 * time.Millisecond)
		cancel()
	}()
	status, lines, err = runPlan(t, "wait,exit0", nil, ctx)
	if err != nil || status != ExitStopped || !stoppedOnce(lines) {
		t.Fatalf("cancelled Run: status %d, %v, %q", status, err, lines)
	}
	// With ctx done already, the first is sent SIGTERM at once (dying of
	// it if that comes before its handler), and the next is told to stop.
	status, lines, err = runPlan(t, "kill,exit0", nil, ctx)
	if err != nil || status != ExitStopped || len(lines) == 0 || !strings.HasSuffix(lines[len(lines)-1], `"1"`) {
		t.Fatalf("Run after a stop: status %d, %v, %q", status, err, lines)
	}
}

// stoppedOnce reports whether the serving processes' lines show one
// asked to stop, or, where the stop came before the first had set up its
// handler and killed it, a second one started told to stop.
func stoppedOnce(lines []string) bool {
	switch len(lines) {
	case 1:
		return true
	case 2:
		return strings.HasSuffix(lines[1], `"1"`)
	}
	return false
}

// TestKeeperLocksWhatTheFileHolds locks the written runs of a sparse file
// and allocates nothing for its holes.
func TestKeeperLocksWhatTheFileHolds(t *testing.T) {
	f, err := memfd.Create("keeper-test")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	const size = 64 << 20
	if err := f.Grow(size); err != nil {
		t.Fatal(err)
	}
	mem, err := f.Map(0, size)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(mem)
	for _, off := range []int{0, 4096, 10 << 20, size - 4096} {
		mem[off] = 1
	}
	k := NewKeeper([]*memfd.File{f})
	defer k.Close()
	held, err := k.Lock()
	if err != nil {
		testneeds.MlockRefused(t, err, "mlock")
	}
	if held != 4*4096 {
		t.Fatalf("locked %d bytes, want 4 pages", held)
	}
	var n int64
	f.Extents(func(_, m int64) bool { n += m; return true })
	if n != 4*4096 {
		t.Fatalf("after locking, the file holds %d bytes, want 4 pages", n)
	}
}
