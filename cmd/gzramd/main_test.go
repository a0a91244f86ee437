package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/gzramd/gzramd/pkg/metrics"
)

// gzramdBin is the daemon built once for every test.
var gzramdBin string

func TestMain(m *testing.M) {
	// A prebuilt binary lets the compiled tests run on a machine without
	// Go (the GPU machine): go test -c, go build -tags faults, then
	// GZRAMD_TEST_BINARY=... ./gzramd.test
	if p := os.Getenv("GZRAMD_TEST_BINARY"); p != "" {
		gzramdBin = p
		os.Exit(m.Run())
	}
	dir, err := os.MkdirTemp("", "gzramd-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	gzramdBin = filepath.Join(dir, "gzramd")
	// With fault injection (faults.go): the tests stand in for the
	// kernel's swap list and block devices.
	build := exec.Command("go", "build", "-tags", "faults", "-o", gzramdBin, ".")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "building gzramd:", err)
		os.RemoveAll(dir)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// syncBuffer collects a process's output while the test reads it.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// servingPID is the process that serves: the supervisor's child, or the
// daemon itself with --supervise=false.
func (d *daemonProc) servingPID() int {
	m := regexp.MustCompile(`msg="serving process started".*? pid=([0-9]+)`).FindAllStringSubmatch(d.log.String(), -1)
	if len(m) == 0 {
		return d.cmd.Process.Pid
	}
	pid, _ := strconv.Atoi(m[len(m)-1][1])
	return pid
}

// daemonProc is a gzramd serve started by a test.
type daemonProc struct {
	t       *testing.T
	cmd     *exec.Cmd
	log     *syncBuffer
	socket  string
	metrics string // host:port
	done    chan struct{}
	err     error
}

// hardeningOff keeps tests from locking the test machine's memory or
// re-executing; the hardening has its own tests.
var hardeningOff = []string{"--harden=false"}

// startDaemon runs gzramd serve with args (plus a socket in a temporary
// directory and a metrics port picked by the kernel) and waits until it is
// ready.
func startDaemon(t *testing.T, env []string, args ...string) *daemonProc {
	t.Helper()
	socket := filepath.Join(t.TempDir(), "gzramd.sock")
	cmd := exec.Command(gzramdBin, append([]string{"serve", "--socket", socket, "--metrics", "127.0.0.1:0"}, args...)...)
	cmd.Env = append(cleanEnv(), env...)
	d := runDaemon(t, cmd, socket)
	d.waitReady(20 * time.Second)
	return d
}

// runDaemon starts cmd, a gzramd serve on socket, and has the test's end
// kill it and its serving process if they still run.
func runDaemon(t *testing.T, cmd *exec.Cmd, socket string) *daemonProc {
	t.Helper()
	d := &daemonProc{t: t, cmd: cmd, log: &syncBuffer{}, socket: socket, done: make(chan struct{})}
	d.cmd.Stdout, d.cmd.Stderr = d.log, d.log
	if err := d.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		d.err = d.cmd.Wait()
		close(d.done)
	}()
	t.Cleanup(func() {
		select {
		case <-d.done:
		default:
			// Its serving process first: one whose supervisor died
			// would serve on, holding the output pipe.
			if pid := d.servingPID(); pid != d.cmd.Process.Pid {
				syscall.Kill(pid, syscall.SIGKILL)
			}
			d.cmd.Process.Kill()
			<-d.done
		}
		if t.Failed() {
			t.Logf("gzramd log (%s):\n%s", strings.Join(d.cmd.Args, " "), d.log.String())
		}
	})
	return d
}

// waitReady waits until the daemon says it is ready, and notes its
// metrics address.
func (d *daemonProc) waitReady(timeout time.Duration) {
	d.t.Helper()
	urlRE := regexp.MustCompile(`msg="serving metrics" url=http://([0-9.:]+)/metrics`)
	deadline := time.Now().Add(timeout)
	for {
		out := d.log.String()
		if strings.Contains(out, "gzramd ready") {
			if m := urlRE.FindStringSubmatch(out); m != nil {
				d.metrics = m[1]
			}
			return
		}
		select {
		case <-d.done:
			d.t.Fatalf("gzramd exited before it was ready: %v\n%s", d.err, out)
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			d.t.Fatalf("gzramd not ready after %v:\n%s", timeout, out)
		}
	}
}

// cleanEnv is the test's environment without GZRAMD_* settings, so the
// machine's own configuration cannot leak in.
func cleanEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "GZRAMD_") && !strings.HasPrefix(kv, "NOTIFY_SOCKET=") && !strings.HasPrefix(kv, "WATCHDOG_") {
			env = append(env, kv)
		}
	}
	return env
}

// stop sends sig and waits for the exit; it returns the exit status.
func (d *daemonProc) stop(sig os.Signal) int {
	d.t.Helper()
	if err := d.cmd.Process.Signal(sig); err != nil {
		d.t.Fatal(err)
	}
	return d.wait(60 * time.Second)
}

func (d *daemonProc) wait(timeout time.Duration) int {
	d.t.Helper()
	select {
	case <-d.done:
	case <-time.After(timeout):
		d.t.Fatalf("gzramd still running %v after the signal:\n%s", timeout, d.log.String())
	}
	return d.cmd.ProcessState.ExitCode()
}

func (d *daemonProc) uri() string { return "nbd+unix:///gzram0?socket=" + d.socket }

func (d *daemonProc) scrape() metrics.Families {
	d.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	f, err := metrics.Scrape(ctx, "http://"+d.metrics+"/metrics")
	if err != nil {
		d.t.Fatal(err)
	}
	return f
}

// waitLog waits until the log holds re.
func (d *daemonProc) waitLog(re string, timeout time.Duration) []string {
	d.t.Helper()
	rx := regexp.MustCompile(re)
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		if m := rx.FindStringSubmatch(d.log.String()); m != nil {
			return m
		}
		time.Sleep(20 * time.Millisecond)
	}
	d.t.Fatalf("no log line matching %q after %v:\n%s", re, timeout, d.log.String())
	return nil
}

// runClient runs a client tool with /usr/bin first on PATH, so nbdsh finds the
// system python3 and its libnbd module.
func runClient(t *testing.T, stdin io.Reader, name string, args ...string) string {
	t.Helper()
	cmd := exec.Command(name, args...)
	cmd.Env = append(cleanEnv(), "PATH=/usr/bin:/bin:"+os.Getenv("PATH"))
	cmd.Stdin = stdin
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return string(out)
}

// gzramd runs the binary to completion and returns its output and exit status.
func gzramd(t *testing.T, env []string, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	cmd := exec.Command(gzramdBin, args...)
	cmd.Env = append(cleanEnv(), env...)
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	go func() {
		<-ctx.Done()
		if cmd.Process != nil {
			cmd.Process.Kill()
		}
	}()
	err := cmd.Run()
	if err != nil {
		if _, ok := err.(*exec.ExitError); !ok {
			t.Fatal(err)
		}
	}
	return o.String(), e.String(), cmd.ProcessState.ExitCode()
}

// lines counts the non-empty lines of s.
func lines(s string) int {
	n := 0
	sc := bufio.NewScanner(strings.NewReader(s))
	for sc.Scan() {
		if strings.TrimSpace(sc.Text()) != "" {
			n++
		}
	}
	return n
}

const sigterm = syscall.SIGTERM

func fetch(ctx context.Context, url string) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	return io.ReadAll(resp.Body)
}
