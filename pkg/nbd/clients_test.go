package nbd

import (
	"bytes"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"

	"github.com/gzramd/gzramd/internal/testneeds"

	"github.com/gzramd/gzramd/pkg/nbd/nbdtest"
)

// These tests drive the server with real NBD clients from Debian (libnbd-bin,
// python3-libnbd, qemu-utils, fio), skipping when a tool is absent.

// runTool runs a client with /usr/bin first on PATH: nbdsh must find the
// system python3 (with the libnbd module), not a virtualenv's.
func runTool(t *testing.T, name string, args ...string) string {
	t.Helper()
	cmd := exec.Command(name, args...)
	cmd.Dir = t.TempDir() // fio leaves verify state files in its working directory
	cmd.Env = append(os.Environ(), "PATH=/usr/bin:/bin:/usr/sbin:/sbin:"+os.Getenv("PATH"), "LIBNBD_DEBUG=0")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return string(out)
}

func TestNbdinfo(t *testing.T) {
	testneeds.Command(t, "nbdinfo", "libnbd-bin")
	base := runtime.NumGoroutine()
	mem := nbdtest.NewMemBackend(3 << 20)
	ts := startServer(t, []Export{
		{Name: "swap", Description: "gzramd test", Backend: mem},
		{Name: "other", Backend: nbdtest.NewMemBackend(1 << 20)},
	}, Options{})

	var info struct {
		Protocol string `json:"protocol"`
		Exports  []struct {
			Name         string `json:"export-name"`
			Description  string `json:"description"`
			Size         int64  `json:"export-size"`
			Rotational   bool   `json:"is_rotational"`
			ReadOnly     bool   `json:"is_read_only"`
			CanFlush     bool   `json:"can_flush"`
			CanFUA       bool   `json:"can_fua"`
			CanMultiConn bool   `json:"can_multi_conn"`
			CanTrim      bool   `json:"can_trim"`
			CanZero      bool   `json:"can_zero"`
			BlockMin     int    `json:"block_size_minimum"`
			BlockPref    int    `json:"block_size_preferred"`
			BlockMax     int    `json:"block_size_maximum"`
		} `json:"exports"`
	}
	out := runTool(t, "nbdinfo", "--json", ts.uri("swap"))
	if err := json.Unmarshal([]byte(out), &info); err != nil {
		t.Fatalf("nbdinfo output: %v\n%s", err, out)
	}
	if info.Protocol != "newstyle-fixed" || len(info.Exports) != 1 {
		t.Fatalf("nbdinfo: %+v", info)
	}
	e := info.Exports[0]
	if e.Name != "swap" || e.Size != 3<<20 || e.Description != "gzramd test" {
		t.Errorf("export: name %q size %d description %q", e.Name, e.Size, e.Description)
	}
	if e.Rotational || e.ReadOnly || !e.CanFlush || !e.CanFUA || !e.CanMultiConn || !e.CanTrim || !e.CanZero {
		t.Errorf("flags: %+v", e)
	}
	// nbdinfo is another process's client, not the kernel device's.
	if e.BlockMin != 1 || e.BlockPref != 4096 || e.BlockMax != otherMaxPayload {
		t.Errorf("block sizes min %d pref %d max %d, want 1 4096 %d", e.BlockMin, e.BlockPref, e.BlockMax, otherMaxPayload)
	}

	// The empty name reaches the first export; --list shows both.
	out = runTool(t, "nbdinfo", "--size", ts.uri(""))
	if strings.TrimSpace(out) != fmt.Sprint(3<<20) {
		t.Errorf("default export size %q", out)
	}
	out = runTool(t, "nbdinfo", "--list", "--json", ts.uri(""))
	if !strings.Contains(out, `"swap"`) || !strings.Contains(out, `"other"`) {
		t.Errorf("--list lacks exports:\n%s", out)
	}
	// An unknown export is refused politely (NBD_REP_ERR_UNKNOWN).
	cmd := exec.Command("nbdinfo", ts.uri("nosuch"))
	if out, err := cmd.CombinedOutput(); err == nil {
		t.Errorf("nbdinfo of unknown export succeeded:\n%s", out)
	}
	ts.shutdown(t)
	checkGoroutines(t, base)
}

