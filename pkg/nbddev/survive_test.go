package nbddev

import (
	"bufio"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/gzramd/gzramd/internal/testneeds"
	"github.com/gzramd/gzramd/pkg/nbd"
	"github.com/gzramd/gzramd/pkg/swapsafe"
)

// TestKernelSurviveLive kills the process serving a kernel /dev/nbdN with
// SIGKILL, again and again, while I/O is in flight, and has a new process
// take the device over with Reattach, as a supervisor restarting
// gzramd would. The data lives in a memfd that outlives the servers (as
// gzramd's store would have to). It runs where NBD_SURVIVE is set
// (testdata/kernelvm.sh survive sets it in a QEMU guest):
//
//	NBD_SURVIVE=block  workers write, read back and verify, trim, zero and
//	                   flush through O_DIRECT while the servers die; every
//	                   I/O must succeed, every read must verify, and every
//	                   request in flight at a kill must complete within the
//	                   request timeout and a restart's slack
//	NBD_SURVIVE=swap   the device is swap under the e2e hog (NBD_SWAP_HOG),
//	                   each new server started, locked in memory and
//	                   connected (PrepareReattach) before the old one dies,
//	                   taking over as soon as the kernel finds the old
//	                   sockets dead (a warm standby); the hog must verify
//
// NBD_SURVIVE_KILLS (20), NBD_SURVIVE_TIMEOUT (seconds; the package
// default), NBD_SURVIVE_CONNS (2) and NBD_SURVIVE_STANDBY=1 (block: start
// each server before the kill) change the run; NBD_SURVIVE_CONTROL makes
// it a negative control that must fail: no-dead-timeout (the device fails
// I/O while its server is away), no-timeout (requests in flight at a kill
// wait for the kernel's 30-second check) or no-reconnect (the new server
// never hands the kernel sockets). It prints SURVIVE-KILL and
// SURVIVE-STATS lines for the measurements.
func TestKernelSurviveLive(t *testing.T) {
	mode := testneeds.Env(t, "NBD_SURVIVE", "kills and restarts the server under a real /dev/nbdN; pkg/nbddev/testdata/kernelvm.sh survive runs it in a VM")
	needKernelNBD(t)
	cfg := surviveConfig{
		mode: mode, kills: envInt(t, "NBD_SURVIVE_KILLS", 20), conns: envInt(t, "NBD_SURVIVE_CONNS", 2),
		timeout: DefaultTimeout, deadConn: DefaultDeadConnTimeout,
		control: os.Getenv("NBD_SURVIVE_CONTROL"), standby: os.Getenv("NBD_SURVIVE_STANDBY") == "1" || mode == "swap",
		size: 64 << 20,
	}
	if s := os.Getenv("NBD_SURVIVE_TIMEOUT"); s != "" {
		cfg.timeout = time.Duration(envInt(t, "NBD_SURVIVE_TIMEOUT", 0)) * time.Second
	}
	switch cfg.control {
	case "":
	case "no-dead-timeout":
		cfg.deadConn = -1
	case "no-timeout":
		cfg.timeout = -1
	case "no-reconnect":
		// Long enough to see that nothing comes, short enough to end.
		cfg.deadConn = 5 * time.Second
	default:
		t.Fatalf("NBD_SURVIVE_CONTROL=%q: want no-dead-timeout, no-timeout or no-reconnect", cfg.control)
	}
	switch mode {
	case "block":
	case "swap":
		if os.Getenv("NBD_SWAP_HOG") == "" {
			t.Fatal("NBD_SURVIVE=swap needs NBD_SWAP_HOG")
		}
		cfg.size = int64(envInt(t, "NBD_SURVIVE_SWAP_MIB", 384)) << 20
		// Swap-out to a device whose server is being restarted waits;
		// this process must not wait with it.
		if err := unix.Mlockall(unix.MCL_CURRENT | unix.MCL_FUTURE); err != nil {
			t.Fatalf("mlockall: %v", err)
		}
	default:
		t.Fatalf("NBD_SURVIVE=%q: want block or swap", mode)
	}
	t.Logf("mode %s, %d kills, %d connections, request timeout %v, dead-connection timeout %v, standby %v, control %q",
		mode, cfg.kills, cfg.conns, cfg.timeout, cfg.deadConn, cfg.standby, cfg.control)
	s := newSurvival(t, cfg)
	if mode == "block" {
		s.runBlock()
	} else {
		s.runSwap()
	}
}

type surviveConfig struct {
	mode              string
	kills, conns      int
	timeout, deadConn time.Duration
	control           string
	standby           bool
	size              int64
}

func envInt(t *testing.T, name string, def int) int {
	s := os.Getenv(name)
	if s == "" {
		return def
	}
	n, err := strconv.Atoi(s)
	if err != nil {
		t.Fatalf("%s=%q: %v", name, s, err)
	}
	return n
}

