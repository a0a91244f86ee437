package nbddev

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gzramd/gzramd/internal/testneeds"

	"github.com/gzramd/gzramd/pkg/nbd/nbdtest"

	"github.com/gzramd/gzramd/pkg/nbd"
)

// needKernelNBD skips a test that attaches real /dev/nbdN devices unless
// the nbd module is loaded and we are root (testdata/kernelvm.sh runs
// such tests in a QEMU guest).
func needKernelNBD(t *testing.T) {
	t.Helper()
	if _, err := os.Stat("/sys/module/nbd"); err != nil {
		testneeds.Skip(t, testneeds.KindModule, "nbd", "attaches real /dev/nbdN devices, and the module is not loaded (modprobe nbd, as root); pkg/nbddev/testdata/kernelvm.sh runs this in a VM")
	}
	testneeds.Root(t, "attaching /dev/nbdN")
}

// alignedBuf returns n bytes aligned for O_DIRECT.
func alignedBuf(n int) []byte {
	raw := make([]byte, n+4096)
	return raw[4096-int(uintptrOf(raw)&4095):][:n]
}

// TestKernelReconnectLive drives Reconnect and Reattach against the
// kernel in one process: the backend identifier reaches sysfs, a reconnect
// while every connection is alive is refused rather than reported as done
// (the kernel drops such sockets silently), I/O issued while the server
// is away waits and completes once new sockets are in, and a read that
// was in flight when the server lost its sockets is sent again after the
// request timeout and returns the right data.
func TestKernelReconnectLive(t *testing.T) {
	needKernelNBD(t)
	mem := nbdtest.NewMemBackend(16 << 20)
	for i := range mem.Bytes() {
		mem.Bytes()[i] = byte(i * 13)
	}
	// A read at stuckOff blocks the first time, like a server that dies
	// in the middle of serving it.
	const stuckOff = 5 << 20
	var stuckCalls atomic.Int32
	stuck, release := make(chan struct{}), make(chan struct{})
	mem.Hook = func(op string, off int64) error {
		if op == "read" && off == stuckOff && stuckCalls.Add(1) == 1 {
			close(stuck)
			<-release
		}
		return nil
	}
	defer func() {
		select {
		case <-release:
		default:
			close(release)
		}
	}()
	ts := startServer(t, []nbd.Export{{Name: "r", Backend: mem}}, nbd.Options{})
	id := fmt.Sprintf("nbd-reconnect-test-%d-%d", os.Getpid(), time.Now().UnixNano())
	const timeout = 2 * time.Second
	opts := Options{Network: "unix", Address: ts.sock, Export: "r", Index: AnyIndex,
		Connections: 2, Timeout: timeout, DeadConnTimeout: time.Minute, BackendID: id}
	ctx := context.Background()
	d, err := Attach(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := d.Detach(); err != nil {
			t.Error(err)
		}
		waitFree(t, d.Index)
	}()
	if err := d.SurvivesRestart(); err != nil {
		t.Errorf("SurvivesRestart: %v", err)
	}
	if d.BackendID != id {
		t.Errorf("backend %q in sysfs, want %q", d.BackendID, id)
	}
	if n, err := sysfs(DefaultSysBlock).find(id); err != nil || n != d.Index {
		t.Errorf("Find = %d, %v; want %d", n, err, d.Index)
	}
	if n, err := sysfs(DefaultSysBlock).deviceConnections(d.Index); err != nil || n != 2 {
		t.Errorf("deviceConnections = %d, %v; want 2", n, err)
	}

	// Every connection alive: no slot for a new socket.
	short, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	err = d.Reconnect(short, 1)
	cancel()
	if err == nil || !strings.Contains(err.Error(), "kept 0 of 1") {
		t.Fatalf("Reconnect with every connection alive: %v; want it refused", err)
	}
	t.Logf("with every connection alive: %v", err)

	f, err := os.OpenFile(d.Path, os.O_RDWR|unix.O_DIRECT, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	buf := alignedBuf(64 << 10)
	if _, err := f.ReadAt(buf, 1<<20); err != nil || !bytes.Equal(buf, mem.Snapshot()[1<<20:1<<20+len(buf)]) {
		t.Fatalf("read after the refused reconnect: %v (or wrong data)", err)
	}

	// A read in flight when the server loses its sockets.
	type result struct {
		err  error
		data []byte
		took time.Duration
	}
	inflight := make(chan result, 1)
	go func() {
		b := alignedBuf(4096)
		start := time.Now()
		_, err := f.ReadAt(b, stuckOff)
		inflight <- result{err, b, time.Since(start)}
	}()
	select {
	case <-stuck:
	case <-time.After(10 * time.Second):
		t.Fatal("the read never reached the backend")
	}
	lost := time.Now()
	if n := dropServerConns(ts); n != 2 {
		t.Errorf("dropped %d server connections, want 2", n)
	}
	// A write issued while no connection is alive waits for one.
	want := alignedBuf(64 << 10)
	for i := range want {
		want[i] = byte(i*7 + 1)
	}
	written := make(chan error, 1)
	go func() {
		_, err := f.WriteAt(want, 8<<20)
		written <- err
	}()
	select {
	case err := <-written:
		t.Fatalf("write with no live connection returned at once (%v): the device did not wait", err)
	case <-time.After(500 * time.Millisecond):
	}

	rctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	d2, tries, err := reattachKernel(rctx, Options{Network: "unix", Address: ts.sock, Export: "r", Index: AnyIndex,
		Timeout: timeout, DeadConnTimeout: time.Minute, BackendID: id})
	cancel()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("reattached %s %v after losing its connections, in %d NBD_CMD_RECONFIGURE", d2.Path, time.Since(lost).Round(time.Millisecond), tries)
	if d2.Index != d.Index || d2.Size != d.Size || d2.connections != 2 {
		t.Errorf("reattached %+v, want index %d size %d 2 connections", d2, d.Index, d.Size)
	}
	select {
	case err := <-written:
		if err != nil {
			t.Fatalf("write held over the reconnect: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("write held over the reconnect did not complete")
	}
	if !bytes.Equal(mem.Snapshot()[8<<20:8<<20+len(want)], want) {
		t.Error("write held over the reconnect did not reach the backend")
	}
	select {
	case r := <-inflight:
		if r.err != nil {
			t.Fatalf("read in flight over the reconnect: %v", r.err)
		}
		if !bytes.Equal(r.data, mem.Snapshot()[stuckOff:stuckOff+4096]) {
			t.Error("read in flight over the reconnect returned wrong data")
		}
		t.Logf("read in flight when the connections went: done after %v (request timeout %v)", r.took.Round(time.Millisecond), timeout)
	case <-time.After(timeout + 30*time.Second):
		t.Fatal("read in flight when the connections went was never re-sent")
	}
	if n := stuckCalls.Load(); n < 2 {
		t.Errorf("the stuck read reached the backend %d times; want it re-sent", n)
	}
	close(release)

	// The kernel refuses a reconfigure that names another backend.
	other := *d2
	other.BackendID = id + "-other"
	dropServerConns(ts)
	wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	err = other.Reconnect(wctx, 1)
	cancel()
	if err == nil || !errors.Is(err, unix.EINVAL) {
		t.Errorf("reconnect naming another backend: %v, want EINVAL", err)
	}
	// Losing the sockets and reconnecting at once: the kernel may not
	// have noticed yet, which Reconnect must ride out.
	dropServerConns(ts)
	rctx, cancel = context.WithTimeout(ctx, 20*time.Second)
	tries, err = reconnectTries(rctx, d2, 0)
	cancel()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("reconnected at once after losing the sockets: %d NBD_CMD_RECONFIGURE", tries)
	if _, err := f.ReadAt(buf, 8<<20); err != nil || !bytes.Equal(buf, want) {
		t.Fatalf("read after reconnecting: %v (or wrong data)", err)
	}

	// A standby: prepared while the connections are alive, it offers its
	// sockets until the kernel finds the old ones dead, and no sooner.
	before := serverConns(ts)
	tk, err := PrepareReattach(ctx, Options{Network: "unix", Address: ts.sock, Export: "r", Index: AnyIndex,
		Timeout: timeout, DeadConnTimeout: time.Minute, BackendID: id})
	if err != nil {
		t.Fatal(err)
	}
	defer tk.Close()
	took := make(chan error, 1)
	go func() {
		cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		_, err := tk.Complete(cctx)
		took <- err
	}()
	select {
	case err := <-took:
		t.Fatalf("standby took over while every connection was alive: %v", err)
	case <-time.After(500 * time.Millisecond):
	}
	// The old connections go; the standby's own stay.
	standby := serverConns(ts)
	for c := range before {
		delete(standby, c)
	}
	dropServerConns(ts, standby)
	select {
	case err := <-took:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(40 * time.Second):
		t.Fatal("standby did not take over")
	}
	if tk.tries < 2 {
		t.Errorf("standby took over in %d NBD_CMD_RECONFIGURE; the ones before the drop must have been refused", tk.tries)
	}
	t.Logf("standby took over in %d NBD_CMD_RECONFIGURE", tk.tries)
	if _, err := f.ReadAt(buf, 8<<20); err != nil || !bytes.Equal(buf, want) {
		t.Fatalf("read after the standby took over: %v (or wrong data)", err)
	}
}

// reattachKernel is Reattach, also returning how many
// NBD_CMD_RECONFIGURE it took.
func reattachKernel(ctx context.Context, opts Options) (*Device, int, error) {
	t, err := PrepareReattach(ctx, opts)
	if err != nil {
		return nil, 0, err
	}
	defer t.Close()
	d, err := t.Complete(ctx)
	return d, t.tries, err
}

// reconnectTries is Device.Reconnect, also returning how many
// NBD_CMD_RECONFIGURE it took.
func reconnectTries(ctx context.Context, d *Device, n int) (int, error) {
	t, err := d.prepare(ctx, n)
	if err != nil {
		return 0, err
	}
	defer t.Close()
	_, err = t.Complete(ctx)
	return t.tries, err
}

// TestKernelIoctlNotSurvivable: the ioctl fallback says it cannot survive
// its server, and Reconnect refuses it.
func TestKernelIoctlNotSurvivable(t *testing.T) {
	needKernelNBD(t)
	mem := nbdtest.NewMemBackend(8 << 20)
	ts := startServer(t, []nbd.Export{{Name: "i", Backend: mem}}, nbd.Options{})
	d, err := Attach(context.Background(), Options{Network: "unix", Address: ts.sock, Export: "i", Index: AnyIndex, Ioctl: true})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := d.Detach(); err != nil {
			t.Error(err)
		}
		waitFree(t, d.Index)
	}()
	if err := d.SurvivesRestart(); !errors.Is(err, ErrNotSurvivable) {
		t.Errorf("ioctl device: SurvivesRestart() = %v, want ErrNotSurvivable", err)
	} else {
		t.Log(err)
	}
	if err := d.Reconnect(context.Background(), 1); !errors.Is(err, ErrNotSurvivable) {
		t.Errorf("ioctl device: Reconnect = %v, want ErrNotSurvivable", err)
	}
	if _, ok, _ := sysfs(DefaultSysBlock).readBackendID(d.Index); ok {
		t.Error("an ioctl device shows a backend file")
	}
	// The kernel itself refuses to reconfigure it.
	if err := netlinkReconfigure(reconfigureRequest{index: d.Index, timeoutSec: 5}); !errors.Is(err, unix.EINVAL) {
		t.Errorf("NBD_CMD_RECONFIGURE of an ioctl device: %v, want EINVAL", err)
	}
}
