package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gzramd/gzramd/internal/testneeds"
	"github.com/gzramd/gzramd/pkg/nbd"
	"github.com/gzramd/gzramd/pkg/nbd/nbdtest"
	"github.com/gzramd/gzramd/pkg/serving"
)

// TestStatusMatchesMetrics writes through real clients, then checks the
// scrape against what was written, lints it with promtool, and checks
// that `gzramd status` reports the same figures.
func TestStatusMatchesMetrics(t *testing.T) {
	testneeds.Command(t, "nbdcopy", "libnbd-bin")
	d := startDaemon(t, nil, append(hardeningOff, "--size", "64MiB")...)

	// 8 MiB of half-compressible data, then trim the first MiB.
	data := make([]byte, 8<<20)
	rand.Read(data)
	for i := 0; i < len(data); i += 4096 {
		clear(data[i+2048 : i+4096])
	}
	src := filepath.Join(t.TempDir(), "data")
	if err := os.WriteFile(src, data, 0o600); err != nil {
		t.Fatal(err)
	}
	runClient(t, nil, "nbdcopy", src, d.uri())
	if _, ok := testneeds.CommandFor(t, "nbdsh", "python3-libnbd", "the first MiB not trimmed, the notify-free count not checked"); ok {
		runClient(t, nil, "nbdsh", "-u", d.uri(), "-c", "h.trim(1048576, 0)")
	}
	back := filepath.Join(t.TempDir(), "back")
	runClient(t, nil, "nbdcopy", d.uri(), back)
	got, err := os.ReadFile(back)
	if err != nil {
		t.Fatal(err)
	}
	trimmed := !bytes.Equal(got[:1<<20], data[:1<<20])
	if !bytes.Equal(got[1<<20:8<<20], data[1<<20:]) {
		t.Fatal("data read back differs from data written")
	}

	f := d.scrape()
	stored := 2048.0 // 8 MiB of pages
	if trimmed {
		stored -= 256
		if v, _ := f.Value("gzramd_notify_free_total"); v != 256 {
			t.Errorf("gzramd_notify_free_total = %v after trimming 256 pages", v)
		}
	}
	if v, _ := f.Value("gzramd_stored_pages"); v != stored {
		t.Errorf("gzramd_stored_pages = %v, want %v", v, stored)
	}
	if v, _ := f.Value("gzramd_orig_data_bytes"); v != stored*4096 {
		t.Errorf("gzramd_orig_data_bytes = %v, want %v", v, stored*4096)
	}
	compr, _ := f.Value("gzramd_compr_data_bytes")
	if compr < stored*2048 || compr > stored*2200 {
		t.Errorf("gzramd_compr_data_bytes = %v for %v half-random pages", compr, stored)
	}
	if v, _ := f.Value("gzramd_nbd_requests_total", "command", "write"); v == 0 {
		t.Error("no NBD writes counted")
	}
	if v, _ := f.Value("gzramd_nbd_request_duration_seconds", "command", "read"); v == 0 {
		t.Error("no NBD read latencies observed")
	}
	// Without a GPU every page compresses inline, in its request.
	if cpu, _ := f.Value("gzramd_compressed_pages_total", "backend", "cpu"); cpu < 2048 {
		t.Errorf("gzramd_compressed_pages_total{backend=cpu} = %v for 2048 pages written", cpu)
	} else if inline, _ := f.Value("gzramd_inline_pages_total"); inline != cpu {
		t.Errorf("gzramd_inline_pages_total = %v, want all %v pages compressed on the CPU", inline, cpu)
	}
	promtool(t, d.metrics)

	// The table and the JSON report agree with the metrics.
	out, _, code := gzramd(t, nil, "status", "--metrics", d.metrics, "--json")
	if code != 0 {
		t.Fatalf("status --json: exit status %d", code)
	}
	var rep serving.Status
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("status --json: %v\n%s", err, out)
	}
	for _, c := range []struct {
		name   string
		status int64
	}{
		{"gzramd_orig_data_bytes", rep.OrigDataBytes},
		{"gzramd_compr_data_bytes", rep.ComprDataBytes},
		{"gzramd_mem_used_bytes", rep.MemUsedBytes},
		{"gzramd_disksize_bytes", rep.DiskSize},
		{"gzramd_stored_pages", rep.StoredPages},
		{"gzramd_same_pages", rep.SamePages},
		{"gzramd_dense_recompressed_groups_total", int64(rep.DenseGroups)},
	} {
		if v, _ := f.Value(c.name); int64(v) != c.status {
			t.Errorf("status says %d, metrics %s = %v", c.status, c.name, v)
		}
	}
	if rep.Backend != f.Label("gzramd_info", "backend") || rep.Algorithm != "lz4" || rep.Export != "gzram0" {
		t.Errorf("status backend/algorithm/export %q/%q/%q disagree with gzramd_info", rep.Backend, rep.Algorithm, rep.Export)
	}
	// No kernel device: the export's transport, NBD, in both.
	if v, _ := f.Value("gzramd_transport_info", "transport", "nbd"); rep.Transport != "nbd" || v != 1 {
		t.Errorf("status transport %q, gzramd_transport_info{transport=nbd} %v; want nbd and 1", rep.Transport, v)
	}
	// gzramd's own memory: each process's, and the net saving made of it.
	roles := map[string]bool{}
	for _, p := range rep.SelfMemory {
		roles[p.Role] = true
		if p.PSS <= 0 || p.PSS > p.RSS {
			t.Errorf("status: %s's memory %+v", p.Role, p)
		}
	}
	if !roles["serving"] || !roles["supervisor"] {
		t.Errorf("status names the memory of %v, want the serving process and the supervisor", roles)
	}
	if saved := rep.OrigDataBytes + 4096*rep.SamePages - rep.MemUsedBytes - rep.OwnMemoryBytes; rep.OwnMemoryBytes <= 0 || rep.NetSavedBytes != saved {
		t.Errorf("status: own memory %d, net saving %d; want it positive, and %d", rep.OwnMemoryBytes, rep.NetSavedBytes, saved)
	}
	if v, ok := f.Value("gzramd_self_memory_bytes", "role", "serving", "kind", "pss"); !ok || v <= 0 {
		t.Errorf("gzramd_self_memory_bytes{role=serving,kind=pss} = %v", v)
	}
	table, _, code := gzramd(t, nil, "status", "--metrics", d.metrics)
	// Then who is connected: nbdcopy's connections are closed, but the
	// serving process may not have seen the last of them close yet.
	if code != 0 || lines(table) < 6 || !strings.HasPrefix(strings.Split(table, "\n")[2], "serving process ") ||
		!strings.HasSuffix(strings.Split(table, "\n")[2], "; transport nbd") ||
		!strings.HasPrefix(strings.Split(table, "\n")[3], "dense tier: none of ") ||
		!strings.HasPrefix(strings.Split(table, "\n")[4], "gzramd's processes ") ||
		!strings.HasPrefix(strings.Split(table, "\n")[5], "NBD connections: ") {
		t.Fatalf("status: exit status %d, output:\n%s", code, table)
	}
	row := strings.Fields(strings.Split(table, "\n")[1])
	gpuName := rep.GPU // the daemon picks the GPU where there is one
	if gpuName == "" {
		gpuName = "-"
	}
	// SELF and SAVED move between the two reports (the processes' sets
	// change): they are checked above.
	wantRow := strings.Fields(strings.Join([]string{"-", "gzram0", "lz4", "64M", humanBytes(rep.OrigDataBytes), humanBytes(rep.ComprDataBytes),
		humanBytes(rep.MemUsedBytes), strconv.FormatFloat(rep.Ratio(), 'f', 2, 64), "SELF", "SAVED", rep.Backend, gpuName, "no"}, " "))
	if len(row) == len(wantRow) {
		row[8], row[9] = "SELF", "SAVED"
	}
	if strings.Join(row, " ") != strings.Join(wantRow, " ") {
		t.Errorf("status row %q, want %q", row, wantRow)
	}
	if code := d.stop(sigterm); code != 0 {
		t.Errorf("exit status %d after SIGTERM", code)
	}
	// Everything nbdcopy wrote (and was acknowledged) was held to the end.
	m := d.waitLog(`msg=stopped stored_pages=(\d+)`, time.Second)
	if m[1] != strconv.Itoa(int(stored)) {
		t.Errorf("stopped with %s pages stored, want %v", m[1], stored)
	}
}

