package nbddev

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func TestReconfigureAttrsEncoding(t *testing.T) {
	littleEndian(t)
	got := reconfigureAttrs(reconfigureRequest{
		index: 2, timeoutSec: 10, deadConnSec: 0, backendID: "ab", fds: []int{7},
	})
	want := le(
		uint16(8), uint16(nbdAttrIndex), uint32(2),
		uint16(12), uint16(nbdAttrTimeout), uint64(10),
		// A zero dead-connection timeout is sent: a reconfigure that
		// omitted it would leave the kernel's old value in place.
		uint16(12), uint16(nbdAttrDeadConnTimeout), uint64(0),
		uint16(7), uint16(nbdAttrBackendIdentifier), []byte("ab\x00"), []byte{0},
		uint16(4+12), uint16(nbdAttrSockets|unix.NLA_F_NESTED),
		uint16(12), uint16(nbdSockItem|unix.NLA_F_NESTED), uint16(8), uint16(nbdSockFD), uint32(7),
	)
	if !bytes.Equal(got, want) {
		t.Fatalf("NBD_CMD_RECONFIGURE attributes\n got %x\nwant %x", got, want)
	}
	attrs, err := parseAttrs(got)
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range attrs {
		if a.typ == nbdAttrSizeBytes || a.typ == nbdAttrClientFlags {
			t.Errorf("reconfigure carries attribute %d: it would resize the device or rewrite its flags", a.typ)
		}
	}
}

// fakeSys is a temporary directory for the test to describe devices in,
// as sysfs would (fakeNBD).
func fakeSys(t *testing.T) sysfs { return sysfs(t.TempDir()) }

// fakeNBD makes /sys/block/nbdN as the kernel shows it; backend nil means
// no backend file, queues the hardware queue count.
func fakeNBD(t *testing.T, dir string, index int, connected bool, backend *string, sectors string, queues int) {
	d := filepath.Join(dir, "nbd"+strconv.Itoa(index))
	must := func(err error) {
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.MkdirAll(filepath.Join(d, "mq"), 0o755))
	must(os.WriteFile(filepath.Join(d, "size"), []byte(sectors+"\n"), 0o644))
	if connected {
		must(os.WriteFile(filepath.Join(d, "pid"), []byte("99\n"), 0o644))
	}
	if backend != nil {
		must(os.WriteFile(filepath.Join(d, "backend"), []byte(*backend+"\n"), 0o644))
	}
	for q := range queues {
		must(os.MkdirAll(filepath.Join(d, "mq", strconv.Itoa(q)), 0o755))
	}
}

func TestFindKernelDevice(t *testing.T) {
	sys := fakeSys(t)
	dir := string(sys)
	ours, other, empty := "nbd+unix:///g?socket=/s", "nbd://h:1/x", ""
	fakeNBD(t, dir, 0, true, &other, "2048", 1)
	fakeNBD(t, dir, 1, false, &ours, "0", 1) // ours once, now disconnected
	fakeNBD(t, dir, 2, true, &ours, "1048576", 2)
	fakeNBD(t, dir, 3, true, nil, "2048", 1) // ioctl, or a kernel before 5.14
	fakeNBD(t, dir, 4, true, &empty, "2048", 1)
	if n, err := sys.find(ours); err != nil || n != 2 {
		t.Errorf("find(ours) = %d, %v; want 2", n, err)
	}
	if _, err := sys.find("nbd://nobody/"); !errors.Is(err, ErrNoDevice) {
		t.Errorf("unknown backend: %v, want ErrNoDevice", err)
	}
	if _, err := sys.find(""); err == nil {
		t.Error("empty backend identifier accepted")
	}
	if n, err := sys.deviceConnections(2); err != nil || n != 2 {
		t.Errorf("deviceConnections(2) = %d, %v; want 2", n, err)
	}
	if b, err := sys.deviceSize(2); err != nil || b != 512<<20 {
		t.Errorf("deviceSize(2) = %d, %v", b, err)
	}
	fakeNBD(t, dir, 5, true, &ours, "1048576", 1)
	if _, err := sys.find(ours); err == nil || !strings.Contains(err.Error(), "[2 5]") {
		t.Errorf("two devices with one backend: %v, want both named", err)
	}
}