// mono is CLOCK_MONOTONIC in nanoseconds: the same clock in every process.
func mono() int64 {
	var ts unix.Timespec
	unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts)
	return ts.Nano()
}

// surviveChild is a server process's configuration, passed as JSON in
// surviveServeEnv. Its files: 3 the memfd, 4 the listener, 5 the status
// pipe.
type surviveChild struct {
	Sock     string
	Size     int64
	ID       string
	Conns    int
	Timeout  time.Duration
	DeadConn time.Duration
	First    bool
	Control  string
	Lock     bool
	Standby  bool
	// Active is the pid of the server a standby takes over from: it
	// waits for its end before handing the kernel sockets, rather than
	// fill a connection the kernel gave up on while the old server still
	// serves the others (two servers at once).
	Active int
}

const surviveServeEnv = "NBD_SURVIVE_SERVE"

// survival is one run of TestKernelSurviveLive.
type survival struct {
	t    *testing.T
	cfg  surviveConfig
	id   string
	sock string
	memf *os.File
	lnf  *os.File
	kmsg int // /dev/kmsg, read with read(2): os.File would park a
	// non-blocking read that finds nothing in the poller for good
	index int
	cur   *server
}

// server is one server process.
type server struct {
	cmd    *exec.Cmd
	events chan []string
	done   chan struct{}
}

func newSurvival(t *testing.T, cfg surviveConfig) *survival {
	s := &survival{t: t, cfg: cfg, index: -1,
		id: fmt.Sprintf("nbd-survive-%d-%d", os.Getpid(), time.Now().UnixNano())}
	fd, err := unix.MemfdCreate("nbd-survive", unix.MFD_CLOEXEC)
	if err != nil {
		t.Fatalf("memfd_create: %v", err)
	}
	s.memf = os.NewFile(uintptr(fd), "memfd")
	t.Cleanup(func() { s.memf.Close() })
	if err := s.memf.Truncate(cfg.size); err != nil {
		t.Fatal(err)
	}
	// The data must stay in RAM: swapped out to the device it backs, it
	// would wait for a server that needs it to serve.
	mem, err := unix.Mmap(fd, 0, int(cfg.size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		t.Fatalf("mmap memfd: %v", err)
	}
	t.Cleanup(func() { unix.Munmap(mem) })
	if err := unix.Mlock(mem); err != nil {
		t.Fatalf("mlock memfd: %v", err)
	}
	// One listener for every server, as systemd's socket activation
	// would keep it: connections made while no server runs wait in it.
	s.sock = filepath.Join(t.TempDir(), "survive.sock")
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: s.sock, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	if s.lnf, err = ln.File(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.lnf.Close() })
	if s.kmsg, err = unix.Open("/dev/kmsg", unix.O_RDONLY|unix.O_NONBLOCK|unix.O_CLOEXEC, 0); err != nil {
		t.Fatalf("opening /dev/kmsg: %v", err)
	}
	t.Cleanup(func() { unix.Close(s.kmsg) })
	if _, err := unix.Seek(s.kmsg, 0, io.SeekEnd); err != nil {
		t.Fatalf("seeking /dev/kmsg: %v", err)
	}
	t.Cleanup(s.cleanup)
	return s
}

// cleanup disconnects the device and kills the last server, whatever
// state a failed run left them in.
func (s *survival) cleanup() {
	if s.index >= 0 {
		if err := netlinkDisconnect(s.index); err != nil {
			s.t.Errorf("disconnecting /dev/nbd%d: %v", s.index, err)
		}
	}
	if s.cur != nil {
		s.cur.kill()
	}
}

func (p *server) kill() {
	p.cmd.Process.Signal(syscall.SIGKILL)
	<-p.done
}

// start starts a server process; first attaches the device, the others
// take it over (a standby as soon as the kernel lets it).
func (s *survival) start(first, standby bool) *server {
	s.t.Helper()
	active := 0
	if standby {
		active = s.cur.cmd.Process.Pid
	}
	cfg, err := json.Marshal(surviveChild{Sock: s.sock, Size: s.cfg.size, ID: s.id, Conns: s.cfg.conns,
		Timeout: s.cfg.timeout, DeadConn: s.cfg.deadConn, First: first, Control: s.cfg.control,
		Lock: s.cfg.mode == "swap", Standby: standby, Active: active})
	if err != nil {
		s.t.Fatal(err)
	}
	exe, err := os.Executable()
	if err != nil {
		s.t.Fatal(err)
	}
	pr, pw, err := os.Pipe()
	if err != nil {
		s.t.Fatal(err)
	}
	p := &server{cmd: exec.Command(exe), events: make(chan []string, 16), done: make(chan struct{})}
	p.cmd.Env = append(os.Environ(), surviveServeEnv+"="+string(cfg))
	p.cmd.ExtraFiles = []*os.File{s.memf, s.lnf, pw}
	p.cmd.Stdout, p.cmd.Stderr = os.Stderr, os.Stderr
	if err := p.cmd.Start(); err != nil {
		s.t.Fatalf("starting a server: %v", err)
	}
	pw.Close()
	go func() {
		sc := bufio.NewScanner(pr)
		for sc.Scan() {
			ev := strings.Fields(sc.Text())
			if len(ev) > 0 && ev[0] == "note" {
				fmt.Printf("SURVIVE-NOTE server %d: %s\n", p.cmd.Process.Pid, strings.Join(ev[1:], " "))
				continue
			}
			p.events <- ev
		}
		pr.Close()
		close(p.events)
	}()
	go func() {
		p.cmd.Wait()
		close(p.done)
	}()
	return p
}