func TestNbdsh(t *testing.T) {
	testneeds.Command(t, "nbdsh", "python3-libnbd")
	mem := nbdtest.NewMemBackend(8 << 20)
	ts := startServer(t, []Export{{Name: "d", Backend: mem}}, Options{})
	script := `
import nbd, os, random
h.connect_uri(URI)
size = h.get_size()
assert size == 8 << 20, size
assert h.can_flush() and h.can_fua() and h.can_trim() and h.can_zero() and h.can_multi_conn()

# Unaligned write and read back, FUA, flush.
buf = os.urandom(10000)
h.pwrite(buf, 12345, nbd.CMD_FLAG_FUA)
assert h.pread(10000, 12345) == buf
h.flush()

# Trim and write zeroes (with and without NO_HOLE) read back as zero.
h.pwrite(b"\xff" * 65536, 1 << 20)
h.trim(4096, (1 << 20) + 4096)
assert h.pread(4096, (1 << 20) + 4096) == bytes(4096)
assert h.pread(4096, (1 << 20) + 8192) == b"\xff" * 4096
h.zero(8192, (1 << 20) + 8192)
h.zero(8192, (1 << 20) + 16384, nbd.CMD_FLAG_NO_HOLE)
assert h.pread(65536 - 24576, (1 << 20) + 24576) == b"\xff" * (65536 - 24576)
assert h.pread(24576, (1 << 20)) == b"\xff" * 4096 + bytes(20480)

# Out-of-range requests fail with the spec's errors; the connection lives on.
def expect(errno, f):
    try:
        f()
    except nbd.Error as e:
        assert e.errno == E.errorcode[errno], (e.errno, errno, e)
    else:
        raise AssertionError("no error")
import errno as E
h.set_strict_mode(0)
expect(E.EINVAL, lambda: h.pread(4096, size - 4095))
expect(E.ENOSPC, lambda: h.pwrite(b"x" * 4096, size - 4095))
expect(E.EINVAL, lambda: h.trim(4096, size))
expect(E.ENOSPC, lambda: h.zero(8192, size - 4096))
expect(E.EINVAL, lambda: h.pread(4096, 1 << 62))
assert h.pread(4096, size - 4096) == bytes(4096)

# Many requests in flight at once, checked against a model.
model = bytearray(h.pread(1 << 20, 0))
cookies = []
# Writes in flight together may complete in any order, so each goes to
# its own 4 KiB slot.
for slot in random.sample(range(256), 256):
    n = random.choice([512, 4096, 3000, 1])
    off = slot * 4096 + random.randrange(0, 4096 - n + 1)
    data = os.urandom(n)
    model[off:off + len(data)] = data
    cookies.append(h.aio_pwrite(data, off))
    h.poll(0)
    while h.aio_in_flight() >= 64:
        h.poll(-1)
while h.aio_in_flight() > 0:
    h.poll(-1)
for c in cookies:
    assert h.aio_command_completed(c)
bufs = [nbd.Buffer(4096) for _ in range(256)]
rc = [h.aio_pread(bufs[i], i * 4096) for i in range(256)]
while h.aio_in_flight() > 0:
    h.poll(-1)
got = b"".join(b.to_bytearray() for b in bufs)
assert got == bytes(model), "aio reads differ from model"
h.shutdown()
print("ok")
`
	out := runTool(t, "nbdsh", "-c", "URI = "+fmt.Sprintf("%q", ts.uri("d")), "-c", script)
	if strings.TrimSpace(out) != "ok" {
		t.Fatalf("nbdsh: %s", out)
	}
	if mem.Flushes() == 0 {
		t.Error("flush never reached the backend")
	}
}