func TestStatusWithoutDaemon(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	_, stderr, code := gzramd(t, nil, "status", "--metrics", addr)
	if code != 1 || !strings.Contains(stderr, "no gzramd answering at "+addr) || lines(stderr) != 1 {
		t.Errorf("status with nothing listening: status %d, stderr %q", code, stderr)
	}
}

func promtool(t *testing.T, addr string) {
	t.Helper()
	path, ok := testneeds.CommandFor(t, "promtool", "prometheus", "/metrics not linted")
	if !ok {
		return
	}
	resp, err := httpGet("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(path, "check", "metrics")
	cmd.Stdin = bytes.NewReader(resp)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Errorf("promtool check metrics: %v\n%s", err, out)
	}
}

// dialRaw negotiates the daemon's export and speaks the transmission
// phase directly (nbdtest), so that a test knows exactly which writes were
// acknowledged.
func dialRaw(t *testing.T, socket string) *nbdtest.Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	nc, _, err := nbd.Dial(ctx, "unix", socket, "gzram0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nc.Close() })
	return nbdtest.NewConn(nc)
}

// TestSIGTERMKeepsAcknowledgedWrites writes distinct pages one at a time
// and sends SIGTERM in the middle: the daemon must finish the request in
// flight, exit 0, and hold at the end every page it acknowledged.
func TestSIGTERMKeepsAcknowledgedWrites(t *testing.T) {
	d := startDaemon(t, nil, append(hardeningOff, "--size", "64MiB")...)
	c := dialRaw(t, d.socket)
	var acked atomic.Int64
	errc := make(chan error, 1)
	go func() {
		page := make([]byte, 4096)
		for i := uint64(0); i < 16384; i++ {
			rand.Read(page[:512]) // distinct and compressible: never same-filled
			errno, err := c.Write(i*4096, page)
			if err != nil {
				errc <- nil // the daemon closed the connection: expected
				return
			}
			if errno != 0 {
				errc <- &nbdError{errno}
				return
			}
			acked.Add(1)
		}
		errc <- nil
	}()
	for acked.Load() < 500 {
		time.Sleep(time.Millisecond)
	}
	if code := d.stop(sigterm); code != 0 {
		t.Errorf("exit status %d after SIGTERM, want 0", code)
	}
	if err := <-errc; err != nil {
		// ESHUTDOWN for a request that arrived after the stop is allowed.
		if e, ok := err.(*nbdError); !ok || e.errno != 108 {
			t.Errorf("write failed: %v", err)
		}
	}
	m := d.waitLog(`msg=stopped stored_pages=(\d+)`, time.Second)
	stored, _ := strconv.ParseInt(m[1], 10, 64)
	n := acked.Load()
	// The last write may be stored without its reply arriving.
	t.Logf("%d writes acknowledged, %d pages stored at exit", n, stored)
	if stored < n || stored > n+1 {
		t.Errorf("stopped with %d pages stored, but %d writes were acknowledged", stored, n)
	}
	for _, want := range []string{"stop requested", "waiting for requests in flight"} {
		if !strings.Contains(d.log.String(), want) {
			t.Errorf("log lacks %q", want)
		}
	}
	if strings.Contains(d.log.String(), "level=ERROR") {
		t.Error("errors logged during a clean stop")
	}
}

