package supervise

import (
	"bufio"
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gzramd/gzramd/internal/testneeds"
)

// lifelineChild holds its lifeline, listens on path, says so on stdout
// and waits; with SUPERVISE_TEST_EXIT set it exits 3 instead.
func lifelineChild(path string) int {
	if err := FromEnv().HoldLifeline(); err != nil {
		return 8
	}
	if os.Getenv("SUPERVISE_TEST_EXIT") != "" {
		return ExitHandedOver
	}
	l, err := net.Listen("unix", path)
	if err != nil {
		return 9
	}
	defer l.Close()
	os.Stdout.WriteString("listening\n")
	time.Sleep(time.Hour)
	return 0
}

// startLifelineChild starts lifelineChild with a lifeline and the child's
// ends of two socket pairs as descriptors 4 and 5; the test keeps its
// copy of the second. It returns the child, unwaited for, and the
// test's ends of the pairs.
func startLifelineChild(t *testing.T, env ...string) (*exec.Cmd, *lifeline, dying, [2]net.Conn) {
	t.Helper()
	life, err := newLifeline()
	if err != nil {
		t.Fatal(err)
	}
	var peers [2]net.Conn
	var childEnds [2]*os.File
	for i := range peers {
		fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			t.Fatal(err)
		}
		childEnds[i] = os.NewFile(uintptr(fds[0]), "child")
		f := os.NewFile(uintptr(fds[1]), "peer")
		if peers[i], err = net.FileConn(f); err != nil {
			t.Fatal(err)
		}
		f.Close()
		t.Cleanup(func() { peers[i].Close() })
	}
	sock := filepath.Join(t.TempDir(), "s")
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), append(env, "SUPERVISE_TEST_LIFELINE="+sock, EnvLifeline+"=3")...)
	cmd.ExtraFiles = []*os.File{life.file.OSFile(), childEnds[0], childEnds[1]}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	childEnds[0].Close()
	t.Cleanup(func() { childEnds[1].Close() })
	pidfd, err := unix.PidfdOpen(cmd.Process.Pid, 0)
	if err != nil {
		cmd.Process.Kill()
		cmd.Wait()
		testneeds.Machine(t, "pidfd_open, which this kernel lacks (Linux 5.3 has it): %v", err)
	}
	t.Cleanup(func() { unix.Close(pidfd) })
	life.started()
	t.Cleanup(life.close)
	if len(env) == 0 {
		if line, err := bufio.NewReader(out).ReadString('\n'); err != nil || line != "listening\n" {
			t.Fatalf("child said %q, %v", line, err)
		}
	}
	return cmd, life, dying{pid: cmd.Process.Pid, pidfd: pidfd, buf: newScratch()[:dyingBuf]}, peers
}

// TestLifelineHearsADeathBeforeWait: a serving process killed is heard
// dying, with the signal it died of, while it is not yet waited for.
func TestLifelineHearsADeathBeforeWait(t *testing.T) {
	cmd, life, d, _ := startLifelineChild(t)
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-life.died:
	case <-time.After(30 * time.Second):
		t.Fatal("the lifeline did not hear the death")
	}
	ws, ok := d.end(30 * time.Second)
	if a := testing.AllocsPerRun(10, func() { d.end(time.Second) }); a != 0 {
		t.Errorf("end allocates %v times", a)
	}
	if !ok || !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
		t.Fatalf("end: %v (%v), want killed by SIGKILL", describeExit(ws, nil), ok)
	}
	if _, died := exitOf(ws, nil); !died {
		t.Fatal("a SIGKILL is not a death")
	}
	if !d.unreaped() {
		t.Fatal("reaped, though not waited for")
	}
	err := cmd.Wait()
	if ws, ok := waitStatus(cmd.ProcessState, err); !ok || !ws.Signaled() {
		t.Fatalf("wait: %v", err)
	}
	if d.unreaped() {
		t.Fatal("unreaped after wait")
	}
}

// TestShutSockets: the sockets of a process (stopped here, as a dying one
// is past running) are shut: a connection's peer reads its end, a
// listener refuses; those the supervisor holds too are left alone.
func TestShutSockets(t *testing.T) {
	cmd, _, d, peers := startLifelineChild(t)
	defer func() {
		cmd.Process.Kill()
		cmd.Wait()
	}()
	sock := ""
	for _, kv := range cmd.Env {
		if v, ok := strings.CutPrefix(kv, "SUPERVISE_TEST_LIFELINE="); ok {
			sock = v
		}
	}
	if err := cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	n, err := d.shutSockets(-1)
	if errors.Is(err, syscall.EPERM) {
		testneeds.Machine(t, "pidfd_getfd of a child, refused here (Yama's ptrace_scope above 1?): %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	if n < 2 {
		t.Fatalf("shut %d sockets, want the listener and the connection at least", n)
	}
	// At a death nothing may be allocated: a page faulted in then may wait
	// for reclaim that waits for the device the dead process served.
	if a := testing.AllocsPerRun(10, func() { d.shutSockets(-1) }); a != 0 {
		t.Errorf("shutSockets allocates %v times", a)
	}
	if a := testing.AllocsPerRun(10, func() { d.threadsGone() }); a != 0 {
		t.Errorf("threadsGone allocates %v times", a)
	}
	peers[0].SetReadDeadline(time.Now().Add(30 * time.Second))
	if _, err := peers[0].Read(make([]byte, 1)); err == nil {
		t.Fatal("the process's connection did not end")
	}
	peers[1].SetReadDeadline(time.Now().Add(50 * time.Millisecond))
	if _, err := peers[1].Read(make([]byte, 1)); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("a socket the supervisor holds too was shut: %v", err)
	}
	if _, err := net.Dial("unix", sock); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("dialing the process's listener: %v, want connection refused", err)
	}
}

// TestLifelineTellsAnExitOfItsOwn: a process that exits on its own is
// heard too, with its status, which is no death.
func TestLifelineTellsAnExitOfItsOwn(t *testing.T) {
	cmd, life, d, _ := startLifelineChild(t, "SUPERVISE_TEST_EXIT=1")
	select {
	case <-life.died:
	case <-time.After(30 * time.Second):
		t.Fatal("the lifeline did not hear the exit")
	}
	ws, ok := d.end(30 * time.Second)
	if !ok || ws.Signaled() || ws.ExitStatus() != ExitHandedOver {
		t.Fatalf("end: %v (%v), want exit status %d", describeExit(ws, nil), ok, ExitHandedOver)
	}
	if _, died := exitOf(ws, nil); died {
		t.Fatal("an exit of its own is a death")
	}
	cmd.Wait()
}

func TestExitCodeOfStat(t *testing.T) {
	fields := "S 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25 26 27 28 29 30 31 32 33 34 35 36 37 38 39 40 41 42 43 44 45 46 47 48 "
	for _, c := range []struct {
		stat string
		code int
	}{
		{"42 (gzramd) " + fields + "9", 9},
		{"42 (a) (b) c) " + fields + "768", 768},
	} {
		code, ok := exitCodeOfStat([]byte(c.stat))
		if !ok || code != c.code {
			t.Errorf("exitCodeOfStat(%q) = %d, %v; want %d", c.stat, code, ok, c.code)
		}
	}
	if _, ok := exitCodeOfStat([]byte("42 (gzramd) S 1 2")); ok {
		t.Error("a short stat line parsed")
	}
}
