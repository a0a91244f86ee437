package device

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/gzramd/gzramd/pkg/batch"
	"github.com/gzramd/gzramd/pkg/codec"
	"github.com/gzramd/gzramd/pkg/pagestore"
)

type fixture struct {
	dev   *Device
	store *pagestore.Store
	bt    *batch.Batcher
}

// newDevice returns a device whose batcher batches (its primary backend is
// a second CPU compressor), the path a GPU takes.
func newDevice(t testing.TB, size, memLimit int64) *fixture {
	return newDeviceMode(t, size, pagestore.Config{MemLimit: memLimit}, modeBatched)
}

type batchMode int

const (
	modeBatched batchMode = iota // every request through batches
	modeDirect                   // CPU only: requests compress their own pages
	modeMixed                    // a primary with a minimum batch, as with a GPU
)

// newDeviceMode returns a device over a store made with storeCfg, whose
// batcher works in the given mode.
func newDeviceMode(t testing.TB, size int64, storeCfg pagestore.Config, mode batchMode) *fixture {
	t.Helper()
	store, err := pagestore.New(storeCfg)
	if err != nil {
		t.Fatal(err)
	}
	cpu := codec.NewCPUBatch(codec.NewLZ4(), 2)
	primary := codec.BatchCompressor(codec.NewCPUBatch(codec.NewLZ4(), 2))
	cfg := batch.Config{MaxPages: 32, InFlight: 2, Limit: DefaultHugeThreshold - 1}
	switch mode {
	case modeDirect:
		primary = cpu
	case modeMixed:
		cfg.MinPrimaryPages, cfg.Deadline = 16, 200*time.Microsecond
	}
	bt, err := batch.New(primary, cpu, cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	dev, err := New(Config{Size: size, Codec: codec.NewLZ4(), Batcher: bt, Store: store,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		bt.Close()
		dev.Close()
		store.Close()
	})
	return &fixture{dev, store, bt}
}

// fillData writes content of a random kind: compressible text-like bytes,
// a same-filled word, zeros, or incompressible noise.
func fillData(r *rand.Rand, p []byte) {
	switch r.IntN(8) {
	case 0:
		clear(p)
	case 1:
		w := r.Uint64()
		for i := range p {
			p[i] = byte(w >> (8 * (i % 8)))
		}
	case 2:
		var w [8]byte
		for i := range p {
			if i%8 == 0 {
				binary.LittleEndian.PutUint64(w[:], r.Uint64())
			}
			p[i] = w[i%8]
		}
	default:
		base, run := byte(r.Uint32()), 1+r.IntN(64)
		for i := range p {
			p[i] = base + byte(i/run)%7
		}
	}
}

// TestModel runs random operations from many goroutines against the device
// and against a plain byte slice; every read must match the model byte for
// byte. Each goroutine owns a region, so the model is exact, while pages of
// different regions share stripes, batches and store classes.
func TestModel(t *testing.T) {
	ops := 1_000_000
	if s := os.Getenv("GZRAMD_MODEL_OPS"); s != "" {
		ops, _ = strconv.Atoi(s)
	}
	if testing.Short() {
		ops = 20_000
	}
	runModel(t, ops, modelOptions{mode: modeBatched})
}

// TestModelPaths runs the model on the other paths a write can take: a
// primary that wants batches of 16 (requests go direct, into batches, and
// past the deadline to the CPU); the CPU-only path; and batches with the
// compactor moving objects as fast as it can underneath. The last runs
// the store as the daemon does when it is swap: with a prefaulter, which
// gives emptied slabs' pages back and faults released slabs in again for
// reuse, here with so little room to keep empty slabs that nearly every
// slab that empties goes through that queue.
func TestModelPaths(t *testing.T) {
	for _, tc := range []struct {
		name string
		opts modelOptions
	}{
		{"mixed", modelOptions{mode: modeMixed}},
		{"direct", modelOptions{mode: modeDirect}},
		{"compacting", modelOptions{mode: modeBatched, compact: true}},
		{"prefaulting", modelOptions{mode: modeDirect, compact: true,
			store: pagestore.Config{Prefault: 2 * pageSize, ArenaSize: 1 << 20}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ops := 200_000
			if testing.Short() {
				ops = 10_000
			}
			runModel(t, ops, tc.opts)
		})
	}
}

type modelOptions struct {
	mode    batchMode
	compact bool             // run the compactor as fast as it goes
	store   pagestore.Config // for the device's store
}

func runModel(t *testing.T, totalOps int, opts modelOptions) {
	const workers = 8
	const regionPages = 64
	ops := totalOps / workers
	size := int64(workers * regionPages * pageSize)
	f := newDeviceMode(t, size, opts.store, opts.mode)
	model := make([]byte, size)
	ctx := context.Background()
	if opts.compact {
		cctx, cancel := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() {
			f.dev.RunCompactor(cctx, CompactPolicy{Interval: 100 * time.Microsecond, MinWaste: 1, MaxOverhead: 1.0001})
			close(done)
		}()
		defer func() {
			cancel()
			<-done
			t.Logf("pages compacted: %d", f.dev.Stats().PagesCompacted)
		}()
	}

	var wg sync.WaitGroup
	errc := make(chan error, workers)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(w), 42))
			base := int64(w * regionPages * pageSize)
			region := int64(regionPages * pageSize)
			buf := make([]byte, 8*pageSize)
			for op := range ops {
				// Mostly whole pages (the swap pattern), sometimes any range.
				var off, n int64
				if r.IntN(4) > 0 {
					off = int64(r.IntN(regionPages)) * pageSize
					n = int64(1+r.IntN(min(8, regionPages-int(off/pageSize)))) * pageSize
				} else {
					off = r.Int64N(region)
					n = 1 + r.Int64N(min(int64(len(buf)), region-off))
				}
				m := model[base+off : base+off+n]
				var err error
				switch k := r.IntN(10); {
				case k < 4:
					p := buf[:n]
					for pg := 0; pg < int(n); pg += pageSize {
						fillData(r, p[pg:min(int(n), pg+pageSize)])
					}
					err = f.dev.WriteAt(ctx, p, base+off, false)
					copy(m, p)
				case k < 8:
					p := buf[:n]
					for i := range p {
						p[i] = 0xee
					}
					if err = f.dev.ReadAt(ctx, p, base+off); err == nil && !bytes.Equal(p, m) {
						err = fmt.Errorf("op %d: read [%d,+%d) differs from the model", op, base+off, n)
					}
				case k == 8:
					err = f.dev.Trim(ctx, base+off, n)
					clear(m)
				default:
					err = f.dev.WriteZeroes(ctx, base+off, n, r.IntN(2) == 0)
					clear(m)
				}
				if err != nil {
					errc <- fmt.Errorf("worker %d: %w", w, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errc)
	for err := range errc {
		t.Fatal(err)
	}
	t.Logf("batcher: %+v", f.bt.Stats())
	// A final full comparison, and the statistics must agree with the table.
	got := make([]byte, size)
	if err := f.dev.ReadAt(ctx, got, 0); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, model) {
		t.Fatal("final device contents differ from the model")
	}
	st := f.dev.Stats()
	var stored, same, huge int64
	for _, e := range f.dev.table {
		switch e.state() {
		case stateStored:
			stored++
		case stateHuge:
			stored++
			huge++
		case stateSame:
			same++
		}
	}
	if st.StoredPages != stored || st.SamePages != same || st.HugePages != huge {
		t.Fatalf("stats %+v disagree with the table: stored %d same %d huge %d", st, stored, same, huge)
	}
	if ss := f.store.Stats(); ss.Objects != stored {
		t.Fatalf("store holds %d objects, table references %d", ss.Objects, stored)
	}
}