// await returns the fields of the server's next status line, which must
// start with want.
func (p *server) await(want string, limit time.Duration) ([]string, error) {
	select {
	case ev, ok := <-p.events:
		if !ok {
			return nil, fmt.Errorf("server exited before saying %q", want)
		}
		if len(ev) == 0 || ev[0] != want {
			return nil, fmt.Errorf("server said %q, want %q", ev, want)
		}
		return ev, nil
	case <-time.After(limit):
		return nil, fmt.Errorf("server did not say %q within %v", want, limit)
	}
}

func atoi64(s string) int64 {
	n, _ := strconv.ParseInt(s, 10, 64)
	return n
}

// killRecord is one kill and its takeover.
type killRecord struct {
	// CLOCK_MONOTONIC ns: the kill sent, the server reaped, the new one
	// holding the device, its first request served.
	kill, dead, reattached, served int64
	tries                          int
	// probed is when a read issued just after the kill completed.
	probed int64
	// inflight is /sys/block/nbdN/inflight just before the kill: the
	// requests the kernel had handed the device and not seen complete.
	inflight string
}

// takeover kills the current server and brings up the next: started after
// the kill (a cold restart), or before it, connected and waiting for the
// kernel to find the old server's sockets dead (a warm standby).
func (s *survival) takeover() (killRecord, error) {
	var next *server
	if s.cfg.standby {
		next = s.start(false, true)
		if _, err := next.await("standby", 2*time.Minute); err != nil {
			next.kill()
			return killRecord{}, err
		}
	}
	var r killRecord
	if b, err := os.ReadFile(filepath.Join(DefaultSysBlock, "nbd"+strconv.Itoa(s.index), "inflight")); err == nil {
		r.inflight = strings.Join(strings.Fields(string(b)), "/")
	}
	r.kill = mono()
	s.cur.kill()
	r.dead = mono()
	probe := s.probe()
	if next == nil {
		next = s.start(false, false)
	}
	s.cur = next
	// The first request may be served before the server says it has
	// reattached: the kernel sends as soon as it has the sockets.
	deadline := time.After(max(s.cfg.deadConn, 0) + 20*time.Second)
	for r.reattached == 0 || r.served == 0 {
		select {
		case ev, ok := <-next.events:
			switch {
			case !ok:
				return r, errors.New("server exited before serving")
			case len(ev) == 4 && ev[0] == "reattached":
				r.tries = int(atoi64(ev[2]))
				r.reattached = atoi64(ev[3])
			case len(ev) == 2 && ev[0] == "served":
				r.served = atoi64(ev[1])
			default:
				return r, fmt.Errorf("server said %q", ev)
			}
		case <-deadline:
			// Nothing is served before the kernel has a socket:
			// bounded by the dead-connection timeout, after which
			// the I/O fails.
			return r, fmt.Errorf("server did not reattach and serve within the dead-connection timeout and 20 s (reattached %v, served %v)", r.reattached != 0, r.served != 0)
		}
	}
	select {
	case res := <-probe:
		if res.err != nil {
			return r, fmt.Errorf("a read issued after the kill: %w", res.err)
		}
		r.probed = res.end
	case <-deadline:
		return r, errors.New("a read issued after the kill did not complete")
	}
	return r, nil
}

type probeResult struct {
	end int64
	err error
}

// probe reads the device's first page, as a request that arrives while
// the server is away (a swap-in, say) would.
func (s *survival) probe() <-chan probeResult {
	c := make(chan probeResult, 1)
	go func() {
		f, err := os.OpenFile(devicePath(s.index), os.O_RDONLY|unix.O_DIRECT, 0)
		if err != nil {
			c <- probeResult{err: err}
			return
		}
		defer f.Close()
		_, err = f.ReadAt(alignedBuf(pageSize), 0)
		c <- probeResult{end: mono(), err: err}
	}()
	return c
}

// firstServer starts the server that attaches the device.
func (s *survival) firstServer() {
	s.cur = s.start(true, false)
	ev, err := s.cur.await("attached", time.Minute)
	if err != nil {
		s.t.Fatal(err)
	}
	s.index = int(atoi64(ev[1]))
	s.t.Logf("attached /dev/nbd%d", s.index)
}