func TestNbdcopyRoundTrip(t *testing.T) {
	testneeds.Command(t, "nbdcopy", "libnbd-bin")
	const size = 16 << 20
	mem := nbdtest.NewMemBackend(size)
	ts := startServer(t, []Export{{Name: "d", Backend: mem}}, Options{})
	dir := t.TempDir()
	src := make([]byte, size)
	rand.Read(src[:size/2]) // the second half stays zero: sparse handling
	in := filepath.Join(dir, "in.img")
	outFile := filepath.Join(dir, "out.img")
	if err := os.WriteFile(in, src, 0o600); err != nil {
		t.Fatal(err)
	}
	// Four connections, many requests each.
	runTool(t, "nbdcopy", "--connections=4", "--requests=32", in, ts.uri("d"))
	if !bytes.Equal(mem.Snapshot(), src) {
		t.Fatal("backend differs from source after nbdcopy in")
	}
	runTool(t, "nbdcopy", "--connections=4", ts.uri("d"), outFile)
	got, err := os.ReadFile(outFile)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, src) {
		t.Fatal("nbdcopy out differs from source")
	}
	// Requests of the largest payload another client is told
	// (otherMaxPayload). nbdcopy 1.14 told to send larger ones sends them
	// all the same, and stops at the first with the server's EINVAL.
	os.Remove(outFile)
	runTool(t, "nbdcopy", "--request-size="+strconv.Itoa(otherMaxPayload), in, ts.uri("d"))
	runTool(t, "nbdcopy", "--request-size="+strconv.Itoa(otherMaxPayload), ts.uri("d"), outFile)
	if got, err = os.ReadFile(outFile); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, src) {
		t.Fatalf("nbdcopy out with requests of %d bytes differs from source", otherMaxPayload)
	}
}

func TestQemu(t *testing.T) {
	testneeds.Command(t, "qemu-io", "qemu-utils")
	testneeds.Command(t, "qemu-img", "qemu-utils")
	mem := nbdtest.NewMemBackend(4 << 20)
	ts := startServer(t, []Export{{Name: "q", Backend: mem}}, Options{})
	uri := ts.uri("q")
	runTool(t, "qemu-io", "-f", "raw",
		"-c", "write -P 0xab 0 1M",
		"-c", "write -P 0xcd 777 5000",
		"-c", "write -z 2M 64k",
		"-c", "discard 3M 128k",
		"-c", "flush",
		uri)
	out := runTool(t, "qemu-io", "-f", "raw",
		"-c", "read -P 0xab 0 777",
		"-c", "read -P 0xcd 777 5000",
		"-c", "read -P 0 2M 64k",
		"-c", "read -P 0 3M 128k",
		uri)
	if strings.Contains(out, "Pattern verification failed") || strings.Contains(out, "failed") {
		t.Fatalf("qemu-io verify: %s", out)
	}
	data := mem.Snapshot()
	if data[776] != 0xab || data[777] != 0xcd || data[777+4999] != 0xcd || data[777+5000] != 0xab {
		t.Fatal("qemu-io writes not in backend")
	}

	dir := t.TempDir()
	img := filepath.Join(dir, "copy.raw")
	runTool(t, "qemu-img", "convert", "-f", "raw", "-O", "raw", uri, img)
	got, err := os.ReadFile(img)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, data) {
		t.Fatal("qemu-img convert from NBD differs")
	}
	out = runTool(t, "qemu-img", "compare", "-f", "raw", "-F", "raw", img, uri)
	if !strings.Contains(out, "identical") {
		t.Fatalf("qemu-img compare: %s", out)
	}
}

func TestFioVerify(t *testing.T) {
	testneeds.Command(t, "fio", "fio")
	mem := nbdtest.NewMemBackend(32 << 20)
	ts := startServer(t, []Export{{Name: "f", Backend: mem}}, Options{})
	size := "32M"
	if testing.Short() {
		size = "8M"
	}
	out := runTool(t, "fio", "--name=verify", "--ioengine=nbd", "--uri="+ts.uri("f"),
		"--rw=randwrite", "--bs=4k", "--iodepth=32", "--size="+size,
		"--verify=crc32c", "--do_verify=1", "--verify_fatal=1", "--numjobs=1",
		"--output-format=terse")
	if !strings.Contains(out, ";") {
		t.Fatalf("fio output: %s", out)
	}
	// Two jobs on separate connections, mixed sizes, to different regions.
	runTool(t, "fio", "--name=mixed", "--ioengine=nbd", "--uri="+ts.uri("f"),
		"--rw=randwrite", "--bssplit=4k/70:16k/20:64k/10", "--iodepth=16", "--size=8M",
		"--numjobs=2", "--offset_increment=12M",
		"--verify=crc32c", "--do_verify=1", "--verify_fatal=1", "--output-format=terse")
}