// TestSamePageWriters races writers on the same pages: afterwards every
// page must hold one of the values written to it, whole.
func TestSamePageWriters(t *testing.T) {
	f := newDevice(t, 4*pageSize, 0)
	ctx := context.Background()
	rounds := 2000
	if testing.Short() {
		rounds = 200
	}
	var wg sync.WaitGroup
	for w := range 6 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p := make([]byte, pageSize)
			for i := range rounds {
				for j := range p {
					p[j] = byte(w*31+i) + byte(j/128)
				}
				if err := f.dev.WriteAt(ctx, p, int64(i%4)*pageSize, false); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	p := make([]byte, pageSize)
	for pg := range 4 {
		if err := f.dev.ReadAt(ctx, p, int64(pg)*pageSize); err != nil {
			t.Fatal(err)
		}
		for j := range p {
			if p[j]-byte(j/128) != p[0] {
				t.Fatalf("page %d is torn at byte %d", pg, j)
			}
		}
	}
	if n := f.store.Stats().Objects; n != 4 {
		t.Fatalf("%d objects stored for 4 pages: leaked or lost handles", n)
	}
}

// TestLateBatchLosesToTrim checks the ordering rule directly: a batched
// write still in flight when a trim of its page commits must not resurface.
func TestLateBatchLosesToTrim(t *testing.T) {
	f := newDevice(t, pageSize, 0)
	p := make([]byte, pageSize)
	for i := range p {
		p[i] = byte(i / 3)
	}
	// Simulate the interleaving: the write registers, the trim commits,
	// then the batch result arrives.
	idx := uint32(0)
	s := f.dev.stripe(idx)
	s.mu.Lock()
	seq := f.dev.seq.Add(1)
	s.pending.begin(idx)
	s.mu.Unlock()
	if err := f.dev.Trim(context.Background(), 0, pageSize); err != nil {
		t.Fatal(err)
	}
	comp := make([]byte, pageSize)
	n := codec.NewLZ4().Compress(comp, p)
	if err := f.dev.commitBatched(idx, seq, comp[:n], p); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, pageSize)
	if err := f.dev.ReadAt(context.Background(), got, 0); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, make([]byte, pageSize)) {
		t.Fatal("a late batch overwrote a newer trim")
	}
	if n := f.store.Stats().Objects; n != 0 {
		t.Fatalf("the losing write's object was not freed: %d objects", n)
	}
}

