package nbddev

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/gzramd/gzramd/internal/testneeds"
	"github.com/gzramd/gzramd/pkg/nbd"
	"github.com/gzramd/gzramd/pkg/nbd/nbdtest"
	"github.com/gzramd/gzramd/pkg/swapsafe"
)

// le builds expected netlink bytes (x86 and arm64 are little-endian; the
// test skips elsewhere).
func le(vals ...any) []byte {
	var b []byte
	for _, v := range vals {
		switch v := v.(type) {
		case uint16:
			b = append(b, byte(v), byte(v>>8))
		case uint32:
			b = append(b, byte(v), byte(v>>8), byte(v>>16), byte(v>>24))
		case uint64:
			for i := 0; i < 8; i++ {
				b = append(b, byte(v>>(8*i)))
			}
		case []byte:
			b = append(b, v...)
		}
	}
	return b
}

func littleEndian(t *testing.T) {
	if ne.Uint16([]byte{1, 0}) != 1 {
		testneeds.Machine(t, "a little-endian CPU: the expected bytes are written for one")
	}
}

func TestConnectAttrsEncoding(t *testing.T) {
	littleEndian(t)
	got := connectAttrs(connectRequest{
		index: 3, size: 1 << 30, blockSize: 4096, timeoutSec: 30,
		serverFlags: uint64(testFlags), fds: []int{7, 9},
	})
	want := le(
		uint16(8), uint16(nbdAttrIndex), uint32(3),
		uint16(12), uint16(nbdAttrSizeBytes), uint64(1<<30),
		uint16(12), uint16(nbdAttrBlockSizeBytes), uint64(4096),
		uint16(12), uint16(nbdAttrServerFlags), uint64(testFlags),
		uint16(12), uint16(nbdAttrTimeout), uint64(30),
		uint16(12), uint16(nbdAttrDeadConnTimeout), uint64(0),
		// NBD_ATTR_SOCKETS { NBD_SOCK_ITEM { NBD_SOCK_FD 7 }, NBD_SOCK_ITEM { NBD_SOCK_FD 9 } }
		uint16(4+2*12), uint16(nbdAttrSockets|unix.NLA_F_NESTED),
		uint16(12), uint16(nbdSockItem|unix.NLA_F_NESTED), uint16(8), uint16(nbdSockFD), uint32(7),
		uint16(12), uint16(nbdSockItem|unix.NLA_F_NESTED), uint16(8), uint16(nbdSockFD), uint32(9),
	)
	if !bytes.Equal(got, want) {
		t.Fatalf("NBD_CMD_CONNECT attributes\n got %x\nwant %x", got, want)
	}

	// No index: the kernel picks the device; optional attributes omitted,
	// but not the timeouts, whose absence would keep the last ones.
	got = connectAttrs(connectRequest{index: AnyIndex, size: 8192, blockSize: 4096, fds: []int{5}})
	attrs, err := parseAttrs(got)
	if err != nil {
		t.Fatal(err)
	}
	var types []uint16
	for _, a := range attrs {
		types = append(types, a.typ)
	}
	if want := []uint16{nbdAttrSizeBytes, nbdAttrBlockSizeBytes, nbdAttrServerFlags, nbdAttrTimeout, nbdAttrDeadConnTimeout, nbdAttrSockets}; !slices.Equal(types, want) {
		t.Fatalf("attribute types %v, want %v", types, want)
	}
	items, _ := parseAttrs(attrs[5].data)
	fd, _ := parseAttrs(items[0].data)
	if len(items) != 1 || items[0].typ != nbdSockItem || fd[0].typ != nbdSockFD || ne.Uint32(fd[0].data) != 5 {
		t.Fatalf("sockets nest: %+v / %+v", items, fd)
	}
}

func TestGenlMessageFraming(t *testing.T) {
	littleEndian(t)
	attrs := appendU32Attr(nil, nbdAttrIndex, 2)
	got := genlMessage(0x1a, 7, nbdCmdDisconnect, nbdGenlVersion, attrs)
	want := le(uint32(16+4+8), uint16(0x1a), uint16(unix.NLM_F_REQUEST|unix.NLM_F_ACK), uint32(7), uint32(0),
		[]byte{nbdCmdDisconnect, nbdGenlVersion, 0, 0}, attrs)
	if !bytes.Equal(got, want) {
		t.Fatalf("\n got %x\nwant %x", got, want)
	}
	// Attribute padding: a 5-byte string attribute takes 12 bytes.
	if b := appendAttr(nil, 2, []byte("nbd\x00!")); len(b) != 12 || ne.Uint16(b) != 9 {
		t.Fatalf("padded attribute %x", b)
	}
}

