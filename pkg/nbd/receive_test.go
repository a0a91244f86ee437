package nbd

import (
	"bytes"
	"context"
	"math/rand/v2"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gzramd/gzramd/pkg/blockdev"
	"github.com/gzramd/gzramd/pkg/nbd/nbdtest"
)

// receivingBackend is a MemBackend that receives write payloads itself
// (WriteReceiver), into two buffers of its own per write, for writes that
// start on an 8 KiB boundary; it declines the others.
type receivingBackend struct {
	*nbdtest.MemBackend
	received, completed, aborted, declined atomic.Int64
}

type testReceipt struct {
	off  int64
	bufs [][]byte
}

func (r *testReceipt) Buffers() [][]byte { return r.bufs }

func (b *receivingBackend) ReceiveWrite(off int64, length int) (blockdev.Receipt, bool) {
	if off%8192 != 0 {
		b.declined.Add(1)
		return nil, false
	}
	b.received.Add(1)
	half := length / 2
	return &testReceipt{off: off, bufs: [][]byte{make([]byte, half), make([]byte, length-half)}}, true
}

func (b *receivingBackend) CompleteWrite(ctx context.Context, rc blockdev.Receipt, fua bool) error {
	r := rc.(*testReceipt)
	b.completed.Add(1)
	return b.MemBackend.WriteAt(ctx, append(append([]byte(nil), r.bufs[0]...), r.bufs[1]...), r.off, fua)
}

func (b *receivingBackend) AbortWrite(blockdev.Receipt) { b.aborted.Add(1) }

// TestWriteReceiverGetsPayloads: writes the Backend receives reach it
// whole through its buffers and CompleteWrite, the ones it declines
// through WriteAt, and every receipt is completed.
func TestWriteReceiverGetsPayloads(t *testing.T) {
	base := runtime.NumGoroutine()
	be := &receivingBackend{MemBackend: nbdtest.NewMemBackend(1 << 20)}
	ts := startServer(t, []Export{{Name: "r", Backend: be}}, Options{})
	c := dialRaw(t, ts, "r")
	r := rand.New(rand.NewPCG(1, 1))
	model := make([]byte, 1<<20)
	for i := range 200 {
		off := uint64(r.IntN(256)) * 4096
		n := min(uint32(4096*(1+r.IntN(32))), uint32(1<<20-off))
		p := make([]byte, n)
		for j := range p {
			p[j] = byte(r.Uint32())
		}
		c.expect(0, CmdWrite, 0, off, n, p)
		copy(model[off:], p)
		if i%10 == 0 {
			c.send(CmdRead, 0, 7, 0, 1<<20, nil)
			if errno, _ := c.recv(); errno != 0 {
				t.Fatalf("read: errno %d", errno)
			}
			if got := c.recvData(1 << 20); !bytes.Equal(got, model) {
				t.Fatalf("after %d writes the export differs from the model", i+1)
			}
		}
	}
	// A write beyond the end is refused, its payload skipped, and never
	// offered.
	received := be.received.Load()
	c.expect(errnoNoSpc, CmdWrite, 0, 1<<20-4096, 8192, make([]byte, 8192))
	if be.received.Load() != received {
		t.Error("a write outside the export was offered to the receiver")
	}
	ts.shutdown(t)
	checkGoroutines(t, base)
	if be.received.Load() == 0 || be.declined.Load() == 0 {
		t.Fatalf("received %d, declined %d: want both paths", be.received.Load(), be.declined.Load())
	}
	if be.completed.Load() != be.received.Load() || be.aborted.Load() != 0 {
		t.Fatalf("received %d, completed %d, aborted %d", be.received.Load(), be.completed.Load(), be.aborted.Load())
	}
	if !bytes.Equal(be.Snapshot(), model) {
		t.Fatal("the export differs from the model")
	}
}

// TestWriteReceiverAbortsTruncatedPayload: a client that hangs up in the
// middle of a received payload leaves no receipt behind.
func TestWriteReceiverAbortsTruncatedPayload(t *testing.T) {
	be := &receivingBackend{MemBackend: nbdtest.NewMemBackend(1 << 20)}
	ts := startServer(t, []Export{{Name: "r", Backend: be}}, Options{})
	c := dialRaw(t, ts, "r")
	c.send(CmdWrite, 0, 1, 0, 65536, make([]byte, 40000))
	c.nc.Close()
	for deadline := time.Now().Add(5 * time.Second); be.aborted.Load() == 0; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("received %d, completed %d, aborted %d: the truncated write's receipt was not given back",
				be.received.Load(), be.completed.Load(), be.aborted.Load())
		}
	}
	if be.completed.Load() != 0 {
		t.Fatal("a truncated write was completed")
	}
}

// TestWriteReceiverConcurrent writes from several connections at once
// (run with -race).
func TestWriteReceiverConcurrent(t *testing.T) {
	be := &receivingBackend{MemBackend: nbdtest.NewMemBackend(4 << 20)}
	ts := startServer(t, []Export{{Name: "r", Backend: be}}, Options{})
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := dialRaw(t, ts, "r")
			region := uint64(w) << 20
			p := make([]byte, 32768)
			for i := range 100 {
				for j := range p {
					p[j] = byte(w + i + j)
				}
				off := region + uint64(i%32)*32768
				c.expect(0, CmdWrite, 0, off, uint32(len(p)), p)
				c.send(CmdRead, 0, 2, off, uint32(len(p)), nil)
				if errno, _ := c.recv(); errno != 0 {
					t.Errorf("read: errno %d", errno)
					return
				}
				if got := c.recvData(len(p)); !bytes.Equal(got, p) {
					t.Errorf("connection %d: write %d read back changed", w, i)
					return
				}
			}
		}()
	}
	wg.Wait()
	ts.shutdown(t)
	if be.completed.Load() != be.received.Load() || be.aborted.Load() != 0 {
		t.Fatalf("received %d, completed %d, aborted %d", be.received.Load(), be.completed.Load(), be.aborted.Load())
	}
}