// runBlock is NBD_SURVIVE=block.
func (s *survival) runBlock() {
	t := s.t
	s.firstServer()
	f, err := os.OpenFile(devicePath(s.index), os.O_RDWR|unix.O_DIRECT, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	const workers, regionPages = 4, 1024 // 4 MiB each
	var stop atomic.Bool
	ws := make([]*ioWorker, workers)
	var wg sync.WaitGroup
	for i := range ws {
		ws[i] = &ioWorker{id: i, f: f, base: int64(i) * regionPages * pageSize, gen: make([]uint32, regionPages),
			rng: rand.New(rand.NewPCG(uint64(i), uint64(time.Now().UnixNano())))}
		wg.Add(1)
		go func() {
			defer wg.Done()
			ws[i].run(&stop)
		}()
	}
	stopAll := func() {
		stop.Store(true)
		wg.Wait()
	}
	var kills []killRecord
	rng := rand.New(rand.NewPCG(1, uint64(time.Now().UnixNano())))
	for k := 0; k < s.cfg.kills; k++ {
		time.Sleep(time.Duration(200+rng.IntN(400)) * time.Millisecond)
		if slices.ContainsFunc(ws, func(w *ioWorker) bool { return w.stopped.Load() }) {
			break // a worker failed
		}
		r, err := s.takeover()
		if err != nil {
			t.Errorf("kill %d: %v", k+1, err)
			break
		}
		kills = append(kills, r)
		// Each kill on its own: the I/O the kill interrupted completes
		// (or fails) before the next.
		interrupted := func(w *ioWorker) bool { return w.lastStart.Load() < r.dead && !w.stopped.Load() }
		limit := time.Now().Add(max(s.cfg.timeout, 30*time.Second) + surviveSlack)
		for slices.ContainsFunc(ws, interrupted) && time.Now().Before(limit) {
			time.Sleep(20 * time.Millisecond)
		}
		if slices.ContainsFunc(ws, interrupted) {
			t.Errorf("kill %d: I/O in flight at the kill still not done", k+1)
			break
		}
	}
	time.Sleep(300 * time.Millisecond)
	stopAll()
	for _, w := range ws {
		if w.err != nil {
			t.Errorf("worker %d: %v", w.id, w.err)
		}
	}
	if !t.Failed() {
		for _, w := range ws {
			if err := w.verifyAll(); err != nil {
				t.Errorf("final verification, worker %d: %v", w.id, err)
			}
		}
	}
	var ops []ioOp
	var counts [opKinds]int
	for _, w := range ws {
		ops = append(ops, w.ops...)
		for _, o := range w.ops {
			counts[o.kind]++
		}
	}
	t.Logf("I/O: %d writes, %d reads, %d trims, %d zeroings, %d flushes", counts[opWrite], counts[opRead], counts[opTrim], counts[opZero], counts[opFlush])
	s.report(kills, ops)
	s.checkKernelLog()
}

// report logs each kill and the statistics, and fails the test when a
// request in flight at a kill took longer than the request timeout and a
// restart's slack.
func (s *survival) report(kills []killRecord, ops []ioOp) {
	t := s.t
	var restart, served, probed, stalls []time.Duration
	inflightKills := 0
	bound := max(s.cfg.timeout, 0) + surviveSlack
	for i, k := range kills {
		var stall time.Duration
		inflight := 0
		for _, o := range ops {
			if o.start < k.dead && o.end > k.kill {
				inflight++
				stall = max(stall, time.Duration(o.end-k.kill))
			}
		}
		if inflight > 0 {
			inflightKills++
			stalls = append(stalls, stall)
		}
		restart = append(restart, time.Duration(k.reattached-k.kill))
		served = append(served, time.Duration(k.served-k.kill))
		probed = append(probed, time.Duration(k.probed-k.kill))
		fmt.Printf("SURVIVE-KILL %d: kernel requests in flight (reads/writes) %s; reattached %v (%d NBD_CMD_RECONFIGURE), first request served %v, a read issued after the kill done %v, %d of the test's I/O in flight done %v after the kill\n",
			i+1, k.inflight, restart[i].Round(time.Millisecond), k.tries, served[i].Round(time.Millisecond), probed[i].Round(time.Millisecond), inflight, stall.Round(time.Millisecond))
		if probed[i] > surviveSlack {
			t.Errorf("kill %d: a read issued after the kill took %v: it should wait only for the new server", i+1, probed[i].Round(time.Millisecond))
		}
		if stall > bound {
			t.Errorf("kill %d: I/O in flight completed %v after the kill, more than the request timeout and %v of slack", i+1, stall.Round(time.Millisecond), surviveSlack)
		}
	}
	// The slowest I/O that no kill interrupted: what a request timeout
	// must stay clear of.
	var worst time.Duration
	for _, o := range ops {
		if !slices.ContainsFunc(kills, func(k killRecord) bool { return o.start < k.dead && o.end > k.kill }) {
			worst = max(worst, time.Duration(o.end-o.start))
		}
	}
	fmt.Printf("SURVIVE-STATS %s kills=%d timeout=%v reattach(median/max)=%v/%v first-served(median/max)=%v/%v read-after-kill(median/max)=%v/%v kills-with-io-in-flight=%d in-flight-done(median/max)=%v/%v slowest-uninterrupted-io=%v\n",
		s.cfg.mode, len(kills), s.cfg.timeout, median(restart), maxOf(restart), median(served), maxOf(served),
		median(probed), maxOf(probed), inflightKills, median(stalls), maxOf(stalls), worst.Round(time.Millisecond))
	if len(kills) < s.cfg.kills {
		t.Errorf("%d kills of %d", len(kills), s.cfg.kills)
	}
}

// surviveSlack is how much longer than the request timeout a request in
// flight at a kill may take: the new server's start under QEMU's
// emulation, the kernel's timer granularity and the re-send.
const surviveSlack = 10 * time.Second

func median(ds []time.Duration) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2].Round(time.Millisecond)
}

