package swapctl

import (
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

func TestParseSwaps(t *testing.T) {
	in := "Filename\t\t\t\tType\t\tSize\t\tUsed\t\tPriority\n" +
		"/dev/nbd0                               partition\t1048572\t\t2048\t\t100\n" +
		"/swap\\040file                           file\t\t524284\t\t0\t\t-2\n"
	got, err := parseSwaps(strings.NewReader(in))
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[0] != (Area{"/dev/nbd0", 2048 << 10}) || got[1].Path != "/swap file" {
		t.Errorf("parseSwaps = %+v", got)
	}
	if _, err := parseSwaps(strings.NewReader("h\n/dev/x partition 1 lots 0\n")); err == nil {
		t.Error("a malformed Used field was accepted")
	}
}

// Ours must find an NBD swap device whose set-up process is a peer on
// one of our sockets, and only that one.
func TestOursByPeer(t *testing.T) {
	dir := t.TempDir()
	h := Host{ProcSwaps: filepath.Join(dir, "swaps"), SysBlock: filepath.Join(dir, "block")}
	writeSwapsFile(t, h.ProcSwaps, "/dev/nbd2", "/dev/nbd5", "/dev/sdb2")
	writePID(t, filepath.Join(h.SysBlock, "nbd2"), os.Getpid()) // connected to us below
	writePID(t, filepath.Join(h.SysBlock, "nbd5"), 1)           // someone else's server

	var tr Tracker
	l, err := net.Listen("unix", filepath.Join(dir, "s"))
	if err != nil {
		t.Fatal(err)
	}
	tl := tr.Wrap(l)
	defer tl.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, err := tl.Accept()
		if err == nil {
			accepted <- c
		}
	}()
	if got, err := h.Ours("", &tr); err != nil || len(got) != 0 {
		t.Errorf("with nobody connected, Ours = %v, %v", got, err)
	}
	c, err := net.Dial("unix", filepath.Join(dir, "s"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	sc := <-accepted
	got, err := h.Ours("", &tr)
	if err != nil || len(got) != 1 || got[0].Path != "/dev/nbd2" {
		t.Errorf("Ours = %v, %v; want /dev/nbd2 only", got, err)
	}
	// A device we attached ourselves counts by its path.
	if got, _ := h.Ours("/dev/nbd5", &tr); len(got) != 2 {
		t.Errorf("with /dev/nbd5 our own, Ours = %v", got)
	}
	sc.Close()
	if n := tr.Count(); n != 0 {
		t.Errorf("%d connections tracked after close", n)
	}
}

func writeSwapsFile(t *testing.T, path string, devs ...string) {
	t.Helper()
	s := "Filename\tType\tSize\tUsed\tPriority\n"
	for _, d := range devs {
		s += d + "\tpartition\t1024\t8\t-2\n"
	}
	if err := os.WriteFile(path, []byte(s), 0o644); err != nil {
		t.Fatal(err)
	}
}

func writePID(t *testing.T, dir string, pid int) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "pid"), []byte(strconv.Itoa(pid)+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
}

// IsSwap says whether a device is still listed, and errs on the side of
// yes when the list cannot be read.
func TestIsSwap(t *testing.T) {
	dir := t.TempDir()
	h := Host{ProcSwaps: filepath.Join(dir, "swaps")}
	writeSwapsFile(t, h.ProcSwaps, "/dev/nbd2")
	if !h.IsSwap("/dev/nbd2") || h.IsSwap("/dev/nbd3") {
		t.Error("IsSwap disagrees with the swap list")
	}
	if !(Host{ProcSwaps: filepath.Join(dir, "missing")}).IsSwap("/dev/nbd3") {
		t.Error("an unreadable swap list counts as not swap")
	}
}

// TestSameFileDetachedName: /proc/swaps lists "/nbd0" once the mount
// namespace that turned swap on is gone; it is /dev/nbd0 still.
func TestSameFileDetachedName(t *testing.T) {
	for _, c := range []struct {
		a, b string
		want bool
	}{
		{"/nbd0", "/dev/nbd0", true},
		{"/dev/nbd0", "/nbd0", true},
		{"/nbd1", "/dev/nbd0", false},
		{"/nbd0", "/tmp/nbd0", false},
		{"/x/nbd0", "/dev/nbd0", false},
	} {
		if got := SameFile(c.a, c.b); got != c.want {
			t.Errorf("SameFile(%q, %q) = %v, want %v", c.a, c.b, got, c.want)
		}
	}
}