func TestMemLimitFailsWithENOSPCAndChangesNothing(t *testing.T) {
	const pages = 2048
	f := newDevice(t, pages*pageSize, 1<<20) // 1 MiB of store for 8 MiB of noise
	ctx := context.Background()
	r := rand.New(rand.NewPCG(9, 9))
	model := make([]byte, pages*pageSize)
	p := make([]byte, pageSize)
	var full int
	for pg := range pages {
		for i := range p {
			p[i] = byte(r.Uint32())
		}
		err := f.dev.WriteAt(ctx, p, int64(pg)*pageSize, false)
		switch {
		case err == nil:
			copy(model[pg*pageSize:], p)
		case errors.Is(err, syscall.ENOSPC):
			full++
		default:
			t.Fatalf("page %d: %v, want nil or ENOSPC", pg, err)
		}
	}
	if full == 0 {
		t.Fatal("no write hit the memory limit")
	}
	if st := f.dev.Stats(); st.MemUsedTotal > 1<<20 {
		t.Fatalf("store uses %d bytes over its 1 MiB limit", st.MemUsedTotal)
	}
	got := make([]byte, len(model))
	if err := f.dev.ReadAt(ctx, got, 0); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, model) {
		t.Fatal("device contents changed by failed writes")
	}
	// Same-filled pages need no memory and still succeed.
	if err := f.dev.WriteAt(ctx, make([]byte, pageSize), 0, false); err != nil {
		t.Fatalf("zero page at the limit: %v", err)
	}
}

func TestOutOfRange(t *testing.T) {
	f := newDevice(t, 16*pageSize, 0)
	ctx := context.Background()
	p := make([]byte, pageSize)
	for _, off := range []int64{-1, 16 * pageSize, 15*pageSize + 1} {
		if err := f.dev.ReadAt(ctx, p, off); !errors.Is(err, syscall.EINVAL) {
			t.Errorf("read at %d: %v, want EINVAL", off, err)
		}
		if err := f.dev.WriteAt(ctx, p, off, false); !errors.Is(err, syscall.EINVAL) {
			t.Errorf("write at %d: %v, want EINVAL", off, err)
		}
		if err := f.dev.Trim(ctx, off, pageSize); !errors.Is(err, syscall.EINVAL) {
			t.Errorf("trim at %d: %v, want EINVAL", off, err)
		}
	}
	if got := f.dev.Stats().InvalidIO; got != 9 {
		t.Errorf("invalid_io %d, want 9", got)
	}
}

func TestCompactKeepsContents(t *testing.T) {
	const pages = 4096
	f := newDevice(t, pages*pageSize, 0)
	ctx := context.Background()
	r := rand.New(rand.NewPCG(7, 7))
	model := make([]byte, pages*pageSize)
	for pg := range pages {
		fillData(r, model[pg*pageSize:(pg+1)*pageSize])
	}
	if err := f.dev.WriteAt(ctx, model, 0, false); err != nil {
		t.Fatal(err)
	}
	// Free three pages in four to leave sparse slabs.
	for pg := range pages {
		if pg%4 != 0 {
			if err := f.dev.Trim(ctx, int64(pg)*pageSize, pageSize); err != nil {
				t.Fatal(err)
			}
			clear(model[pg*pageSize : (pg+1)*pageSize])
		}
	}
	before := f.dev.Stats().MemUsedTotal
	moved := f.dev.Compact()
	after := f.dev.Stats().MemUsedTotal
	t.Logf("compaction moved %d objects; mem_used %d -> %d", moved, before, after)
	if moved == 0 || after >= before {
		t.Fatalf("compaction moved %d objects and mem_used went %d -> %d", moved, before, after)
	}
	got := make([]byte, len(model))
	if err := f.dev.ReadAt(ctx, got, 0); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, model) {
		t.Fatal("contents changed by compaction")
	}
}