func maxOf(ds []time.Duration) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	return slices.Max(ds).Round(time.Millisecond)
}

// checkKernelLog fails the test on any I/O error the kernel logged during
// it, and logs its nbd messages.
func (s *survival) checkKernelLog() {
	t := s.t
	buf := make([]byte, 8192)
	counts := map[string]int{}
	for {
		n, err := unix.Read(s.kmsg, buf)
		if errors.Is(err, syscall.EAGAIN) {
			break
		}
		if errors.Is(err, syscall.EPIPE) {
			continue // overwritten records
		}
		if err != nil {
			t.Errorf("reading /dev/kmsg: %v", err)
			return
		}
		rec := string(buf[:n])
		_, msg, _ := strings.Cut(rec, ";")
		msg, _, _ = strings.Cut(msg, "\n")
		for _, bad := range []string{"I/O error", "Read-error", "Write-error", "critical", "shutting down sockets"} {
			if strings.Contains(msg, bad) {
				t.Errorf("kernel: %s", msg)
				break
			}
		}
		if strings.Contains(msg, "nbd") {
			key := msg
			if i := strings.Index(key, ": "); i >= 0 {
				key = key[i+2:]
			}
			if counts[key] == 0 {
				t.Logf("kernel: %s", msg)
			}
			counts[key]++
		}
	}
	for k, n := range counts {
		t.Logf("kernel said %d times: %s", n, k)
	}
}

// runSwap is NBD_SURVIVE=swap.
func (s *survival) runSwap() {
	t := s.t
	s.firstServer()
	dev := devicePath(s.index)
	for _, args := range [][]string{{"mkswap", dev}, {"swapon", dev}} {
		if out, err := exec.Command(args[0], args[1:]...).CombinedOutput(); err != nil {
			t.Fatalf("%v: %v: %s", args, err, out)
		}
	}
	swapOn := true
	defer func() {
		if swapOn {
			exec.Command("swapoff", dev).Run()
		}
	}()
	hog := exec.Command(os.Getenv("NBD_SWAP_HOG"), os.Getenv("NBD_SWAP_HOG_MIB"), "11")
	hog.Stdout, hog.Stderr = os.Stdout, os.Stderr
	if err := hog.Start(); err != nil {
		t.Fatal(err)
	}
	hogDone := make(chan error, 1)
	go func() { hogDone <- hog.Wait() }()
	var kills []killRecord
	rng := rand.New(rand.NewPCG(2, uint64(time.Now().UnixNano())))
	var hogErr error
	hogRunning := true
	for hogRunning && len(kills) < s.cfg.kills {
		select {
		case hogErr = <-hogDone:
			hogRunning = false
			continue
		case <-time.After(time.Duration(500+rng.IntN(1500)) * time.Millisecond):
		}
		vm := swapCounts()
		r, err := s.takeover()
		if err != nil {
			t.Errorf("kill %d: %v", len(kills)+1, err)
			break
		}
		kills = append(kills, r)
		fmt.Printf("SURVIVE-SWAP kill %d at %s\n", len(kills), vm)
	}
	if hogRunning {
		hogErr = <-hogDone
	}
	if hogErr != nil {
		t.Errorf("hog: %v", hogErr)
	}
	t.Logf("after the hog: %s", swapCounts())
	if out, err := exec.Command("swapoff", dev).CombinedOutput(); err != nil {
		t.Errorf("swapoff: %v: %s", err, out)
	} else {
		swapOn = false
	}
	s.report(kills, nil)
	s.checkKernelLog()
}

func swapCounts() string {
	vm, _ := os.ReadFile("/proc/vmstat")
	var out []string
	for _, l := range strings.Split(string(vm), "\n") {
		if strings.HasPrefix(l, "pswpin ") || strings.HasPrefix(l, "pswpout ") {
			out = append(out, l)
		}
	}
	return strings.Join(out, " ")
}

