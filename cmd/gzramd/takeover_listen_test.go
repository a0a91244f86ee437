package main

import (
	"net"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestTakeoverThatCannotListenIsRetried: the serving process is killed
// and, before its successor listens, the metrics address is taken (here by
// the test; on the GPU machine by the dead process itself, whose
// listeners stay open until its teardown ends, the CUDA context's first,
// while the supervisor's early shutdown of them fails: issue 35). The
// successor waits for the address (takeoverListenWait), then fails; the
// supervisor must not end with it,
// dropping every acknowledged page, but start another once it backs off,
// which serves them all when the address is free again.
func TestTakeoverThatCannotListenIsRetried(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	// No standby: the successor starts cold, as in the hung runs.
	d := startDaemon(t, nil, append(hardeningOff, "--size", "64MiB", "--standby=false", "--metrics", addr)...)
	c := dialRaw(t, d.socket)
	const pages = 1024
	data := writePages(t, c, pages, 512, 16, 11)
	c.NC.Close()
	var held net.Listener
	for attempt := 0; held == nil; attempt++ {
		if attempt == 5 {
			t.Fatalf("each of 5 successors listened before the test could take %s:\n%s", addr, d.log.String())
		}
		ready := strings.Count(d.log.String(), "gzramd ready")
		serving := d.servingPID()
		if err := syscall.Kill(serving, syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		// The successor needs tens of milliseconds to start; the dead
		// process's listener, on the CPU, closes within a few.
		for deadline := time.Now().Add(2 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Microsecond) {
			if held, err = net.Listen("tcp", addr); err == nil {
				break
			}
			held = nil
		}
		if held == nil {
			// The successor was first: wait until it serves, and again.
			waitReadyCount(t, d, ready+1)
		}
	}
	ready := strings.Count(d.log.String(), "gzramd ready")
	// Long enough for a successor or two to fail and be backed off.
	d.waitLog(`listening on --metrics `+addr+`: .*address already in use`, 20*time.Second)
	time.Sleep(500 * time.Millisecond)
	held.Close()
	waitReadyCount(t, d, ready+1)
	if !strings.Contains(d.log.String(), "failed before it served the state it took over") {
		t.Errorf("the failed takeover is not logged as one:\n%s", d.log.String())
	}
	checkPages(t, dialRaw(t, d.socket), data, "after a successor failed to listen")
	if code := d.stop(sigterm); code != 0 {
		t.Errorf("exit status %d after SIGTERM, want 0", code)
	}
}

// waitReadyCount waits until the daemon's log says "gzramd ready" n times,
// failing if the daemon exits first.
func waitReadyCount(t *testing.T, d *daemonProc, n int) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for strings.Count(d.log.String(), "gzramd ready") < n {
		select {
		case <-d.done:
			t.Fatalf("gzramd exited (%v) before a serving process served again:\n%s", d.err, d.log.String())
		case <-time.After(10 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("no serving process became ready again:\n%s", d.log.String())
		}
	}
}