func TestParseNetlinkErrors(t *testing.T) {
	littleEndian(t)
	// An NLMSG_ERROR carrying -EBUSY, then garbage lengths.
	msg := le(uint32(16+4+16), uint16(unix.NLMSG_ERROR), uint16(0), uint32(1), uint32(0), uint32(0xfffffff0), make([]byte, 16))
	msgs, err := parseNetlinkMessages(msg)
	if err != nil || len(msgs) != 1 || msgs[0].typ != unix.NLMSG_ERROR || int32(ne.Uint32(msgs[0].data)) != -16 {
		t.Fatalf("%+v %v", msgs, err)
	}
	for _, bad := range [][]byte{
		le(uint32(100), uint16(1), uint16(0), uint32(0), uint32(0)),
		le(uint32(3), uint16(1), uint16(0), uint32(0), uint32(0)),
	} {
		if _, err := parseNetlinkMessages(bad); err == nil {
			t.Errorf("message %x parsed", bad)
		}
	}
	if _, err := parseAttrs(le(uint16(2), uint16(1))); err == nil {
		t.Error("attribute shorter than its header parsed")
	}
	if _, err := parseAttrs(le(uint16(40), uint16(1), uint32(0))); err == nil {
		t.Error("attribute longer than the buffer parsed")
	}
}

// TestGenlResolve talks to the real kernel: the generic-netlink controller
// always exists, and "nbd" exists exactly when the module is loaded.
func TestGenlResolve(t *testing.T) {
	g, err := dialGenl()
	if err != nil {
		testneeds.Machine(t, "generic netlink, which this kernel or sandbox refuses: %v", err)
	}
	defer g.Close()
	id, err := g.resolveFamily("nlctrl")
	if err != nil || id != unix.GENL_ID_CTRL {
		t.Fatalf("nlctrl: id %d, %v", id, err)
	}
	_, err = g.resolveFamily(nbdGenlFamily)
	_, statErr := os.Stat("/sys/module/nbd")
	switch {
	case statErr == nil && err != nil:
		t.Errorf("nbd module loaded but family not found: %v", err)
	case statErr != nil && !errors.Is(err, errNoNetlinkFamily):
		t.Errorf("nbd module absent: got %v, want errNoNetlinkFamily", err)
	}
}

func TestDeviceInUse(t *testing.T) {
	sys := fakeSys(t)
	dir := string(sys)
	mk := func(name, size string, pid bool) {
		d := filepath.Join(dir, name)
		os.MkdirAll(d, 0o755)
		os.WriteFile(filepath.Join(d, "size"), []byte(size+"\n"), 0o644)
		if pid {
			os.WriteFile(filepath.Join(d, "pid"), []byte("123\n"), 0o644)
		}
	}
	mk("nbd0", "2097152", true)
	mk("nbd1", "0", true) // connecting: pid before size
	mk("nbd2", "8", false)
	mk("nbd10", "0", false)
	mk("nbd3", "0", false)
	mk("sda", "0", false)
	for i, want := range map[int]bool{0: true, 1: true, 2: true, 3: false, 10: false} {
		if got, err := sys.inUse(i); err != nil || got != want {
			t.Errorf("nbd%d: in use %v (%v), want %v", i, got, err, want)
		}
	}
	if _, err := sys.inUse(7); err == nil || !strings.Contains(err.Error(), "module") {
		t.Errorf("missing device: %v", err)
	}
	if n, err := sys.findFree(); err != nil || n != 3 {
		t.Errorf("FindFree: %d, %v; want 3", n, err)
	}
	os.RemoveAll(filepath.Join(dir, "nbd3"))
	os.RemoveAll(filepath.Join(dir, "nbd10"))
	if _, err := sys.findFree(); err == nil {
		t.Error("FindFree found a device with all busy")
	}
}

