package device

import (
	"bytes"
	"context"
	"github.com/gzramd/gzramd/pkg/batch"
	"github.com/gzramd/gzramd/pkg/codec"
	"github.com/gzramd/gzramd/pkg/pagestore"
	"io"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Zero-length write at the very end passes check() and then indexes the
// page table one past its end.
func TestZeroLengthWriteAtEnd(t *testing.T) {
	f := newDevice(t, 1<<20, 0)
	defer func() {
		if p := recover(); p != nil {
			t.Fatalf("panic: %v", p)
		}
	}()
	if err := f.dev.WriteAt(context.Background(), nil, 1<<20, false); err != nil {
		t.Log("err", err)
	}
}

// Zero-length write in range does a needless read-modify-write + compress.
func TestZeroLengthWriteChangesNothing(t *testing.T) {
	f := newDevice(t, 1<<20, 0)
	p := make([]byte, 4096)
	for i := range p {
		p[i] = byte(i * 7)
	}
	f.dev.WriteAt(context.Background(), p, 0, false)
	before := f.store.Stats().Objects
	f.dev.WriteAt(context.Background(), nil, 100, false)
	t.Logf("objects before %d after %d, seq %d", before, f.store.Stats().Objects, f.dev.seq.Load())
}

// A write whose first piece is partial leaves the whole pages after it at
// an unaligned address; fillWord converts that to *uint64 (checkptr: fatal
// under -race).
func TestUnalignedWrites(t *testing.T) {
	f := newDevice(t, 1<<20, 0)
	p := make([]byte, 3*4096)
	if err := f.dev.WriteAt(context.Background(), p[:4096+4093], 3, false); err != nil {
		t.Fatal(err)
	}
	if err := f.dev.ReadAt(context.Background(), p[:4096+4093], 3); err != nil {
		t.Fatal(err)
	}
}

// gate blocks every batch until released, so a batched write can be held
// in flight.
type gate struct {
	inner   batchCompressor
	entered chan struct{}
	release chan struct{}
}

type batchCompressor interface {
	Name() string
	CompressBatch(context.Context, *codec.Batch) error
}

func (g *gate) Name() string { return "gate" }
func (g *gate) CompressBatch(ctx context.Context, b *codec.Batch) error {
	g.entered <- struct{}{}
	<-g.release
	return g.inner.CompressBatch(ctx, b)
}

// A full-page write A is in its batch when a 512-byte write M to the same
// page runs its read-modify-write against the page as it was before A.
// M commits with the newer sequence number, A's batch result is discarded,
// and both are acknowledged: the 3.5 KiB that only A wrote read back as the
// old data. No serial order of A and M gives that content.
func TestPartialWriteWaitsForBatchedWrite(t *testing.T) {
	store, _ := pagestore.New(pagestore.Config{})
	g := &gate{inner: codec.NewCPUBatch(codec.NewLZ4(), 1), entered: make(chan struct{}, 1), release: make(chan struct{})}
	bt, err := batch.New(g, g, batch.Config{MaxPages: 4, InFlight: 1}, nil)
	if err != nil {
		t.Fatal(err)
	}
	dev, err := New(Config{Size: 1 << 20, Codec: codec.NewLZ4(), Batcher: bt, Store: store,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { bt.Close(); dev.Close(); store.Close() }()
	ctx := context.Background()

	a := make([]byte, 4096)
	for i := range a {
		a[i] = byte(i*13 + 1) // not same-filled
	}
	aDone := make(chan error)
	go func() { aDone <- dev.WriteAt(ctx, a, 0, false) }()
	<-g.entered // A is in flight, pending registered

	m := make([]byte, 512)
	for i := range m {
		m[i] = 0xEE
	}
	mDone := make(chan error)
	go func() { mDone <- dev.WriteAt(ctx, m, 512, false) }() // partial: modify()
	time.Sleep(50 * time.Millisecond)                        // let M run its RMW while A is in flight
	close(g.release)
	if err := <-mDone; err != nil {
		t.Fatal(err)
	}
	if err := <-aDone; err != nil {
		t.Fatal(err)
	}

	got := make([]byte, 4096)
	if err := dev.ReadAt(ctx, got, 0); err != nil {
		t.Fatal(err)
	}
	// Either order is fine for bytes [512,1024); bytes only A wrote must be A's.
	if !bytes.Equal(got[:512], a[:512]) || !bytes.Equal(got[1024:], a[1024:]) {
		t.Fatalf("acknowledged write A lost: bytes 0..512 = %x..., want %x...", got[:8], a[:8])
	}
}

func rssKiB() int64 {
	b, _ := os.ReadFile("/proc/self/status")
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(l, "VmRSS:") {
			v, _ := strconv.ParseInt(strings.Fields(l)[1], 10, 64)
			return v
		}
	}
	return 0
}

// Discarding never-written pages still stores entry(stateEmpty) into the
// lazily backed page table, faulting in 8 bytes per 4 KiB of device.
func TestTrimOfEmptyDeviceLeavesTableUntouched(t *testing.T) {
	f := newDevice(t, 64<<30, 0)
	before := rssKiB()
	for off := int64(0); off < 64<<30; off += 1 << 30 {
		if err := f.dev.Trim(context.Background(), off, 1<<30); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("RSS grew by %d MiB discarding an empty 64 GiB device", (rssKiB()-before)>>10)
}

// Unsynchronized version: a full-page write and a 512-byte write to the
// same page run concurrently; afterwards the 7 sectors only the full write
// touched must hold its data.
func TestConcurrentFullAndPartialWrites(t *testing.T) {
	f := newDevice(t, 64*pageSize, 0)
	ctx := context.Background()
	var lost atomic.Int64
	var wg sync.WaitGroup
	for pg := range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			a := make([]byte, pageSize)
			m := make([]byte, 512)
			got := make([]byte, pageSize)
			for round := range 300 {
				for i := range a {
					a[i] = byte(round) + byte(i/16) // compressible, not same-filled
				}
				for i := range m {
					m[i] = 0xEE
				}
				sec := round % 8
				var inner sync.WaitGroup
				inner.Add(2)
				go func() { defer inner.Done(); f.dev.WriteAt(ctx, a, int64(pg)*pageSize, false) }()
				go func() { defer inner.Done(); f.dev.WriteAt(ctx, m, int64(pg)*pageSize+int64(sec)*512, false) }()
				inner.Wait()
				f.dev.ReadAt(ctx, got, int64(pg)*pageSize)
				for s := range 8 {
					if s != sec && !bytes.Equal(got[s*512:(s+1)*512], a[s*512:(s+1)*512]) {
						lost.Add(1)
						break
					}
				}
			}
		}()
	}
	wg.Wait()
	if n := lost.Load(); n > 0 {
		t.Fatalf("%d of %d rounds lost the acknowledged full-page write", n, 64*300)
	}
}
