package main

import (
	"bufio"
	"bytes"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gzramd/gzramd/internal/fiotest"
	"github.com/gzramd/gzramd/internal/testneeds"
)

// TestRecordTraceReplaysWithFio records what real clients send to the
// daemon with --record-trace, stops it with SIGTERM, and replays the
// trace with fio on a second daemon, which must then have received the
// same requests.
func TestRecordTraceReplaysWithFio(t *testing.T) {
	needFioNBD(t)
	trace := filepath.Join(t.TempDir(), "trace.iolog")
	d := startDaemon(t, nil, append(hardeningOff, "--size", "64MiB", "--backend", "cpu", "--record-trace", trace)...)

	// fio: random 4 KiB reads and writes with a flush every 64 writes.
	fio(t, "--name=load", "--ioengine=nbd", "--uri="+d.uri(), "--rw=randrw", "--bs=4k", "--size=4M",
		"--iodepth=16", "--fsync=64", "--output="+filepath.Join(t.TempDir(), "load.json"))
	// nbdsh, where there is one: requests of known shape.
	nbdsh := false
	if _, ok := testneeds.CommandFor(t, "nbdsh", "python3-libnbd", "requests of known shape not sent, nor looked for in the trace"); ok {
		runClient(t, nil, "nbdsh", "-u", d.uri(),
			"-c", "h.pwrite(b'x' * 131072, 1048576)", "-c", "h.pread(32768, 1052672)",
			"-c", "h.trim(65536, 2097152)", "-c", "h.zero(8192, 3145728)", "-c", "h.flush()")
		nbdsh = true
	}
	m := d.scrape()
	if code := d.stop(sigterm); code != 0 {
		t.Fatalf("exit status %d after SIGTERM", code)
	}

	lines, counts := readTrace(t, trace)
	servedBy := func(cmd string) int {
		v, _ := m.Value("gzramd_nbd_requests_total", "command", cmd)
		return int(v)
	}
	want := map[string]int{
		"read": servedBy("read"), "write": servedBy("write"), "sync": servedBy("flush"),
		"trim": servedBy("trim") + servedBy("write_zeroes"),
	}
	for action, n := range want {
		if counts[action] != n {
			t.Errorf("trace holds %d %s lines, the daemon served %d: trace %v, served %v", counts[action], action, n, counts, want)
		}
	}
	if want["read"] < 100 || want["write"] < 100 || want["sync"] < 1 {
		t.Fatalf("too little traffic to test with: %v", want)
	}
	if nbdsh {
		for _, l := range []string{"gzram0 write 1048576 131072", "gzram0 read 1052672 32768",
			"gzram0 trim 2097152 65536", "gzram0 trim 3145728 8192", "gzram0 sync 0 0"} {
			if !lines[l] {
				t.Errorf("trace lacks %q", l)
			}
		}
	}
	total := counts["read"] + counts["write"] + counts["sync"] + counts["trim"]
	d.waitLog(fmt.Sprintf(`msg="trace closed" file=%s requests=%d dropped=0`, trace, total), time.Second)

	// The replay: every request of the trace reaches the second daemon.
	// One at a time: at the end of a trace fio does not wait for the
	// requests still in flight, and its nbd engine may never send them.
	// No replay_redirect: the nbd engine ignores file names, and with
	// more than one job fio 3.33 crashes on it.
	r := startDaemon(t, nil, append(hardeningOff, "--size", "64MiB", "--backend", "cpu")...)
	report := filepath.Join(t.TempDir(), "replay.json")
	stderr := fio(t, "--name=replay", "--ioengine=nbd", "--uri="+r.uri(), "--read_iolog="+trace,
		"--replay_no_stall=1", "--iodepth=1",
		"--buffer_compress_percentage=50", "--buffer_compress_chunk=4096",
		"--output-format=json", "--output="+report)
	data, err := os.ReadFile(report)
	if err != nil {
		t.Fatal(err)
	}
	issued := fiotest.Issued(t, data)
	trims := fiotest.ReplaysTrims(t, "fio")
	replayWant := map[string]int{"read": counts["read"], "write": counts["write"], "sync": counts["sync"], "trim": counts["trim"]}
	if !trims {
		replayWant["trim"] = 0
	}
	commands := map[string]string{"read": "read", "write": "write", "sync": "flush", "trim": "trim"}
	// The daemon counts a request once its reply is out: the last ones
	// may be counted just after fio has exited.
	var served map[string]int
	for deadline := time.Now().Add(5 * time.Second); ; {
		m := r.scrape()
		served = map[string]int{}
		for action, cmd := range commands {
			v, _ := m.Value("gzramd_nbd_requests_total", "command", cmd)
			served[action] = int(v)
		}
		if maps.Equal(served, replayWant) || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if !maps.Equal(served, replayWant) || !maps.Equal(issued, replayWant) {
		t.Errorf("replaying a trace of %v: fio issued %v, the daemon served %v; want %v", counts, issued, served, replayWant)
	}
	// fio before 3.34 skips each trim with "bad ddir: 2"; nothing else
	// may complain.
	if !trims {
		stderr = strings.Replace(stderr, "bad ddir: 2\n", "", counts["trim"])
	}
	stderr = strings.ReplaceAll(stderr, "fio: connected to NBD server\n", "")
	if strings.TrimSpace(stderr) != "" {
		t.Errorf("fio complained while replaying:\n%s", stderr)
	}
}

// needFioNBD skips the test unless fio with its nbd engine is here.
func needFioNBD(t *testing.T) {
	t.Helper()
	fio := testneeds.Command(t, "fio", "fio")
	if err := exec.Command(fio, "--enghelp=nbd").Run(); err != nil {
		testneeds.Skip(t, testneeds.KindPackage, "fio", "the fio here (%s) has no nbd engine: Debian's fio has it (apt-get install fio)", fio)
	}
}

// fio runs fio to completion and returns what it wrote on stderr.
func fio(t *testing.T, args ...string) string {
	t.Helper()
	cmd := exec.Command("fio", args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("fio %s: %v\n%s%s", strings.Join(args, " "), err, stdout.String(), stderr.String())
	}
	return stderr.String()
}

// readTrace checks that path is a whole fio iolog (version 2) and returns
// its lines and its I/O lines counted by action.
func readTrace(t *testing.T, path string) (map[string]bool, map[string]int) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var all []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		all = append(all, sc.Text())
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if len(all) < 4 || all[0] != "fio version 2 iolog" || all[1] != "gzram0 add" || all[2] != "gzram0 open" || all[len(all)-1] != "gzram0 close" {
		t.Fatalf("%s is not a whole iolog: %d lines, %q ... %q", path, len(all), all[:min(3, len(all))], all[len(all)-1])
	}
	lines := map[string]bool{}
	counts := map[string]int{}
	for _, l := range all[3 : len(all)-1] {
		f := strings.Fields(l)
		if len(f) != 4 || f[0] != "gzram0" {
			t.Fatalf("bad trace line %q", l)
		}
		for _, n := range f[2:] {
			if _, err := strconv.ParseUint(n, 10, 64); err != nil {
				t.Fatalf("bad trace line %q: %v", l, err)
			}
		}
		lines[l] = true
		counts[f[1]]++
	}
	return lines, counts
}