// I/O workers: each owns a region of the device and remembers, page by
// page, which generation of its pattern it wrote last (0: zeroes).

const pageSize = 4096

type opKind uint8

const (
	opWrite opKind = iota
	opRead
	opTrim
	opZero
	opFlush
	opKinds
)

type ioOp struct {
	start, end int64
	kind       opKind
}

type ioWorker struct {
	id   int
	f    *os.File
	base int64
	gen  []uint32
	next uint32
	rng  *rand.Rand
	ops  []ioOp
	err  error
	buf  []byte
	// lastStart is when the last op that completed started; stopped
	// says the worker has ended.
	lastStart atomic.Int64
	stopped   atomic.Bool
}

func (w *ioWorker) run(stop *atomic.Bool) {
	defer w.stopped.Store(true)
	w.buf = alignedBuf(16 * pageSize)
	for !stop.Load() {
		p := w.rng.IntN(100)
		n := 1 + w.rng.IntN(16)
		page := w.rng.IntN(len(w.gen) - n + 1)
		off := w.base + int64(page)*pageSize
		start := mono()
		var kind opKind
		var err error
		switch {
		case p < 45:
			kind = opWrite
			w.next++
			for i := range n {
				fillPage(w.buf[i*pageSize:(i+1)*pageSize], w.id, page+i, w.next)
			}
			if _, err = w.f.WriteAt(w.buf[:n*pageSize], off); err == nil {
				for i := range n {
					w.gen[page+i] = w.next
				}
			}
		case p < 85:
			kind = opRead
			if _, err = w.f.ReadAt(w.buf[:n*pageSize], off); err == nil {
				err = w.check(w.buf[:n*pageSize], page)
			}
		case p < 93:
			kind = opTrim
			page &^= 15
			off = w.base + int64(page)*pageSize
			n = min(16, len(w.gen)-page)
			if err = blkRange(w.f, unix.BLKDISCARD, off, n*pageSize); err == nil {
				clear(w.gen[page : page+n])
			}
		case p < 97:
			kind = opZero
			if err = blkRange(w.f, unix.BLKZEROOUT, off, n*pageSize); err == nil {
				clear(w.gen[page : page+n])
			}
		default:
			kind = opFlush
			err = w.f.Sync()
		}
		w.ops = append(w.ops, ioOp{start: start, end: mono(), kind: kind})
		w.lastStart.Store(start)
		if err != nil {
			w.err = fmt.Errorf("%v of %d pages at %d: %w", kind, n, off, err)
			return
		}
	}
}

func (k opKind) String() string {
	return [...]string{"write", "read", "trim", "zero", "flush"}[k]
}

func blkRange(f *os.File, req uint, off int64, n int) error {
	rng := [2]uint64{uint64(off), uint64(n)}
	if _, _, errno := unix.Syscall(unix.SYS_IOCTL, f.Fd(), uintptr(req), uintptr(unsafe.Pointer(&rng))); errno != 0 {
		return errno
	}
	return nil
}

// check compares pages read from page on with what the worker wrote.
func (w *ioWorker) check(b []byte, page int) error {
	want := make([]byte, pageSize)
	for i := 0; i*pageSize < len(b); i++ {
		g := w.gen[page+i]
		if g == 0 {
			clear(want)
		} else {
			fillPage(want, w.id, page+i, g)
		}
		got := b[i*pageSize : (i+1)*pageSize]
		if string(got) != string(want) {
			return fmt.Errorf("page %d of worker %d: read does not match generation %d (first bytes %x)", page+i, w.id, g, got[:16])
		}
	}
	return nil
}

func (w *ioWorker) verifyAll() error {
	for page := 0; page < len(w.gen); page += 16 {
		b := w.buf[:16*pageSize]
		if _, err := w.f.ReadAt(b, w.base+int64(page)*pageSize); err != nil {
			return err
		}
		if err := w.check(b, page); err != nil {
			return err
		}
	}
	return nil
}

// fillPage writes generation gen of the pattern of a worker's page.
func fillPage(b []byte, worker, page int, gen uint32) {
	x := uint64(worker)<<56 ^ uint64(page)<<24 ^ uint64(gen)
	for i := 0; i < len(b); i += 8 {
		x += 0x9e3779b97f4a7c15
		z := x
		z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
		z = (z ^ (z >> 27)) * 0x94d049bb133111eb
		binary.LittleEndian.PutUint64(b[i:], z^(z>>31))
	}
}

