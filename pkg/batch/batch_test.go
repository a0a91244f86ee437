package batch

import (
	"bytes"
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gzramd/gzramd/pkg/codec"
)

// failing fails every batch; it stands in for a broken GPU.
type failing struct{ calls atomic.Int32 }

func (*failing) Name() string { return "failing" }
func (f *failing) CompressBatch(_ context.Context, b *codec.Batch) error {
	f.calls.Add(1)
	for i := range b.N { // scribble, as a half-finished backend might
		b.Lens[i] = 12345
	}
	return errors.New("injected failure")
}

type sizes struct {
	mu    sync.Mutex
	pages []int
}

func (s *sizes) BatchDone(_ string, pages int, _ time.Duration) {
	s.mu.Lock()
	s.pages = append(s.pages, pages)
	s.mu.Unlock()
}

func page(seed int) []byte {
	p := make([]byte, codec.PageSize)
	for i := range p {
		p[i] = byte((i / 64) * seed)
	}
	return p
}

func runWriters(t *testing.T, bt *Batcher, writers, perWriter int) {
	t.Helper()
	lz := codec.NewLZ4()
	var wg sync.WaitGroup
	errs := make(chan error, writers)
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range perWriter {
				want := page(w*perWriter + j + 1)
				_, err := bt.Compress(context.Background(), want, func(_ int, c []byte) error {
					got := make([]byte, codec.PageSize)
					if c == nil {
						return errors.New("compressible page reported raw")
					}
					if err := lz.Decompress(got, c); err != nil {
						return err
					}
					if !bytes.Equal(got, want) {
						return errors.New("page came back different")
					}
					return nil
				})
				if err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}

func TestConcurrentWritersGetTheirOwnPages(t *testing.T) {
	cpu := codec.NewCPUBatch(codec.NewLZ4(), 2)
	primary := codec.NewCPUBatch(codec.NewLZ4(), 2) // distinct, so pages are batched
	obs := &sizes{}
	bt, err := New(primary, cpu, Config{MaxPages: 16, InFlight: 2}, obs)
	if err != nil {
		t.Fatal(err)
	}
	runWriters(t, bt, 32, 50)
	bt.Close()
	st := bt.Stats()
	if st.Pages != 32*50 {
		t.Fatalf("compressed %d pages, want %d", st.Pages, 32*50)
	}
	for _, n := range obs.pages {
		if n < 1 || n > 16 {
			t.Fatalf("batch of %d pages, want 1..16", n)
		}
	}
	if st.Batches >= st.Pages {
		t.Logf("no batching happened (%d batches for %d pages); acceptable on an idle machine", st.Batches, st.Pages)
	}
}

func TestPrimaryFailureFallsBackToCPU(t *testing.T) {
	cpu := codec.NewCPUBatch(codec.NewLZ4(), 1)
	bad := &failing{}
	bt, err := New(bad, cpu, Config{MaxPages: 8, InFlight: 2}, nil)
	if err != nil {
		t.Fatal(err)
	}
	runWriters(t, bt, 8, 20)
	bt.Close()
	st := bt.Stats()
	if bad.calls.Load() == 0 || st.BackendErrors != uint64(bad.calls.Load()) {
		t.Fatalf("primary called %d times, %d backend errors counted", bad.calls.Load(), st.BackendErrors)
	}
}

// counting is a working primary that counts what it gets.
type counting struct {
	codec.BatchCompressor
	mu    sync.Mutex
	sizes []int
}

func (c *counting) Name() string { return "counting" }
func (c *counting) CompressBatch(ctx context.Context, b *codec.Batch) error {
	c.mu.Lock()
	c.sizes = append(c.sizes, b.N)
	c.mu.Unlock()
	return c.BatchCompressor.CompressBatch(ctx, b)
}

// TestLightLoadSkipsThePrimary: fewer pages in flight than the primary's
// minimum go straight to the CPU, without waiting for the deadline.
func TestLightLoadSkipsThePrimary(t *testing.T) {
	cpu := codec.NewCPUBatch(codec.NewLZ4(), 1)
	bad := &failing{}
	bt, err := New(bad, cpu, Config{MaxPages: 64, MinPrimaryPages: 64, Deadline: time.Hour}, nil)
	if err != nil {
		t.Fatal(err)
	}
	runWriters(t, bt, 1, 5) // would take 5 hours if any page waited for the deadline
	bt.Close()
	if n := bad.calls.Load(); n != 0 {
		t.Fatalf("primary got %d batches smaller than its minimum", n)
	}
	if st := bt.Stats(); st.CPUBatches != 5 || st.DirectRequests != 5 {
		t.Fatalf("stats %+v, want 5 direct CPU batches", st)
	}
}

// TestDeadlineSendsTheRemainderToTheCPU: a 12-page request with a
// 10-page batch limit fills one batch for the primary; the 2 pages left
// over wait for the deadline and then go to the CPU.
func TestDeadlineSendsTheRemainderToTheCPU(t *testing.T) {
	cpu := codec.NewCPUBatch(codec.NewLZ4(), 1)
	primary := &counting{BatchCompressor: codec.NewCPUBatch(codec.NewLZ4(), 1)}
	bt, err := New(primary, cpu, Config{MaxPages: 10, MinPrimaryPages: 8, Deadline: time.Millisecond}, nil)
	if err != nil {
		t.Fatal(err)
	}
	req := make([]byte, 12*codec.PageSize)
	for j := range 12 {
		copy(req[j*codec.PageSize:], page(j+1))
	}
	for range 3 {
		if n, err := bt.Compress(context.Background(), req, func(int, []byte) error { return nil }); n != 12 || err != nil {
			t.Fatalf("accepted %d, err %v", n, err)
		}
	}
	bt.Close()
	st := bt.Stats()
	for _, n := range primary.sizes {
		if n < 8 {
			t.Fatalf("primary got a batch of %d pages, below its minimum of 8", n)
		}
	}
	if st.PrimaryBatches != 3 || st.CPUBatches != 3 || st.Pages != 36 {
		t.Fatalf("stats %+v, want 3 primary batches of 10 and 3 CPU batches of 2", st)
	}
}

func TestBackpressureAndClose(t *testing.T) {
	cpu := codec.NewCPUBatch(codec.NewLZ4(), 1)
	bt, err := New(codec.NewCPUBatch(codec.NewLZ4(), 1), cpu, Config{MaxPages: 1, InFlight: 1}, nil)
	if err != nil {
		t.Fatal(err)
	}
	runWriters(t, bt, 16, 20) // 16 writers through 2 one-page buffers
	bt.Close()
	_, err = bt.Compress(context.Background(), page(1), func(int, []byte) error { return nil })
	if !errors.Is(err, ErrClosed) {
		t.Fatalf("after Close: %v, want ErrClosed", err)
	}
	if _, err := bt.Compress(context.Background(), make([]byte, 10), nil); err == nil {
		t.Fatal("short page accepted")
	}
}

func TestConfigValidation(t *testing.T) {
	cpu := codec.NewCPUBatch(codec.NewLZ4(), 1)
	for _, c := range []Config{{MaxPages: -1}, {InFlight: 5000}, {MaxPages: 4, MinPrimaryPages: 8}, {Deadline: -1}} {
		if _, err := New(cpu, cpu, c, nil); err == nil {
			t.Errorf("config %+v accepted", c)
		}
	}
}

// TestLargeRequestsDoNotDeadlock sends requests larger than all the
// buffers together from several writers at once.
func TestLargeRequestsDoNotDeadlock(t *testing.T) {
	cpu := codec.NewCPUBatch(codec.NewLZ4(), 1)
	bt, err := New(codec.NewCPUBatch(codec.NewLZ4(), 1), cpu, Config{MaxPages: 8, InFlight: 1}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer bt.Close()
	lz := codec.NewLZ4()
	var wg sync.WaitGroup
	for w := range 6 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			req := make([]byte, 40*codec.PageSize)
			for j := range 40 {
				copy(req[j*codec.PageSize:], page(w*40+j+1))
			}
			seen := make([]bool, 40)
			n, err := bt.Compress(context.Background(), req, func(i int, c []byte) error {
				got := make([]byte, codec.PageSize)
				if err := lz.Decompress(got, c); err != nil || !bytes.Equal(got, page(w*40+i+1)) {
					return errors.New("wrong page committed")
				}
				if seen[i] {
					return errors.New("page committed twice")
				}
				seen[i] = true
				return nil
			})
			if err != nil || n != 40 {
				t.Errorf("writer %d: accepted %d, err %v", w, n, err)
			}
			for i, ok := range seen {
				if !ok {
					t.Errorf("writer %d: page %d never committed", w, i)
				}
			}
		}()
	}
	wg.Wait()
}