func TestAttachKernelErrors(t *testing.T) {
	mem := nbdtest.NewMemBackend(1 << 20)
	ts := startServer(t, []nbd.Export{{Name: "d", Backend: mem}}, nbd.Options{})
	ctx := context.Background()
	for _, tc := range []struct {
		opts Options
		want string
	}{
		{Options{Network: "unix", Address: ts.sock, Export: "d", BlockSize: 3000}, "block size"},
		{Options{Network: "unix", Address: ts.sock, Export: "d", Connections: -1}, "connections"},
		{Options{Network: "unix", Address: ts.sock, Export: "nosuch"}, "connection 1 of 1"},
		{Options{Network: "unix", Address: ts.sock + ".missing", Export: "d"}, "dial"},
		{Options{Network: "unix", Address: ts.sock, Export: "d", Index: -5}, "index"},
	} {
		_, err := Attach(ctx, tc.opts)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: %v, want an error about %q", tc.opts, err, tc.want)
		}
	}
	if _, err := os.Stat("/sys/module/nbd"); err == nil {
		return // the live test below covers a loaded module
	}
	// Without the module: netlink has no family and the ioctl fallback
	// cannot open the device; the error says both.
	_, err := Attach(ctx, Options{Network: "unix", Address: ts.sock, Export: "d", Index: 0, Connections: 2})
	if err == nil || !strings.Contains(err.Error(), "netlink unavailable") || !strings.Contains(err.Error(), "/dev/nbd0") {
		t.Errorf("attach without nbd module: %v", err)
	}
}