// surviveServe is a server process of TestKernelSurviveLive (TestMain runs
// it in place of the tests when surviveServeEnv is set). It serves the
// memfd, attaches or takes over the device, and reports on the status
// pipe: "attached INDEX T", "standby", "reattached INDEX TRIES T",
// "served T" (its first request), or "error ...". A standby serves a
// listener of its own and connects to it (PrepareReattach) before it says
// so, so that its connections and their buffers exist before the device
// depends on it, then waits in Takeover.Complete for the kernel to find
// the active server's sockets dead.
func surviveServe(cfgJSON string) int {
	status := os.NewFile(5, "status")
	say := func(format string, args ...any) { fmt.Fprintf(status, format+"\n", args...) }
	fail := func(step string, err error) int {
		say("error %s: %v", step, err)
		fmt.Fprintf(os.Stderr, "survive server %d: %s: %v\n", os.Getpid(), step, err)
		return 1
	}
	var c surviveChild
	if err := json.Unmarshal([]byte(cfgJSON), &c); err != nil {
		return fail("config", err)
	}
	if c.Lock {
		// As TestKernelSwapLive: every mapping faulted in and locked as
		// it is made, so that serving touches no new memory, and threads
		// started ahead, so that the runtime starts none while the
		// kernel waits for this process to free memory.
		if err := unix.Mlockall(unix.MCL_CURRENT | unix.MCL_FUTURE); err != nil {
			return fail("mlockall", err)
		}
		if step := swapsafe.ReserveThreads(16); step.Err != nil {
			return fail("threads", step.Err)
		}
	}
	data, err := unix.Mmap(3, 0, int(c.Size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return fail("mmap", err)
	}
	fl, err := net.FileListener(os.NewFile(4, "listener"))
	if err != nil {
		return fail("listener", err)
	}
	live := new(atomic.Int32)
	l := countingListener{fl, live}
	obs := &firstServed{say: say}
	// Connection-level events go to the console with the test output.
	sopts := nbd.Options{Observer: obs, Logger: slog.New(slog.NewTextHandler(os.Stderr, nil)).With("server", os.Getpid())}
	if c.Lock {
		// As gzramd does: requests up to nbd.ReserveBufferMax (which the
		// first server limits the kernel's requests to) are served from
		// buffers made resident at the handshake, not allocated.
		sopts.ReserveBuffers = 32 * nbd.ReserveBufferMax
	}
	srv, err := nbd.NewServer([]nbd.Export{{Name: "s", Backend: &mapBackend{data: data}}}, sopts)
	if err != nil {
		return fail("server", err)
	}
	opts := Options{Network: "unix", Address: c.Sock, Export: "s", Index: AnyIndex, Connections: c.Conns,
		Timeout: c.Timeout, DeadConnTimeout: c.DeadConn, BackendID: c.ID}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if c.Standby {
		own := filepath.Join(os.TempDir(), fmt.Sprintf("survive-standby-%d.sock", os.Getpid()))
		pl, err := net.Listen("unix", own)
		if err != nil {
			return fail("standby listener", err)
		}
		go srv.Serve(countingListener{pl, live})
		opts.Address = own
		t, err := PrepareReattach(ctx, opts)
		if err != nil {
			return fail("prepare", err)
		}
		if c.Lock {
			freezeHeap()
		}
		say("standby")
		if err := waitExit(c.Active); err != nil {
			return fail("waiting for the active server", err)
		}
		d, err := t.Complete(context.Background())
		if err != nil {
			return fail("take over", err)
		}
		say("reattached %d %d %d", d.Index, t.tries, mono())
		keepConnected(d, live, c.Conns, say)
	}
	go srv.Serve(l)
	switch {
	case c.First:
		d, err := Attach(ctx, opts)
		if err != nil {
			return fail("attach", err)
		}
		if c.Lock {
			// The queue's limit outlives this server.
			if err := d.LimitRequests(nbd.ReserveBufferMax); err != nil {
				return fail("limiting requests", err)
			}
			freezeHeap()
		}
		say("attached %d %d", d.Index, mono())
		keepConnected(d, live, c.Conns, say)
	case c.Control == "no-reconnect":
		say("reattached -1 0 %d", mono())
	case c.Control == "no-timeout":
		if err := reconnectWithoutTimeout(ctx, opts); err != nil {
			return fail("reconfigure", err)
		}
		say("reattached -1 1 %d", mono())
	default:
		d, tries, err := reattachKernel(ctx, opts)
		if err != nil {
			return fail("reattach", err)
		}
		say("reattached %d %d %d", d.Index, tries, mono())
		keepConnected(d, live, c.Conns, say)
	}
	select {}
}

// freezeHeap ends a swap server's set-up. It leaves 16 MiB of free heap, resident and locked, for what the
// server allocates from now on (goroutine stacks growing, status lines),
// and turns the collector off, and with it the scavenger: under mlockall
// the scavenger cannot madvise free pages away and maps fresh memory over
// them, which MCL_FUTURE then faults in; a server stuck doing that while
// the kernel waits for it to free memory was seen spinning in reclaim
// (vm_mmap_pgoff, __mm_populate) until the dead-connection timeout.
// gzramd's swapsafe.ReserveHeap solves the same problem for a collecting
// heap; this server allocates too little after start to need one.
func freezeHeap() {
	var chunks [][]byte
	for range (16 << 20) / (8 << 10) {
		b := make([]byte, 8<<10)
		for i := 0; i < len(b); i += 4096 {
			b[i] = 1
		}
		chunks = append(chunks, b)
	}
	runtime.KeepAlive(chunks)
	chunks = nil
	runtime.GC()
	debug.SetGCPercent(-1)
	// Last, as gzramd does (swapsafe.Options.Realtime): a real-time task
	// may allocate below the min watermark, where any other must first
	// reclaim, which for this process can mean waiting for itself. Not
	// before: a standby setting itself up would then take the reserve
	// the active server needs.
	for _, st := range swapsafe.Apply(swapsafe.Options{Realtime: true}) {
		if st.Err != nil {
			fmt.Fprintf(os.Stderr, "survive server %d: %s: %v\n", os.Getpid(), st.Name, st.Err)
		}
	}
}

// keepConnected replaces connections the kernel gives up on while this
// server still serves the others (a request slower than the request
// timeout costs its connection), as gzramd must: nobody else will, and a
// device with no live connection left fails its I/O after the
// dead-connection timeout. It does not return.
func keepConnected(d *Device, live *atomic.Int32, want int, say func(string, ...any)) {
	for {
		time.Sleep(100 * time.Millisecond)
		missing := want - int(live.Load())
		if missing <= 0 {
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		tries, err := reconnectTries(ctx, d, missing)
		cancel()
		if err != nil {
			say("note reconnecting %d lost connections: %v", missing, err)
			continue
		}
		say("note reconnected %d lost connections in %d NBD_CMD_RECONFIGURE", missing, tries)
	}
}

// countingListener counts the server's live connections.
type countingListener struct {
	net.Listener
	live *atomic.Int32
}

func (l countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	l.live.Add(1)
	return &countedConn{Conn: c, live: l.live}, nil
}

type countedConn struct {
	net.Conn
	live   *atomic.Int32
	closed atomic.Bool
}

func (c *countedConn) Close() error {
	if c.closed.CompareAndSwap(false, true) {
		c.live.Add(-1)
	}
	return c.Conn.Close()
}

// NetConn lets the server write to the connection beneath (writev).
func (c *countedConn) NetConn() net.Conn { return c.Conn }

// waitExit waits for process pid to end.
func waitExit(pid int) error {
	fd, err := unix.PidfdOpen(pid, 0)
	if errors.Is(err, unix.ESRCH) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("pidfd_open %d: %w", pid, err)
	}
	defer unix.Close(fd)
	for {
		_, err := unix.Poll([]unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}, -1)
		if !errors.Is(err, unix.EINTR) {
			return err
		}
	}
}