func TestReattachKernelRefuses(t *testing.T) {
	sys := fakeSys(t)
	dir := string(sys)
	ours, other := "nbd+unix:///g?socket=/s", "nbd://h:1/x"
	fakeNBD(t, dir, 0, true, &other, "2048", 1)
	fakeNBD(t, dir, 1, false, &ours, "0", 1)
	ctx := context.Background()
	for _, tc := range []struct {
		opts Options
		want string
		is   error
	}{
		{Options{Index: AnyIndex, BackendID: ours}, "no connected kernel device", ErrNoDevice},
		{Options{Index: 1, BackendID: ours}, "not connected", ErrNoDevice},
		{Options{Index: 0, BackendID: ours}, "its backend is", nil},
		{Options{Index: 7, BackendID: ours}, "nbd7", nil},
		{Options{Index: 0, BackendID: other, Timeout: -time.Second}, "no request timeout", ErrNotSurvivable},
	} {
		tc.opts.SysBlock = dir
		_, err := Reattach(ctx, tc.opts)
		if err == nil || !strings.Contains(err.Error(), tc.want) || (tc.is != nil && !errors.Is(err, tc.is)) {
			t.Errorf("Reattach(%+v): %v; want an error about %q", tc.opts, err, tc.want)
		}
	}
}

func TestSurvivesRestart(t *testing.T) {
	nl := &Device{Path: "/dev/nbd0", Netlink: true, opts: Options{DeadConnTimeout: time.Minute}}
	if err := nl.SurvivesRestart(); err != nil {
		t.Errorf("netlink device with timeouts: %v", err)
	}
	for name, d := range map[string]*Device{
		"ioctl":   {Path: "/dev/nbd0", opts: Options{DeadConnTimeout: time.Minute}},
		"no dead": {Path: "/dev/nbd0", Netlink: true, opts: Options{DeadConnTimeout: -1}},
		"no req":  {Path: "/dev/nbd0", Netlink: true, opts: Options{DeadConnTimeout: time.Minute, Timeout: -1}},
	} {
		if err := d.SurvivesRestart(); !errors.Is(err, ErrNotSurvivable) {
			t.Errorf("%s: SurvivesRestart() = %v, want ErrNotSurvivable", name, err)
		}
	}
	// Reconnect refuses an ioctl device before dialing anything.
	io := &Device{Path: "/dev/nbd0", opts: Options{Network: "unix", Address: "/nonexistent"}}
	if err := io.Reconnect(context.Background(), 1); !errors.Is(err, ErrNotSurvivable) || strings.Contains(err.Error(), "dial") {
		t.Errorf("Reconnect on an ioctl device: %v, want ErrNotSurvivable", err)
	}
}

// TestKernelKept checks the test Reconnect relies on, as far as it can
// without the kernel: a socket starts with no send timeout once cleared,
// and shows one once set (as nbd_reconnect_socket sets it).
func TestKernelKept(t *testing.T) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM, 0)
	if err != nil {
		t.Fatal(err)
	}
	f := os.NewFile(uintptr(fds[0]), "a")
	defer f.Close()
	defer unix.Close(fds[1])
	if kept, err := kernelKept(f); err != nil || kept {
		t.Fatalf("fresh socket: kept %v, %v", kept, err)
	}
	if err := unix.SetsockoptTimeval(fds[0], unix.SOL_SOCKET, unix.SO_SNDTIMEO, &unix.Timeval{Sec: 10}); err != nil {
		t.Fatal(err)
	}
	if kept, err := kernelKept(f); err != nil || !kept {
		t.Fatalf("socket with a send timeout: kept %v, %v", kept, err)
	}
}

// TestLimitRequestsLeavesALimitInPlace: a limit the device already has is
// not written again (on Linux 6.11+ the write freezes the queue until the
// requests in flight complete, which a serving process that just took the
// device over must not wait for: test/e2e survive), and a different one
// is written.
func TestLimitRequestsLeavesALimitInPlace(t *testing.T) {
	sys := fakeSys(t)
	dir := string(sys)
	q := filepath.Join(dir, "nbd3", "queue")
	if err := os.MkdirAll(q, 0o755); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(q, "max_sectors_kb")
	d := &Device{Index: 3, Path: "/dev/nbd3", opts: Options{SysBlock: dir}}
	for _, c := range []struct{ had, want string }{
		{"128\n", "128\n"}, // as the kernel shows it: left alone
		{"1280\n", "128"},  // written
	} {
		if err := os.WriteFile(path, []byte(c.had), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := d.LimitRequests(128 << 10); err != nil {
			t.Fatal(err)
		}
		got, _ := os.ReadFile(path)
		if string(got) != c.want {
			t.Errorf("max_sectors_kb %q, limited to 128 KiB: file now %q, want %q", c.had, got, c.want)
		}
	}
}