// TestKernelAttachLive attaches real /dev/nbdN devices when the nbd module
// is loaded and we are root (testdata/kernelvm.sh runs it in a QEMU guest):
// netlink with several connections, reuse of a detached device, a busy
// device refused, and the ioctl fallback.
func TestKernelAttachLive(t *testing.T) {
	needKernelNBD(t)
	mem := nbdtest.NewMemBackend(64 << 20)
	ts := startServer(t, []nbd.Export{{Name: "k", Backend: mem}}, nbd.Options{})
	opts := Options{Network: "unix", Address: ts.sock, Export: "k", Index: AnyIndex, Connections: 4, Timeout: 30 * time.Second}

	d, err := Attach(context.Background(), opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("attached %s (netlink %v, %d bytes)", d.Path, d.Netlink, d.Size)
	if !d.Netlink {
		t.Error("a kernel with the nbd module loaded should take netlink")
	}
	exerciseKernelDevice(t, d, mem)

	// The device is busy: asking for it again by index is refused.
	busy := opts
	busy.Index = d.Index
	if _, err := Attach(context.Background(), busy); err == nil || !errors.Is(err, unix.EBUSY) {
		t.Errorf("attaching busy %s: %v, want EBUSY", d.Path, err)
	}
	start := time.Now()
	if err := d.Detach(); err != nil {
		t.Fatal(err)
	}
	waitFree(t, d.Index)
	t.Logf("netlink detach took %v", time.Since(start))

	// The same device again, by index, with one connection.
	again := opts
	again.Index, again.Connections = d.Index, 1
	d2, err := Attach(context.Background(), again)
	if err != nil {
		t.Fatalf("re-attaching %s: %v", d.Path, err)
	}
	exerciseKernelDevice(t, d2, mem)
	start = time.Now()
	if err := d2.Detach(); err != nil {
		t.Fatal(err)
	}
	waitFree(t, d2.Index)
	t.Logf("netlink detach took %v", time.Since(start))

	// The ioctl fallback.
	io1 := opts
	io1.Connections = 1
	io1.Ioctl = true
	start = time.Now()
	d3, err := Attach(context.Background(), io1)
	t.Logf("ioctl attach took %v", time.Since(start))
	if err != nil {
		t.Fatalf("ioctl attach: %v", err)
	}
	if d3.Netlink {
		t.Error("forced ioctl path reports netlink")
	}
	exerciseKernelDevice(t, d3, mem)
	start = time.Now()
	if err := d3.Detach(); err != nil {
		t.Fatal(err)
	}
	waitFree(t, d3.Index)
	t.Logf("ioctl detach took %v", time.Since(start))
}

// exerciseKernelDevice writes, reads, flushes and discards through the
// kernel's block device and checks the backend saw it.
func exerciseKernelDevice(t *testing.T, d *Device, mem *nbdtest.MemBackend) {
	t.Helper()
	if busy, err := sysfs(DefaultSysBlock).inUse(d.Index); err != nil || !busy {
		t.Errorf("inUse(%d) after attach: %v %v", d.Index, busy, err)
	}
	f, err := os.OpenFile(d.Path, os.O_RDWR|unix.O_DIRECT, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	const n = 1 << 20
	raw := make([]byte, n+4096)
	buf := raw[4096-int(uintptrOf(raw)&4095):][:n]
	for i := range buf {
		buf[i] = byte(i*7 + d.Index + int(time.Now().UnixNano()))
	}
	off := int64(3 << 20)
	if _, err := f.WriteAt(buf, off); err != nil {
		t.Fatalf("write %s: %v", d.Path, err)
	}
	if err := f.Sync(); err != nil {
		t.Fatalf("fsync %s: %v", d.Path, err)
	}
	if !bytes.Equal(mem.Snapshot()[off:off+n], buf) {
		t.Fatal("write through the kernel device did not reach the backend")
	}
	back := make([]byte, n+4096)
	got := back[4096-int(uintptrOf(back)&4095):][:n]
	if _, err := f.ReadAt(got, off); err != nil {
		t.Fatalf("read %s: %v", d.Path, err)
	}
	if !bytes.Equal(got, buf) {
		t.Fatal("read through the kernel device differs")
	}
	// BLKDISCARD: the kernel sends NBD_CMD_TRIM.
	rng := [2]uint64{uint64(off), 65536}
	if _, _, errno := unix.Syscall(unix.SYS_IOCTL, f.Fd(), unix.BLKDISCARD, uintptr(unsafe.Pointer(&rng))); errno != 0 {
		t.Errorf("BLKDISCARD: %v", errno)
	} else if !bytes.Equal(mem.Snapshot()[off:off+65536], make([]byte, 65536)) {
		t.Error("discard did not reach the backend")
	}
}

func waitFree(t *testing.T, index int) {
	t.Helper()
	for range 500 {
		if busy, err := sysfs(DefaultSysBlock).inUse(index); err == nil && !busy {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Errorf("/dev/nbd%d still in use 5s after detach", index)
}

func uintptrOf(b []byte) uintptr { return uintptr(unsafe.Pointer(unsafe.SliceData(b))) }

// The kernel answers NBD_CMD_CONNECT with a reply (the device index) and
// then an acknowledgement, in separate receives into the same buffer: the
// reply's attributes must survive the second receive.
func TestCollectRepliesAcrossReceives(t *testing.T) {
	littleEndian(t)
	reply := le(uint32(16+4+8), uint16(0x20), uint16(0), uint32(5), uint32(0),
		[]byte{nbdCmdConnect, 1, 0, 0}, appendU32Attr(nil, nbdAttrIndex, 3))
	stale := le(uint32(16+4+8), uint16(0x20), uint16(0), uint32(4), uint32(0), // an earlier request's
		[]byte{nbdCmdConnect, 1, 0, 0}, appendU32Attr(nil, nbdAttrIndex, 9))
	ack := le(uint32(16+4+16), uint16(unix.NLMSG_ERROR), uint16(0), uint32(5), uint32(0), uint32(0), make([]byte, 16))
	nack := le(uint32(16+4+16), uint16(unix.NLMSG_ERROR), uint16(0), uint32(5), uint32(0), uint32(0xfffffff0), make([]byte, 16))
	script := func(msgs ...[]byte) func([]byte) (int, error) {
		return func(buf []byte) (int, error) {
			if len(msgs) == 0 {
				return 0, errors.New("script ran out")
			}
			n := copy(buf, msgs[0])
			msgs = msgs[1:]
			return n, nil
		}
	}
	replies, err := collectReplies(5, make([]byte, nlRecvBufSize), script(stale, reply, ack))
	if err != nil || len(replies) != 1 || len(replies[0]) != 1 || ne.Uint32(replies[0][0].data) != 3 {
		t.Fatalf("replies %+v, %v; want one reply with index 3", replies, err)
	}
	if _, err := collectReplies(5, make([]byte, nlRecvBufSize), script(nack)); !errors.Is(err, unix.EBUSY) {
		t.Fatalf("negative ack: %v, want EBUSY", err)
	}
	if _, err := collectReplies(5, make([]byte, nlRecvBufSize), script(append(reply, ack...))); err != nil {
		t.Fatalf("reply and ack in one receive: %v", err)
	}
}

// TestKernelSwapLive swaps through the server: with the backend's memory
// allocated and locked up front, swap-out needs no new memory, so this
// shows whether the NBD path itself (server, kernel attach) keeps serving
// while the kernel reclaims. It runs only where NBD_SWAP_HOG names the
// e2e hog binary (testdata/kernelvm.sh sets it in the guest).
func TestKernelSwapLive(t *testing.T) {
	hog := testneeds.Env(t, "NBD_SWAP_HOG", "swaps through a real /dev/nbdN while the e2e hog binary it names fills memory; pkg/nbddev/testdata/kernelvm.sh swap runs it in a VM")
	needKernelNBD(t)
	hogMiB := os.Getenv("NBD_SWAP_HOG_MIB")
	backendMiB := 512
	if err := unix.Mlockall(unix.MCL_CURRENT | unix.MCL_FUTURE); err != nil {
		t.Fatalf("mlockall: %v", err)
	}
	mem := nbdtest.NewMemBackend(backendMiB << 20)
	for i := 0; i < len(mem.Bytes()); i += 4096 {
		mem.Bytes()[i] = 0 // resident before the kernel needs it
	}
	ts := startServer(t, []nbd.Export{{Name: "swap", Backend: mem}}, nbd.Options{})
	d, err := Attach(context.Background(), Options{
		Network: "unix", Address: ts.sock, Export: "swap", Index: AnyIndex, Connections: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Detach()
	run := func(name string, args ...string) {
		t.Helper()
		out, err := exec.Command(name, args...).CombinedOutput()
		t.Logf("%s %v: %s", name, args, bytes.TrimSpace(out))
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
	}
	run("mkswap", d.Path)
	run("swapon", d.Path)
	if f, n, err := swapsafe.CountIOFlushers(); err == nil {
		t.Logf("%d of %d threads are IO flushers", f, n)
	}
	start := time.Now()
	h := exec.Command(hog, hogMiB, "7")
	h.Stdout, h.Stderr = os.Stdout, os.Stderr
	if err := h.Run(); err != nil {
		t.Fatalf("hog: %v", err)
	}
	t.Logf("hog of %s MiB took %v", hogMiB, time.Since(start))
	vm, _ := os.ReadFile("/proc/vmstat")
	for _, l := range strings.Split(string(vm), "\n") {
		if strings.HasPrefix(l, "pswpin ") || strings.HasPrefix(l, "pswpout ") {
			t.Log(l)
		}
	}
	run("swapoff", d.Path)
	if err := d.Detach(); err != nil {
		t.Fatal(err)
	}
}

func TestConnectAttrsBackendID(t *testing.T) {
	got := connectAttrs(connectRequest{index: AnyIndex, size: 8192, blockSize: 4096, backendID: "nbd+unix:///x?socket=/s", fds: []int{3}})
	attrs, err := parseAttrs(got)
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range attrs {
		if a.typ == nbdAttrBackendIdentifier {
			if string(a.data) != "nbd+unix:///x?socket=/s\x00" {
				t.Errorf("backend identifier %q, want it NUL-terminated", a.data)
			}
			return
		}
	}
	t.Fatal("no NBD_ATTR_BACKEND_IDENTIFIER")
}

func TestKernelOptionsDefaults(t *testing.T) {
	o := Options{Network: "unix", Address: "/run/g.sock", Export: "gzram0"}
	if err := o.setDefaults(); err != nil {
		t.Fatal(err)
	}
	if o.DeadConnTimeout != DefaultDeadConnTimeout || o.netlinkTimeout() != DefaultTimeout || o.Timeout != 0 {
		t.Errorf("defaults: dead %v, netlink timeout %v, timeout %v", o.DeadConnTimeout, o.netlinkTimeout(), o.Timeout)
	}
	if o.BackendID != "nbd+unix:///gzram0?socket=/run/g.sock" {
		t.Errorf("backend %q", o.BackendID)
	}
	if id := DefaultBackendID("tcp", "127.0.0.1:10809", "e"); id != "nbd://127.0.0.1:10809/e" {
		t.Errorf("tcp backend %q", id)
	}
	neg := Options{Timeout: -1, DeadConnTimeout: -1}
	if err := neg.setDefaults(); err != nil {
		t.Fatal(err)
	}
	if seconds(neg.netlinkTimeout()) != 0 || seconds(neg.DeadConnTimeout) != 0 {
		t.Errorf("negative timeouts must reach the kernel as 0 (none)")
	}
	for d, want := range map[time.Duration]uint64{1500 * time.Millisecond: 2, time.Nanosecond: 1, 30 * time.Second: 30, 0: 0, -time.Second: 0} {
		if got := seconds(d); got != want {
			t.Errorf("seconds(%v) = %d, want %d", d, got, want)
		}
	}
	bad := Options{BackendID: "a\nb"}
	if err := bad.setDefaults(); err == nil || !strings.Contains(err.Error(), "backend") {
		t.Errorf("backend identifier with a newline: %v", err)
	}
}

// testFlags are transmission flags for the encoding tests.
const testFlags = nbd.FlagHasFlags | nbd.FlagSendFlush | nbd.FlagSendTrim | nbd.FlagCanMultiConn