// TestDirectMode covers the CPU-only path, where requests compress their
// own pages without batch buffers or workers.
func TestDirectMode(t *testing.T) {
	cpu := codec.NewCPUBatch(codec.NewLZ4(), 2)
	bt, err := New(cpu, cpu, Config{MaxPages: 16}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(bt.free) != 0 {
		t.Fatalf("direct mode allocated %d batch buffers", len(bt.free))
	}
	runWriters(t, bt, 16, 30)
	// A request larger than the scratch chunk.
	req := make([]byte, 100*codec.PageSize)
	for j := range 100 {
		copy(req[j*codec.PageSize:], page(j+1))
	}
	lz := codec.NewLZ4()
	n, err := bt.Compress(context.Background(), req, func(i int, c []byte) error {
		got := make([]byte, codec.PageSize)
		if err := lz.Decompress(got, c); err != nil || !bytes.Equal(got, page(i+1)) {
			return errors.New("wrong page")
		}
		return nil
	})
	if n != 100 || err != nil {
		t.Fatalf("accepted %d, err %v", n, err)
	}
	if st := bt.Stats(); st.Pages != 16*30+100 {
		t.Fatalf("%d pages counted, want %d", st.Pages, 16*30+100)
	}
	bt.Close()
	if _, err := bt.Compress(context.Background(), page(1), func(int, []byte) error { return nil }); !errors.Is(err, ErrClosed) {
		t.Fatalf("after Close: %v, want ErrClosed", err)
	}
}