// reconnectWithoutTimeout hands the device new sockets without setting a
// request timeout, for the no-timeout control: Reconnect refuses to, as it
// then cannot tell kept sockets from dropped ones, so this waits a moment
// for the kernel to notice the old ones' end and trusts one reconfigure.
func reconnectWithoutTimeout(ctx context.Context, opts Options) error {
	if err := opts.setDefaults(); err != nil {
		return err
	}
	index, err := opts.sys().find(opts.BackendID)
	if err != nil {
		return err
	}
	conns, _, err := dialKernelConns(ctx, opts)
	if err != nil {
		return err
	}
	var fds []int
	for _, c := range conns {
		f, err := nbd.SocketFile(c)
		if err != nil {
			return err
		}
		defer f.Close()
		defer c.Close()
		fds = append(fds, int(f.Fd()))
	}
	time.Sleep(200 * time.Millisecond)
	return netlinkReconfigure(reconfigureRequest{index: index, deadConnSec: seconds(opts.DeadConnTimeout), backendID: opts.BackendID, fds: fds})
}

// firstServed reports a server's first completed request.
type firstServed struct {
	say  func(string, ...any)
	once atomic.Bool
}

func (o *firstServed) RequestDone(nbd.Command, uint32, time.Duration, uint32) {
	if o.once.CompareAndSwap(false, true) {
		o.say("served %d", mono())
	}
}

// mapBackend serves a shared mapping: the memfd every server process maps.
type mapBackend struct{ data []byte }

func (m *mapBackend) Size() int64 { return int64(len(m.data)) }

func (m *mapBackend) ReadAt(_ context.Context, p []byte, off int64) error {
	copy(p, m.data[off:])
	return nil
}

func (m *mapBackend) WriteAt(_ context.Context, p []byte, off int64, _ bool) error {
	copy(m.data[off:], p)
	return nil
}

func (m *mapBackend) Trim(_ context.Context, off, length int64) error {
	clear(m.data[off : off+length])
	return nil
}

func (m *mapBackend) WriteZeroes(_ context.Context, off, length int64, _ bool) error {
	clear(m.data[off : off+length])
	return nil
}

func (m *mapBackend) Flush(context.Context) error { return nil }
