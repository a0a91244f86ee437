package ublk

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/gzramd/gzramd/pkg/blockdev"
)

// newTestHandler serves queue q of a memory backend with a sparse file
// standing in for /dev/ublkcN: the handler's preads and pwrites land at
// the USER_COPY positions, where the test puts and finds the data.
func newTestHandler(t *testing.T, q uint16, size int64) (*handler, *memBackend, *os.File) {
	t.Helper()
	f, err := os.Create(filepath.Join(t.TempDir(), "ublkc"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	m := newMemBackend(size)
	h := newHandler(context.Background(), m, nil, int(f.Fd()))
	h.q = q
	return &h, m, f
}

func pattern(n int, seed byte) []byte {
	p := make([]byte, n)
	for i := range p {
		p[i] = byte(i*7) ^ seed
	}
	return p
}

func desc(op uint8, flags uint32, off, n int64) ioDesc {
	return ioDesc{OpFlags: uint32(op) | flags, StartSector: uint64(off >> 9), NrSectors: uint32(n >> 9)}
}

func TestServeWriteThenRead(t *testing.T) {
	const q, tag = 2, 5
	h, m, f := newTestHandler(t, q, 1<<20)
	buf := make([]byte, 64<<10)
	data := pattern(16<<10, 0x5a)
	// The driver's side of a write: its data at the tag's position.
	if _, err := f.WriteAt(data, userCopyPos(q, tag, 0)); err != nil {
		t.Fatal(err)
	}
	if res := h.serve(tag, desc(opWrite, ioFlagFUA, 8192, int64(len(data))), buf); res != int32(len(data)) {
		t.Fatalf("write: result %d, want %d", res, len(data))
	}
	if !bytes.Equal(m.data[8192:8192+len(data)], data) {
		t.Error("the backend does not hold what was written")
	}
	if m.fuas != 1 {
		t.Errorf("%d FUA writes, want 1", m.fuas)
	}
	// A read of the same range by another tag: the data goes to that
	// tag's position.
	if res := h.serve(tag+1, desc(opRead, 0, 8192, int64(len(data))), buf); res != int32(len(data)) {
		t.Fatalf("read: result %d, want %d", res, len(data))
	}
	got := make([]byte, len(data))
	if _, err := f.ReadAt(got, userCopyPos(q, tag+1, 0)); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, data) {
		t.Error("the read's data at its tag's position differs from what was written")
	}
}

func TestServeOtherOps(t *testing.T) {
	h, m, _ := newTestHandler(t, 0, 1<<20)
	copy(m.data, pattern(1<<20, 1))
	if res := h.serve(0, desc(opFlush, 0, 0, 0), nil); res != 0 || m.flushes != 1 {
		t.Errorf("flush: result %d, %d flushes", res, m.flushes)
	}
	if res := h.serve(0, desc(opDiscard, 0, 4096, 8192), nil); res != 0 || m.trims != 1 {
		t.Errorf("discard: result %d, %d trims", res, m.trims)
	}
	if res := h.serve(0, desc(opWriteZeroes, ioFlagNoUnmap, 65536, 4096), nil); res != 0 || m.zeroes != 1 || m.noHoles != 1 {
		t.Errorf("write zeroes: result %d, %d zeroings (%d no hole)", res, m.zeroes, m.noHoles)
	}
	for _, r := range [][2]int{{4096, 12288}, {65536, 69632}} {
		if !bytes.Equal(m.data[r[0]:r[1]], make([]byte, r[1]-r[0])) {
			t.Errorf("bytes %d-%d not zero", r[0], r[1])
		}
	}
	if m.data[12288] == 0 && m.data[12289] == 0 {
		t.Error("a discard went past its range")
	}
}

// Descriptors the driver should never write are answered, not served.
func TestServeBadDescriptors(t *testing.T) {
	const size = 1 << 20
	h, m, _ := newTestHandler(t, 0, size)
	buf := make([]byte, 8192)
	for _, c := range []struct {
		name string
		d    ioDesc
		want unix.Errno
	}{
		{"unknown op", desc(99, 0, 0, 4096), unix.EOPNOTSUPP},
		{"write same", desc(opWriteSame, 0, 0, 4096), unix.EOPNOTSUPP},
		{"read past the end", desc(opRead, 0, size-4096, 8192), unix.EINVAL},
		{"write at the end", desc(opWrite, 0, size, 4096), unix.EINVAL},
		{"discard past the end", desc(opDiscard, 0, size, 4096), unix.EINVAL},
		{"sector beyond everything", ioDesc{OpFlags: opRead, StartSector: 1<<64 - 1, NrSectors: 8}, unix.EINVAL},
		{"sector that wraps", ioDesc{OpFlags: opWrite, StartSector: 1 << 55, NrSectors: 8}, unix.EINVAL},
		{"longer than the buffer", desc(opRead, 0, 0, 16384), unix.EINVAL},
	} {
		if res := h.serve(0, c.d, buf); res != -int32(c.want) {
			t.Errorf("%s: result %d, want %d (-%v)", c.name, res, -int32(c.want), c.want)
		}
	}
	if m.trims != 0 || m.flushes != 0 {
		t.Error("a bad descriptor reached the backend")
	}
	if res := h.serve(0, desc(opRead, 0, 0, 0), buf); res != 0 {
		t.Errorf("empty read: result %d, want 0", res)
	}
}

func TestServeBackendErrors(t *testing.T) {
	h, m, f := newTestHandler(t, 0, 1<<20)
	buf := make([]byte, 8192)
	if _, err := f.WriteAt(buf, userCopyPos(0, 0, 0)); err != nil { // the write's data
		t.Fatal(err)
	}
	m.failAt = 4096
	for _, c := range []struct {
		err  error
		want int32
	}{
		{unix.ENOSPC, -int32(unix.ENOSPC)},
		{errors.Join(errors.New("wrapped"), unix.EROFS), -int32(unix.EROFS)},
		{errors.New("no errno"), -int32(unix.EIO)},
	} {
		m.failErr = c.err
		if res := h.serve(0, desc(opRead, 0, 0, 8192), buf); res != c.want {
			t.Errorf("read failing with %v: result %d, want %d", c.err, res, c.want)
		}
		if res := h.serve(0, desc(opWrite, 0, 4096, 4096), buf); res != c.want {
			t.Errorf("write failing with %v: result %d, want %d", c.err, res, c.want)
		}
	}
}

// The data file failing (the driver refusing a copy) fails the request.
func TestServeCopyErrors(t *testing.T) {
	h, _, f := newTestHandler(t, 0, 1<<20)
	buf := make([]byte, 8192)
	ro, err := os.Open(f.Name())
	if err != nil {
		t.Fatal(err)
	}
	defer ro.Close()
	h.data = int(ro.Fd())
	if res := h.serve(0, desc(opRead, 0, 0, 4096), buf); res != -int32(unix.EBADF) {
		t.Errorf("read with a read-only data file: result %d, want -EBADF", res)
	}
	// A write whose data is not there: the file ends before it.
	h.data = int(f.Fd())
	if res := h.serve(3, desc(opWrite, 0, 0, 4096), buf); res != -int32(unix.EIO) {
		t.Errorf("write with no data to read: result %d, want -EIO", res)
	}
}

// Serving a request allocates nothing: no garbage, and no heap growth
// that could fault while the device is swap.
func TestServeAllocatesNothing(t *testing.T) {
	const tag = 1
	h, _, f := newTestHandler(t, 0, 1<<20)
	buf := make([]byte, 64<<10)
	if _, err := f.WriteAt(pattern(len(buf), 3), userCopyPos(0, tag, 0)); err != nil {
		t.Fatal(err)
	}
	for _, d := range []ioDesc{
		desc(opWrite, ioFlagFUA, 4096, 64<<10),
		desc(opRead, 0, 4096, 64<<10),
		desc(opFlush, 0, 0, 0),
		desc(opDiscard, 0, 0, 8192),
		desc(opWriteZeroes, 0, 0, 8192),
	} {
		if n := testing.AllocsPerRun(50, func() {
			if res := h.serve(tag, d, buf); res < 0 {
				t.Fatalf("op %d: %d", d.op(), res)
			}
		}); n != 0 {
			t.Errorf("op %d: %v allocations a request", d.op(), n)
		}
	}
}

func TestGrowStack(t *testing.T) {
	growStack(stackBytes) // does not overflow, terminates
}

// receivingBackend takes writes of whole 4 KiB pages into memory of its
// own, a buffer a page, as the device's staging slots do.
type receivingBackend struct {
	*memBackend
	received, completed, aborted int
}

type pages struct {
	off  int64
	bufs [][]byte
}

func (p *pages) Buffers() [][]byte { return p.bufs }

func (r *receivingBackend) ReceiveWrite(off int64, length int) (blockdev.Receipt, bool) {
	if length%4096 != 0 {
		return nil, false
	}
	r.received++
	rc := &pages{off: off}
	for range length / 4096 {
		rc.bufs = append(rc.bufs, make([]byte, 4096))
	}
	return rc, true
}

func (r *receivingBackend) CompleteWrite(ctx context.Context, rc blockdev.Receipt, fua bool) error {
	r.completed++
	p := rc.(*pages)
	for i, b := range p.bufs {
		if err := r.WriteAt(ctx, b, p.off+int64(i)*4096, fua); err != nil {
			return err
		}
	}
	return nil
}

func (r *receivingBackend) AbortWrite(blockdev.Receipt) { r.aborted++ }

// A backend that receives writes itself gets the data read from the
// driver straight into its buffers, each from its place in the request;
// a write it declines goes through the tag's buffer; a read from the
// driver that fails gives the receipt back.
func TestServeIntoReceiver(t *testing.T) {
	const q, tag = 1, 3
	f, err := os.Create(filepath.Join(t.TempDir(), "ublkc"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	r := &receivingBackend{memBackend: newMemBackend(1 << 20)}
	h := newHandler(context.Background(), r, nil, int(f.Fd()))
	h.q = q
	buf := make([]byte, 64<<10)

	data := pattern(16<<10, 0x33)
	if _, err := f.WriteAt(data, userCopyPos(q, tag, 0)); err != nil {
		t.Fatal(err)
	}
	if res := h.serve(tag, desc(opWrite, 0, 65536, int64(len(data))), buf); res != int32(len(data)) {
		t.Fatalf("received write: result %d, want %d", res, len(data))
	}
	if !bytes.Equal(r.data[65536:65536+len(data)], data) {
		t.Error("the receiving backend does not hold what was written")
	}
	if !bytes.Equal(buf[:len(data)], make([]byte, len(data))) {
		t.Error("a received write passed through the tag's buffer")
	}

	// 512 bytes: declined, so through the buffer and WriteAt.
	small := pattern(512, 0x44)
	if _, err := f.WriteAt(small, userCopyPos(q, tag, 0)); err != nil {
		t.Fatal(err)
	}
	if res := h.serve(tag, desc(opWrite, 0, 4096, 512), buf); res != 512 {
		t.Fatalf("declined write: result %d, want 512", res)
	}
	if !bytes.Equal(r.data[4096:4096+512], small) {
		t.Error("the declined write is not held")
	}

	// A tag whose data the driver does not have (past the file's end):
	// the read fails, and the receipt goes back.
	if res := h.serve(tag+7, desc(opWrite, 0, 0, 8192), buf); res != -int32(unix.EIO) {
		t.Errorf("write without data: result %d, want -EIO", res)
	}
	if r.received != 2 || r.completed != 1 || r.aborted != 1 {
		t.Errorf("received %d, completed %d, aborted %d; want 2, 1, 1", r.received, r.completed, r.aborted)
	}
}
