package main

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gzramd/gzramd/internal/testneeds"
	"github.com/gzramd/gzramd/pkg/nbd"
	"github.com/gzramd/gzramd/pkg/nbd/nbdtest"
	"github.com/gzramd/gzramd/pkg/pipeline"
	"github.com/gzramd/gzramd/pkg/serving"
)

// TestServingProcessDiesAndIsReplaced kills the serving process with
// SIGKILL after it acknowledged writes: the supervisor starts another,
// which takes the device's memory over and serves every acknowledged page,
// counts the takeover, and stops in order.
func TestServingProcessDiesAndIsReplaced(t *testing.T) {
	d := startDaemon(t, nil, append(hardeningOff, "--size", "64MiB")...)
	first := d.servingPID()
	if first == d.cmd.Process.Pid {
		t.Fatalf("no serving process under a supervisor:\n%s", d.log.String())
	}
	c := dialRaw(t, d.socket)
	const pages = 3008
	data := writePages(t, c, pages, 1024, 8, 4)
	// The next serving process is started ahead (--standby).
	d.waitLog(`standby: started ahead and hardened.*; waiting to take over`, 20*time.Second)
	if err := syscall.Kill(first, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	d.waitLog(`the standby serving process takes over`, 20*time.Second)
	d.waitLog(`took the device over from a serving process that died" found="(\d+) pages stored`, 20*time.Second)
	deadline := time.Now().Add(20 * time.Second)
	for strings.Count(d.log.String(), "gzramd ready") < 2 {
		if time.Now().After(deadline) {
			t.Fatalf("no second serving process became ready:\n%s", d.log.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	if second := d.servingPID(); second == first {
		t.Fatalf("still the first serving process, %d", first)
	}
	checkPages(t, dialRaw(t, d.socket), data, "after the takeover")
	// The new serving process listens on a port of its own (--metrics
	// 127.0.0.1:0 here).
	urls := regexp.MustCompile(`msg="serving metrics" url=http://([0-9.:]+)/metrics`).FindAllStringSubmatch(d.log.String(), -1)
	d.metrics = urls[len(urls)-1][1]
	f := d.scrape()
	if v, _ := f.Value("gzramd_stored_pages"); v != pages {
		t.Errorf("gzramd_stored_pages = %v after the takeover, want %d", v, pages)
	}
	if v, _ := f.Value("gzramd_takeovers_total"); v != 1 {
		t.Errorf("gzramd_takeovers_total = %v, want 1", v)
	}
	// gzramd status names both processes and the takeover.
	table, _, code := gzramd(t, nil, "status", "--metrics", d.metrics)
	want := fmt.Sprintf("serving process %d, supervisor %d; takeovers 1 (the last paused the device ", d.servingPID(), d.cmd.Process.Pid)
	if code != 0 || !strings.Contains(table, want) {
		t.Errorf("gzramd status (exit %d) does not say %q:\n%s", code, want, table)
	}
	if code := d.stop(sigterm); code != 0 {
		t.Errorf("exit status %d after SIGTERM, want 0", code)
	}
}

// TestUpgradeHandsOver: SIGHUP to the supervisor makes the serving process
// answer what is in flight and hand its live connections to the next one
// (the executable as it is now), which takes the state over at once: a
// connection open across the upgrade goes on as if nothing happened, and
// every acknowledged page reads back.
func TestUpgradeHandsOver(t *testing.T) {
	d := startDaemon(t, nil, append(hardeningOff, "--size", "64MiB")...)
	first := d.servingPID()
	c := dialRaw(t, d.socket)
	const pages = 1024
	data := writePages(t, c, pages, 512, 16, 5)
	if err := d.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	d.waitLog(`msg="handed over: requests in flight answered`, 20*time.Second)
	d.waitLog(`handed over; starting the next to take its state over`, 20*time.Second)
	deadline := time.Now().Add(20 * time.Second)
	for strings.Count(d.log.String(), "gzramd ready") < 2 {
		if time.Now().After(deadline) {
			t.Fatalf("no second serving process became ready:\n%s", d.log.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	if strings.Contains(d.log.String(), "the serving process died") {
		t.Errorf("the handover was taken for a death:\n%s", d.log.String())
	}
	if second := d.servingPID(); second == first {
		t.Fatalf("still the first serving process, %d", first)
	}
	// The connection open across the handover goes on, served by the
	// next process; a new one works too.
	checkPages(t, c, data, "the connection open across the upgrade")
	checkPages(t, dialRaw(t, d.socket), data, "a new connection")
	d.waitLog(`msg="serving the connections the last serving process handed over" connections=1 kernel=0`, time.Second)
	if code := d.stop(sigterm); code != 0 {
		t.Errorf("exit status %d after SIGTERM, want 0", code)
	}
}

// TestOrphanHandsOverToTheNextSupervisor: where systemd keeps the state
// (a stand-in for its notify socket and file descriptor store here), the
// supervisor's death leaves the serving process serving; the next
// supervisor, started with the stored state as systemd would start it,
// has its serving process take the connections over from the orphan: a
// connection open throughout goes on, and every page reads back.
func TestOrphanHandsOverToTheNextSupervisor(t *testing.T) {
	notify := listenNotify(t, false)
	args := append(hardeningOff, "--size", "64MiB")
	d1 := startDaemon(t, []string{"NOTIFY_SOCKET=" + notify.addr}, args...)
	orphan := d1.servingPID()
	t.Cleanup(func() { syscall.Kill(orphan, syscall.SIGKILL) })
	files, fdNames, ok := notify.stored(len(pipeline.StateFileNames), 10*time.Second)
	if !ok {
		t.Fatalf("the state did not reach the file descriptor store:\n%s", d1.log.String())
	}
	c := dialRaw(t, d1.socket)
	data := writePages(t, c, 512, 256, 16, 6)
	readAll := func(c *nbdtest.Conn, when string) {
		t.Helper()
		checkPages(t, c, data, when)
	}
	if err := d1.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	d1.waitLog(`the supervisor died: serving on`, 10*time.Second)
	readAll(c, "served by the orphan")

	// systemd starts the unit again: the stored state from descriptor 3
	// on, LISTEN_PID the new process's own.
	cmd := exec.Command("sh", append([]string{"-c", `LISTEN_PID=$$ exec "$0" "$@"`, gzramdBin, "serve", "--socket", d1.socket, "--metrics", "127.0.0.1:0"}, args...)...)
	cmd.Env = append(cleanEnv(), "LISTEN_FDS="+strconv.Itoa(len(files)), "LISTEN_FDNAMES="+strings.Join(fdNames, ":"))
	cmd.ExtraFiles = files
	d2 := runDaemon(t, cmd, d1.socket)
	d2.waitLog(`the orphaned serving process handed over and exited`, 30*time.Second)
	d2.waitLog(`gzramd ready`, 30*time.Second)
	d2.waitLog(`msg="serving the connections the last serving process handed over" connections=1`, time.Second)
	readAll(c, "the connection open throughout")
	readAll(dialRaw(t, d2.socket), "a new connection")
	if code := d2.stop(sigterm); code != 0 {
		t.Errorf("exit status %d after SIGTERM, want 0", code)
	}
}

// TestTakeoverPauseReport measures, over GZRAMD_TAKEOVER_KILLS kills of the
// serving process (skipped unless set; `make bench-takeover` runs 100),
// the time from the kill to the first request served again by the next
// one (dialing again as a client must). Between kills a client writes a
// fresh batch of pages, and after each takeover it reads the last batch
// back, so that pages acknowledged just before a kill are checked; at the
// end every page is. GZRAMD_TAKEOVER_ARGS adds daemon flags (make
// bench-takeover ARGS="--backend gpu --algorithm zstd" on a GPU machine);
// GZRAMD_TAKEOVER_STANDBY=1 waits for a standby before each kill, where by
// default the kills come back to back and most takeovers start cold;
// GZRAMD_TAKEOVER_LOG names a file for the daemon's log.
// It reports the median and the worst; it asserts no time.
func TestTakeoverPauseReport(t *testing.T) {
	v := testneeds.Env(t, "GZRAMD_TAKEOVER_KILLS", "measures the pause of that many takeovers (make bench-takeover runs 100)")
	kills, _ := strconv.Atoi(v)
	if kills <= 0 {
		testneeds.Skip(t, testneeds.KindOptIn, "GZRAMD_TAKEOVER_KILLS", "set to %q, not a number of kills above 0 (make bench-takeover sets 100)", v)
	}
	extra := strings.Fields(os.Getenv("GZRAMD_TAKEOVER_ARGS"))
	standby := os.Getenv("GZRAMD_TAKEOVER_STANDBY") == "1"
	d := startDaemon(t, nil, append(append(hardeningOff, "--size", "256MiB"), extra...)...)
	c := dialRaw(t, d.socket)
	const pages, batch = 4096, 32
	data := writePages(t, c, pages, 1024, 32, 7)
	r := rand.New(rand.NewPCG(8, 8))
	var pauses []time.Duration
	serving := d.servingPID()
	last := -1 // the first page of the batch written since the last kill
	for k := range kills {
		if standby {
			// A standby started ahead for this kill, as there is for a
			// crash that comes seconds or more after the last.
			d.waitLog(fmt.Sprintf(`(?s)(standby: started ahead and hardened.*){%d}`, k+1), 60*time.Second)
		}
		start := time.Now()
		if err := syscall.Kill(serving, syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		// The first read that succeeds, on a new connection.
		page := k % pages
		for {
			if time.Since(start) > 60*time.Second {
				t.Fatalf("kill %d: nothing served 60 s after it:\n%s", k, d.log.String())
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			nc, _, err := nbd.Dial(ctx, "unix", d.socket, "gzram0")
			cancel()
			if err != nil {
				time.Sleep(time.Millisecond)
				continue
			}
			c = nbdtest.NewConn(nc)
			got, errno, err := c.Read(uint64(page)*4096, 4096)
			if err != nil || errno != 0 {
				nc.Close()
				continue
			}
			pauses = append(pauses, time.Since(start))
			if !bytes.Equal(got, data[page*4096:(page+1)*4096]) {
				t.Fatalf("kill %d: page %d differs after the takeover", k, page)
			}
			break
		}
		if last >= 0 {
			got, errno, err := c.Read(uint64(last)*4096, batch*4096)
			if err != nil || errno != 0 {
				t.Fatalf("kill %d: reading back the pages written before it: %v, errno %d", k, err, errno)
			}
			if !bytes.Equal(got, data[last*4096:(last+batch)*4096]) {
				t.Fatalf("kill %d: pages %d-%d, written and acknowledged before it, differ after the takeover", k, last, last+batch-1)
			}
		}
		last = (k * batch) % pages
		for i := range batch * 4096 / 8 {
			binary.LittleEndian.PutUint64(data[last*4096+i*8:], r.Uint64()>>(r.Uint64()%64))
		}
		if errno, err := c.Write(uint64(last)*4096, data[last*4096:(last+batch)*4096]); err != nil || errno != 0 {
			t.Fatalf("kill %d: write of pages %d-%d: %v, errno %d", k, last, last+batch-1, err, errno)
		}
		c.NC.Close()
		for serving == d.servingPID() {
			time.Sleep(time.Millisecond)
		}
		serving = d.servingPID()
	}
	checkPages(t, dialRaw(t, d.socket), data, fmt.Sprintf("after %d kills", kills))
	slices.Sort(pauses)
	when := "back to back"
	if standby {
		when = "each once a standby was ready"
	}
	t.Logf("%d kills of the serving process, %s (256 MiB device, %d pages stored, flags %q): kill to first request served again: median %v, 90th %v, worst %v",
		kills, when, pages, extra, pauses[len(pauses)/2].Round(time.Millisecond), pauses[len(pauses)*9/10].Round(time.Millisecond), pauses[len(pauses)-1].Round(time.Millisecond))
	// The serving processes' own count runs from when the supervisor
	// heard of the death to when the next one served: the rest is the
	// hearing, and the client's dialing again.
	var own []time.Duration
	for _, m := range regexp.MustCompile(`serving again after the takeover.* pause=(\S+)`).FindAllStringSubmatch(d.log.String(), -1) {
		if p, err := time.ParseDuration(m[1]); err == nil {
			own = append(own, p)
		}
	}
	if path := os.Getenv("GZRAMD_TAKEOVER_LOG"); path != "" {
		if err := os.WriteFile(path, []byte(d.log.String()), 0o644); err != nil {
			t.Error(err)
		}
	}
	if len(own) > 0 {
		slices.Sort(own)
		t.Logf("the serving processes' own count of %d takeovers (death heard to serving): median %v, 90th %v, worst %v",
			len(own), own[len(own)/2], own[len(own)*9/10], own[len(own)-1])
	}
	if code := d.stop(sigterm); code != 0 {
		t.Errorf("exit status %d after SIGTERM, want 0", code)
	}
}

// writePages writes pages pages of half-random data (the first random
// bytes of each, zeros after: they compress) through c, batch pages a
// request, and returns what it wrote.
func writePages(t *testing.T, c *nbdtest.Conn, pages, random, batch int, seed uint64) []byte {
	t.Helper()
	r := rand.New(rand.NewPCG(seed, seed))
	data := make([]byte, pages*4096)
	for i := range pages {
		for j := range random {
			data[i*4096+j] = byte(r.Uint32())
		}
	}
	for i := 0; i < pages; i += batch {
		if errno, err := c.Write(uint64(i)*4096, data[i*4096:(i+batch)*4096]); err != nil || errno != 0 {
			t.Fatalf("write %d: %v, errno %d", i, err, errno)
		}
	}
	return data
}

// checkPages reads data's pages back through c, 32 a request.
func checkPages(t *testing.T, c *nbdtest.Conn, data []byte, when string) {
	t.Helper()
	for i := 0; i < len(data)/4096; i += 32 {
		got, errno, err := c.Read(uint64(i)*4096, 32*4096)
		if err != nil || errno != 0 {
			t.Fatalf("%s: read %d: %v, errno %d", when, i, err, errno)
		}
		if !bytes.Equal(got, data[i*4096:(i+32)*4096]) {
			t.Fatalf("%s: pages %d-%d differ", when, i, i+31)
		}
	}
}

// TestSupervisorRealtimeAsServing: the supervisor runs real-time exactly
// when its serving process will (--harden with --realtime on, or auto with
// a kernel device), so that a serving process started after a crash is
// real-time from its first instruction.
func TestSupervisorRealtimeAsServing(t *testing.T) {
	for _, c := range []struct {
		harden   bool
		realtime string
		swap     bool
		want     bool
	}{
		{true, "auto", true, true},
		{true, "auto", false, false},
		{true, "on", false, true},
		{true, "off", true, false},
		{false, "on", true, false},
	} {
		cfg := &serving.Config{Harden: c.harden, Realtime: c.realtime, Swap: c.swap, Reexec: true}
		adj := -1000
		opts := supervisorHardening(cfg, &adj)
		if opts.Realtime != c.want {
			t.Errorf("harden=%v realtime=%s swap=%v: supervisor real-time %v, want %v", c.harden, c.realtime, c.swap, opts.Realtime, c.want)
		}
		if opts.Realtime != (cfg.Harden && cfg.WantRealtime()) {
			t.Errorf("harden=%v realtime=%s swap=%v: supervisor real-time %v, the serving process %v", c.harden, c.realtime, c.swap, opts.Realtime, cfg.Harden && cfg.WantRealtime())
		}
		if opts.LockMemory != c.harden {
			t.Errorf("harden=%v: LockMemory %v", c.harden, opts.LockMemory)
		}
		if opts.IOFlusher != c.harden {
			t.Errorf("harden=%v: the supervisor checks it is an IO flusher: %v, want as the serving process", c.harden, opts.IOFlusher)
		}
	}
	cfg := &serving.Config{Harden: true, Realtime: "auto", Reexec: false}
	if adj := -1000; supervisorHardening(cfg, &adj).IOFlusher {
		t.Error("--io-flusher-reexec=false: the supervisor still checks it is an IO flusher")
	}
}
