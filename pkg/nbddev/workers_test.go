package nbddev

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// fakeProc writes a procfs with the given threads (pid: comm) under dir,
// kthreadd's children listing them when children is set.
func fakeProc(t *testing.T, threads map[string]string, children bool) string {
	t.Helper()
	dir := t.TempDir()
	var list string
	for pid, comm := range threads {
		if err := os.MkdirAll(filepath.Join(dir, pid), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, pid, "comm"), []byte(comm+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		list += pid + " "
	}
	if children {
		if err := os.MkdirAll(filepath.Join(dir, "2", "task", "2"), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "2", "task", "2", "children"), []byte(list), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func TestRecvWorkersCountsRunningReceiveWorkersOfTheDevice(t *testing.T) {
	threads := map[string]string{
		"100": "kworker/u8:1+knbd0-recv", // running nbd0's receive work
		"101": "kworker/u8:2-knbd0-recv", // ran it last, idle now
		"102": "kworker/1:0+knbd1-recv",  // another device's
		"103": "kworker/u8:3+knbd0-recv",
		"104": "knbd0-recv", // a rescuer, idle
		"105": "kworker/0:1+events",
		"106": "nbd0-recv+nbd0-recv",    // a rescuer running it, as Debian's 6.1 names both
		"107": "kworker/u5:1+nbd0-recv", // so
		"108": "kworker/u5:2-nbd0-recv",
	}
	for _, children := range []bool{true, false} {
		o := Options{Proc: fakeProc(t, threads, children)}
		if n := o.recvWorkers(0); n != 4 {
			t.Errorf("children %v: %d receive workers of nbd0 running, want 4", children, n)
		}
		if n := o.recvWorkers(1); n != 1 {
			t.Errorf("children %v: %d receive workers of nbd1 running, want 1", children, n)
		}
	}
	if n := (&Options{Proc: filepath.Join(t.TempDir(), "none")}).recvWorkers(0); n != 0 {
		t.Errorf("no procfs: %d workers", n)
	}
}

// A takeover waits until the receive worker of a dead connection has
// ended, and no longer than its context.
func TestWaitStaleWorkers(t *testing.T) {
	proc := fakeProc(t, map[string]string{"100": "kworker/u8:1+knbd0-recv", "101": "kworker/u8:2+knbd0-recv"}, true)
	d := &Device{Index: 0, opts: Options{Proc: proc}, connections: 2}
	go func() {
		time.Sleep(30 * time.Millisecond)
		os.WriteFile(filepath.Join(proc, "100", "comm"), []byte("kworker/u8:1-knbd0-recv\n"), 0o644)
	}()
	waited, left := d.waitStaleWorkers(context.Background(), 1)
	if waited < 30*time.Millisecond || left != 0 {
		t.Fatalf("waited %v with %d left; want 30 ms or more, none left", waited, left)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Millisecond)
	defer cancel()
	waited, left = d.waitStaleWorkers(ctx, 0)
	if left != 1 || waited > staleWorkerWait {
		t.Fatalf("with a worker that does not end: waited %v, %d left; want the context's 40 ms and 1 left", waited, left)
	}
	if waited, left := d.waitStaleWorkers(context.Background(), 2); waited > 10*time.Millisecond || left != 0 {
		t.Fatalf("with no stale worker: waited %v, %d left", waited, left)
	}
}