type nbdError struct{ errno uint32 }

func (e *nbdError) Error() string { return "NBD error " + strconv.Itoa(int(e.errno)) }

// fakeKernel stands in for /proc/swaps and /sys/block: nbd7 is active
// swap, set up by this test process, whose connection to the daemon is
// open. That is how the daemon sees swap on its export.
func fakeKernel(t *testing.T, pid int) (env []string, swaps string) {
	t.Helper()
	dir := t.TempDir()
	swaps = filepath.Join(dir, "swaps")
	writeSwaps(t, swaps, true)
	blk := filepath.Join(dir, "block", "nbd7")
	if err := os.MkdirAll(blk, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(blk, "pid"), []byte(strconv.Itoa(pid)+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	return []string{"GZRAMD_FAULT_PROC_SWAPS=" + swaps, "GZRAMD_FAULT_SYS_BLOCK=" + filepath.Join(dir, "block")}, swaps
}

func writeSwaps(t *testing.T, path string, active bool) {
	t.Helper()
	s := "Filename\t\t\t\tType\t\tSize\t\tUsed\t\tPriority\n/dev/sda3                               partition\t8388604\t\t0\t\t-2\n"
	if active {
		s += "/dev/nbd7                               partition\t1048572\t\t40960\t\t100\n"
	}
	if err := os.WriteFile(path+".tmp", []byte(s), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(path+".tmp", path); err != nil {
		t.Fatal(err)
	}
}

func TestStopRefusedWhileExportIsSwap(t *testing.T) {
	env, swaps := fakeKernel(t, os.Getpid())
	d := startDaemon(t, env, hardeningOff...)
	dialRaw(t, d.socket) // the "kernel's" connection, from this process
	time.Sleep(100 * time.Millisecond)

	out, _, code := gzramd(t, nil, "status", "--metrics", d.metrics)
	if code != 0 || !strings.Contains(out, "/dev/nbd7") || !strings.HasSuffix(strings.Split(out, "\n")[1], "yes") {
		t.Errorf("status does not show /dev/nbd7 as swap:\n%s", out)
	}
	// Who is connected: this process, over the Unix socket, not the
	// serving process's own (kernel) connection.
	if !strings.Contains(out, "NBD connections: 1 (0 the kernel device's, 1 other clients)") ||
		!regexp.MustCompile(fmt.Sprintf(`(?m)^  unix +unix:\S+ +pid %d uid %d +no +\S+ since `, os.Getpid(), os.Getuid())).MatchString(out) {
		t.Errorf("status does not list this process's connection:\n%s", out)
	}
	f := d.scrape()
	if v, _ := f.Value("gzramd_nbd_connections", "client", "other"); v != 1 {
		t.Errorf(`gzramd_nbd_connections{client="other"} = %v, want 1`, v)
	}
	if v, ok := f.Value("gzramd_nbd_connections", "client", "kernel"); !ok || v != 0 {
		t.Errorf(`gzramd_nbd_connections{client="kernel"} = %v (present: %v), want 0`, v, ok)
	}
	if err := d.cmd.Process.Signal(sigterm); err != nil {
		t.Fatal(err)
	}
	d.waitLog(`refusing to stop: the export is active swap.*device=/dev/nbd7.*fix="swapoff /dev/nbd7"`, 10*time.Second)
	select {
	case <-d.done:
		t.Fatalf("gzramd stopped while its export was active swap:\n%s", d.log.String())
	case <-time.After(500 * time.Millisecond):
	}
	// Still serving.
	if _, _, code := gzramd(t, nil, "status", "--metrics", d.metrics); code != 0 {
		t.Error("status failed while the stop was refused")
	}
	// Once the operator runs swapoff, the pending stop goes ahead.
	writeSwaps(t, swaps, false)
	if code := d.wait(20 * time.Second); code != 0 {
		t.Errorf("exit status %d after swapoff", code)
	}
}

func TestForceStopsWhileExportIsSwap(t *testing.T) {
	env, _ := fakeKernel(t, os.Getpid())
	d := startDaemon(t, env, append(hardeningOff, "--force")...)
	dialRaw(t, d.socket)
	time.Sleep(100 * time.Millisecond)
	if code := d.stop(sigterm); code != 0 {
		t.Errorf("exit status %d", code)
	}
	if !strings.Contains(d.log.String(), "--force: stopping while the export is active swap") {
		t.Errorf("no warning about stopping under swap:\n%s", d.log.String())
	}
}

// A swap device set up by another process, not connected to us, is not ours.
func TestOtherSwapDoesNotBlockStop(t *testing.T) {
	env, _ := fakeKernel(t, 1)
	d := startDaemon(t, env, hardeningOff...)
	dialRaw(t, d.socket)
	time.Sleep(100 * time.Millisecond)
	if code := d.stop(sigterm); code != 0 {
		t.Errorf("exit status %d", code)
	}
}

// TestSystemdNotify plays systemd: a notify socket, a watchdog, a stop.
func TestSystemdNotify(t *testing.T) {
	fake := listenNotify(t, false)
	expect := func(prefix string) {
		t.Helper()
		if _, ok := fake.expect(prefix, 10*time.Second); !ok {
			t.Fatalf("no %q from the daemon", prefix)
		}
	}
	d := startDaemon(t, []string{"NOTIFY_SOCKET=" + fake.addr, "WATCHDOG_USEC=200000"}, hardeningOff...)
	expect("READY=1")
	expect("WATCHDOG=1")
	expect("WATCHDOG=1")
	if code := d.stop(sigterm); code != 0 {
		t.Errorf("exit status %d", code)
	}
	expect("STOPPING=1")
}

func httpGet(url string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return fetch(ctx, url)
}

// TestHardeningReportsEachStep starts the daemon hardened, as it runs in
// production: every step is logged as done or failed with a reason, and
// --require-hardening turns a failure into a refusal to start.
func TestHardeningReportsEachStep(t *testing.T) {
	// A plain export reports a failed step only at DEBUG, under one INFO
	// line for them all.
	d := startDaemon(t, nil, "--log-level", "debug")
	log := d.log.String()
	failed := []string{}
	for _, step := range []string{"mlockall", "io_flusher", "oom_score_adj", "go_memory_limit", "heap_reserve", "thread_reserve"} {
		switch {
		case strings.Contains(log, "msg=hardening step="+step+" done="):
		case regexp.MustCompile(`msg="hardening step failed; gzramd serves without it[^"]*" step=` + step + ` err=.* without_it="[^"]+"`).MatchString(log):
			// A failure says what serving swap risks without the step.
			failed = append(failed, step)
		default:
			t.Errorf("no report for hardening step %s", step)
		}
	}
	t.Logf("hardening steps that fail on this machine: %v", failed)
	if strings.Contains(log, "level=WARN msg=\"hardening step failed") || strings.Contains(log, "level=WARN msg=\"supervisor hardening step failed") {
		t.Errorf("a plain export warns of a hardening step:\n%s", log)
	}
	if summary := strings.Contains(log, "hardening steps skipped; fine for trying gzramd, not for swap") ||
		strings.Contains(log, "hardening step skipped; fine for trying gzramd, not for swap"); summary != (len(failed) > 0) {
		t.Errorf("the one-line summary of steps skipped: logged %v, with %d failed:\n%s", summary, len(failed), log)
	}
	if code := d.stop(sigterm); code != 0 {
		t.Errorf("exit status %d", code)
	}

	args := []string{"serve", "--socket", filepath.Join(t.TempDir(), "s"), "--metrics", "127.0.0.1:0", "--require-hardening"}
	if len(failed) == 0 {
		testneeds.Machine(t, "a hardening step that fails, and every one works here: --require-hardening would start the daemon, so its refusal is not checked")
	}
	_, stderr, code := gzramd(t, nil, args...)
	last := stderr[strings.LastIndex(strings.TrimSpace(stderr), "\n")+1:]
	if code != 1 || !strings.HasPrefix(last, "gzramd: --require-hardening: ") {
		t.Errorf("--require-hardening with %v failing: status %d, stderr:\n%s", failed, code, stderr)
	}
	for _, step := range failed {
		if !strings.Contains(last, step) {
			t.Errorf("the refusal does not name %s: %q", step, last)
		}
	}
}

func TestDeviceWithoutNBDModule(t *testing.T) {
	if _, err := os.Stat("/sys/module/nbd"); err == nil {
		testneeds.Machine(t, "no nbd module, and it is loaded here: --device would really attach (the e2e VM test covers that)")
	}
	for _, args := range [][]string{{"--device", "/dev/nbd0"}, {"--swap"}} {
		full := append([]string{"serve", "--socket", filepath.Join(t.TempDir(), "s"), "--metrics", "127.0.0.1:0", "--harden=false"}, args...)
		_, stderr, code := gzramd(t, nil, full...)
		last := stderr[strings.LastIndex(strings.TrimSpace(stderr), "\n")+1:]
		if code != 1 || !strings.Contains(last, "--device") || !strings.Contains(last, "modprobe nbd") {
			t.Errorf("%v without the nbd module: status %d, last line %q", args, code, last)
		}
		if !strings.Contains(stderr, "msg=stopped") {
			t.Errorf("%v: the daemon did not stop cleanly after the failed attach:\n%s", args, stderr)
		}
	}
}
