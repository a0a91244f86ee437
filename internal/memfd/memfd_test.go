package memfd

import (
	"bytes"
	"fmt"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"
)

func TestSharedAcrossMappingsAndPunch(t *testing.T) {
	m, err := Create("test")
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	const n = 1 << 20
	if err := m.Grow(n); err != nil {
		t.Fatal(err)
	}
	a, err := m.Map(0, n)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(a)
	b, err := m.Map(n/2, n/2)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(b)
	copy(a[n/2:], "hello")
	if !bytes.Equal(b[:5], []byte("hello")) {
		t.Fatalf("second mapping reads %q", b[:5])
	}
	if err := unix.Mlock(a[:64<<10]); err != nil {
		t.Logf("no mlock here (%v): punching unlocked pages only", err)
	}
	for i := range 64 << 10 {
		a[i] = 0xA5
	}
	if got := residentPages(t, a[:64<<10]); got != 16 {
		t.Fatalf("%d pages resident after writing 16", got)
	}
	if err := m.Punch(0, 64<<10); err != nil {
		t.Fatal(err)
	}
	if got := residentPages(t, a[:64<<10]); got != 0 {
		t.Fatalf("%d pages resident after punching", got)
	}
	if a[100] != 0 || b[0] != 'h' {
		t.Fatalf("after punching: %#x at 100 (want 0), %q at n/2", a[100], b[0])
	}
	if size, err := m.Size(); err != nil || size != n {
		t.Fatalf("size %d, %v after punching", size, err)
	}
}

func TestOpenRefusesOtherFiles(t *testing.T) {
	fd, err := unix.Open("/dev/null", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	if _, err := Open(fd); err == nil {
		t.Fatal("Open took /dev/null")
	}
	m, err := Create("again")
	if err != nil {
		t.Fatal(err)
	}
	dup, err := unix.FcntlInt(uintptr(m.Fd()), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	m.Close()
	o, err := Open(dup)
	if err != nil {
		t.Fatal(err)
	}
	defer o.Close()
	if o.Name() != "memfd:again" {
		t.Fatalf("name %q", o.Name())
	}
}

func residentPages(t *testing.T, mem []byte) int {
	t.Helper()
	vec := make([]byte, (len(mem)+4095)/4096)
	if _, _, errno := unix.Syscall(unix.SYS_MINCORE, uintptr(unsafe.Pointer(&mem[0])), uintptr(len(mem)), uintptr(unsafe.Pointer(&vec[0]))); errno != 0 {
		t.Fatalf("mincore: %v", errno)
	}
	n := 0
	for _, v := range vec {
		n += int(v & 1)
	}
	return n
}

func TestExtents(t *testing.T) {
	m, err := Create("extents")
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if err := m.Grow(64 << 12); err != nil {
		t.Fatal(err)
	}
	mem, err := m.Map(0, 64<<12)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(mem)
	for _, pg := range []int{3, 4, 5, 20, 63} {
		mem[pg<<12+7] = 1
	}
	if err := m.Punch(4<<12, 1<<12); err != nil {
		t.Fatal(err)
	}
	var got [][2]int64
	if err := m.Extents(func(off, n int64) bool { got = append(got, [2]int64{off >> 12, n >> 12}); return true }); err != nil {
		t.Fatal(err)
	}
	want := [][2]int64{{3, 1}, {5, 1}, {20, 1}, {63, 1}}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("extents (first page, pages) %v, want %v", got, want)
	}
}

// Populate over a page past the file's end leaves it alone: touching it
// would be a SIGBUS, and the test binary would die of it.
func TestPopulatePastTheEnd(t *testing.T) {
	m, err := Create("test")
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	page := unix.Getpagesize()
	if err := m.Grow(int64(page)); err != nil {
		t.Fatal(err)
	}
	a, err := m.Map(0, 4*page)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(a)
	Populate(a)
	if got := residentPages(t, a[:page]); got != 1 {
		t.Errorf("%d pages resident within the file, want 1", got)
	}
}

// TestGrowNeverShrinks grows one file from several goroutines at once, as
// a store's prefaulter and its writers map arenas: a Grow that read the
// size before another grew the file must not cut it back, which would
// zero what was written past its end and raise SIGBUS there.
func TestGrowNeverShrinks(t *testing.T) {
	m, err := Create("test")
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	const growers, steps = 4, 2000
	done := make(chan error, growers)
	for g := range growers {
		go func() {
			for i := range steps {
				if err := m.Grow(int64(i*growers+g+1) * 4096); err != nil {
					done <- err
					return
				}
				if size, err := m.Size(); err != nil || size < int64(i*growers+g+1)*4096 {
					done <- fmt.Errorf("after growing to %d bytes: %d, %v", (i*growers+g+1)*4096, size, err)
					return
				}
			}
			done <- nil
		}()
	}
	for range growers {
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
}
