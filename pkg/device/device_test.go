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
	"runtime"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/gzramd/gzramd/pkg/codec"
	"github.com/gzramd/gzramd/pkg/pagestore"
	"github.com/gzramd/gzramd/pkg/route"
	"github.com/gzramd/gzramd/pkg/route/routetest"
	"github.com/gzramd/gzramd/pkg/stage"
)

type fixture struct {
	dev    *Device
	store  *pagestore.Store
	router *route.Router
	accel  *routetest.Accelerator // nil on the inline path
}

// newDevice returns a device whose writes are staged for an accelerator
// (a fake one, compressing on the CPU), the path a GPU takes.
func newDevice(t testing.TB, size, memLimit int64) *fixture {
	return newDeviceMode(t, size, pagestore.Config{MemLimit: memLimit}, pathStaged)
}

type writePath int

const (
	pathStaged writePath = iota // an accelerator: writes staged, batches on it
	pathInline                  // the CPU alone: writes compress their own pages
	// pathMixed stages into a tiny area for an accelerator that takes
	// batches of 6 pages or more: writes are staged or, when staging is
	// full, compressed inline, and small batches go to the CPU.
	pathMixed
)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// newDeviceMode returns a device over a store made with storeCfg, whose
// writes take the given path.
func newDeviceMode(t testing.TB, size int64, storeCfg pagestore.Config, path writePath) *fixture {
	t.Helper()
	return newDeviceObjects(t, size, storeCfg, path, 0)
}

// newDeviceObjects is newDeviceMode with Config.ObjectPages.
func newDeviceObjects(t testing.TB, size int64, storeCfg pagestore.Config, path writePath, objectPages int) *fixture {
	t.Helper()
	return newDeviceWith(t, size, storeCfg, path, func(c *Config) { c.ObjectPages = objectPages })
}

// newDeviceWith is newDeviceMode with the device's Config changed by set.
func newDeviceWith(t testing.TB, size int64, storeCfg pagestore.Config, path writePath, set func(*Config)) *fixture {
	t.Helper()
	store, err := pagestore.New(storeCfg)
	if err != nil {
		t.Fatal(err)
	}
	f := &fixture{store: store}
	rc := route.Config{Codec: codec.NewLZ4(), CPUWorkers: 2, Logger: quiet,
		Watchdog: 20 * time.Millisecond, MinBackoff: time.Millisecond, MaxBackoff: 5 * time.Millisecond}
	var sc stage.Config
	switch path {
	case pathStaged:
		sc = stage.Config{Batches: 8, BatchPages: 32, Deadline: 200 * time.Microsecond, Workers: 2}
		rc.MinAcceleratorPages = 1
	case pathMixed:
		sc = stage.Config{Batches: 3, BatchPages: 8, Deadline: 100 * time.Microsecond, Workers: 2}
		rc.MinAcceleratorPages = 6
	}
	cfg := Config{Size: size, Codec: codec.NewLZ4(), Store: store, Staging: sc, Logger: quiet}
	set(&cfg)
	rc.Codec = cfg.Codec // set may choose another
	if path != pathInline {
		f.accel = routetest.NewAcceleratorFor(cfg.Codec)
		rc.Accelerator, rc.BatchPages, rc.Workers = f.accel, sc.BatchPages, sc.Workers
	}
	if f.router, err = route.New(rc); err != nil {
		t.Fatal(err)
	}
	cfg.Router = f.router
	f.dev, err = New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		f.dev.Close()
		store.Close()
	})
	return f
}

// settle waits until nothing is staged: every acknowledged page is in the
// store.
func (f *fixture) settle(t testing.TB) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := f.dev.Drain(ctx); err != nil {
		t.Fatal(err)
	}
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
	runModel(t, ops, modelOptions{path: pathStaged})
}

// TestModelPaths runs the model on the other paths a write can take: a
// tiny staging area whose accelerator wants batches of 6 (writes are
// staged, or compressed inline when staging is full, and small batches go
// to the CPU); the CPU-only path; staged writes with the accelerator
// failing, hanging past the watchdog and writing late, mid-batch; and
// staged writes with the compactor moving objects as fast as it can
// underneath. The last runs the store as the daemon does when it is swap:
// with a prefaulter, which gives emptied slabs' pages back and faults
// released slabs in again for reuse, here with so little room to keep
// empty slabs that nearly every slab that empties goes through that
// queue.
func TestModelPaths(t *testing.T) {
	for _, tc := range []struct {
		name string
		opts modelOptions
	}{
		{"mixed", modelOptions{path: pathMixed}},
		{"inline", modelOptions{path: pathInline}},
		{"faults", modelOptions{path: pathStaged, faults: true}},
		{"mixed-faults", modelOptions{path: pathMixed, faults: true}},
		{"compacting", modelOptions{path: pathStaged, compact: true}},
		{"prefaulting", modelOptions{path: pathMixed, compact: true,
			store: pagestore.Config{Prefault: 2 * pageSize, ArenaSize: 1 << 20}}},
		// Objects of several pages: written inline, read in parts,
		// partly overwritten, trimmed and zeroed, moved by the compactor
		// chunk by chunk, and replaced by staged writes.
		{"objects-inline", modelOptions{path: pathInline, objectPages: 4}},
		{"objects-compacting", modelOptions{path: pathInline, objectPages: 16, compact: true}},
		{"objects-mixed", modelOptions{path: pathMixed, objectPages: 8, compact: true,
			store: pagestore.Config{Prefault: 2 * pageSize, ArenaSize: 1 << 20}}},
		// Objects of staged writes, made by the accelerator, which fails
		// and hangs, and by the CPU in its place.
		{"objects-staged-faults", modelOptions{path: pathStaged, objectPages: 16, faults: true}},
		// The dense tier recompressing groups idle for a moment, racing
		// writes, reads, staged commits and the compactor.
		{"dense-inline", modelOptions{path: pathInline, dense: true}},
		{"dense-mixed", modelOptions{path: pathMixed, objectPages: 4, compact: true, dense: true}},
		// zstd pages, objects of zstd frames, and the dense tier.
		{"zstd-objects", modelOptions{path: pathInline, objectPages: 8, compact: true, dense: true, zstd: true}},
		// zstd objects of staged writes, made by an accelerator that
		// writes zstd, fails and hangs, and by the CPU in its place.
		{"zstd-objects-staged", modelOptions{path: pathMixed, objectPages: 16, faults: true, dense: true, zstd: true}},
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
	path        writePath
	objectPages int              // Config.ObjectPages
	compact     bool             // run the compactor as fast as it goes
	faults      bool             // make the accelerator fail and hang
	store       pagestore.Config // for the device's store
	// dense runs the dense tier at full speed, groups idle after
	// 200 µs; the workers pause now and then to leave theirs idle.
	dense bool
	zstd  bool // the zstd codec (level 1), not LZ4
}

func runModel(t *testing.T, totalOps int, opts modelOptions) {
	const workers = 8
	const regionPages = 64
	ops := totalOps / workers
	size := int64(workers * regionPages * pageSize)
	f := newDeviceWith(t, size, opts.store, opts.path, func(c *Config) {
		c.ObjectPages = opts.objectPages
		if opts.zstd {
			z, err := codec.NewZstd(1)
			if err != nil {
				t.Fatal(err)
			}
			c.Codec = z
		}
		if opts.dense {
			c.Dense = DenseConfig{After: 200 * time.Microsecond, CPU: 1}
		}
	})
	model := make([]byte, size)
	pool := make([]byte, 2*pageSize)
	for i := range pool {
		pool[i] = byte(rand.Uint32())
	}
	ctx := context.Background()
	stopDense := func() {}
	if opts.dense {
		dctx, cancel := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() {
			f.dev.RunDense(dctx)
			close(done)
		}()
		stopDense = sync.OnceFunc(func() {
			cancel()
			<-done
			st := f.dev.Stats()
			t.Logf("dense tier: %+v; frames read from the cache %d, decoded %d", st.Dense, st.DenseFramesCached, st.DenseFramesDecoded)
		})
		defer stopDense()
	}
	if opts.faults {
		stop := make(chan struct{})
		done := make(chan struct{})
		go func() {
			defer close(done)
			injectFaults(f.accel, stop)
		}()
		defer func() {
			close(stop)
			<-done
			t.Logf("accelerator faults: %+v", f.router.Stats())
		}()
	}
	// The compactor stops before the final checks: while it moves an
	// object, the store holds it twice.
	stopCompactor := func() {}
	if opts.compact {
		cctx, cancel := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() {
			f.dev.RunCompactor(cctx, CompactPolicy{Interval: 100 * time.Microsecond, MinWaste: 1, MaxOverhead: 1.0001})
			close(done)
		}()
		stopCompactor = sync.OnceFunc(func() {
			cancel()
			<-done
			t.Logf("pages compacted: %d", f.dev.Stats().PagesCompacted)
		})
		defer stopCompactor()
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
			hist := newPageHistory(regionPages)
			for op := range ops {
				if opts.dense && op%500 == 499 {
					time.Sleep(2 * time.Millisecond)
				}
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
				regionModel := model[base : base+region]
				var err error
				k, how := r.IntN(10), ""
				switch {
				case k < 4:
					p := buf[:n]
					for pg := 0; pg < int(n); pg += pageSize {
						if opts.dense && r.IntN(2) == 0 {
							// Noise to LZ4 over a page, a few KiB to
							// zstd over a group: recompressed.
							copy(p[pg:min(int(n), pg+pageSize)], pool[r.IntN(4)*1024:])
							continue
						}
						fillData(r, p[pg:min(int(n), pg+pageSize)])
					}
					how = "write"
					if off%pageSize == 0 && n%pageSize == 0 && r.IntN(2) == 0 {
						// As the NBD server writes: received into staging.
						err = writeReceived(f.dev, p, base+off, r.IntN(20) == 0)
						how = "write received"
					} else {
						err = f.dev.WriteAt(ctx, p, base+off, false)
					}
					copy(m, p)
				case k < 8:
					p := buf[:n]
					for i := range p {
						p[i] = 0xee
					}
					if err = f.dev.ReadAt(ctx, p, base+off); err == nil && !bytes.Equal(p, m) {
						err = fmt.Errorf("op %d: read [%d,+%d) differs from the model:%s\n\tdevice %+v",
							op, base+off, n, hist.describe(f, regionModel, p, base, off), f.dev.Stats())
					}
				case k == 8:
					err = f.dev.Trim(ctx, base+off, n)
					clear(m)
					how = "trim"
				default:
					err = f.dev.WriteZeroes(ctx, base+off, n, r.IntN(2) == 0)
					clear(m)
					how = "zeroes"
				}
				if err != nil {
					errc <- fmt.Errorf("worker %d: %w", w, err)
					return
				}
				if how != "" {
					hist.record(regionModel, off, n, op, fmt.Sprintf("%s [%d,+%d)", how, base+off, n))
				}
			}
		}()
	}
	wg.Wait()
	stopCompactor()
	stopDense()
	close(errc)
	for err := range errc {
		t.Fatal(err)
	}
	f.settle(t)
	// A final full comparison, and the statistics must agree with the table.
	got := make([]byte, size)
	if err := f.dev.ReadAt(ctx, got, 0); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, model) {
		t.Fatal("final device contents differ from the model")
	}
	st := f.dev.Stats()
	var stored, same, huge, fills, chunks, parts, dense int64
	objects := map[pagestore.Handle]bool{}
	for _, e := range f.dev.table {
		switch e.state() {
		case statePart:
			stored++
			parts++
			if e.dense() {
				dense++
			}
			if !objects[e.handle()] {
				objects[e.handle()] = true
				l, err := objectHeader(f.store.Bytes(e.handle(), e.length()), e.partPages())
				if err != nil {
					t.Fatal(err)
				}
				chunks += int64(l.chunks)
			}
		case stateStored:
			stored++
		case stateHuge:
			stored++
			huge++
		case stateFill:
			fills++
			same++
		case stateSame:
			same++
		}
	}
	if st.StoredPages != stored || st.SamePages != same || st.HugePages != huge {
		t.Fatalf("stats %+v disagree with the table: stored %d same %d huge %d", st, stored, same, huge)
	}
	if opts.objectPages > 1 {
		if parts == 0 {
			t.Fatal("no page is part of an object of several pages: the test proved nothing")
		}
		t.Logf("%d pages in %d objects of several pages (%d chunks)", parts, len(objects), chunks)
	}
	if opts.dense {
		if st.Dense.Groups == 0 || dense == 0 {
			t.Fatalf("the dense tier recompressed %d groups, %d pages are dense: the test proved nothing", st.Dense.Groups, dense)
		}
		t.Logf("%d pages dense at the end", dense)
	}
	if st.DensePages != dense {
		t.Fatalf("stats count %d dense pages, the table %d", st.DensePages, dense)
	}
	if st.PackedPages != parts || st.PackedObjects != int64(len(objects)) || st.PackedChunks != chunks {
		t.Fatalf("stats count %d pages in %d objects of %d chunks, the table %d in %d of %d",
			st.PackedPages, st.PackedObjects, st.PackedChunks, parts, len(objects), chunks)
	}
	checkSettled(t, f, stored-parts+fills+chunks)
}

// checkSettled checks a device with nothing staged: the store holds
// exactly the objects the table references (objects: stored pages and
// fill words), every reservation of a staged page was given back, no
// object was freed twice, and every staged page was compressed exactly
// once.
func checkSettled(t *testing.T, f *fixture, objects int64) {
	t.Helper()
	ss := f.store.Stats()
	if ss.Allocations != objects || ss.Reserved != 0 || ss.BadHandles != 0 {
		t.Fatalf("store %+v: want %d objects (the table's), nothing reserved, no bad handles", ss, objects)
	}
	st, rs := f.dev.Stats(), f.router.Stats()
	if st.StagedPages != 0 {
		t.Fatalf("%d pages still staged", st.StagedPages)
	}
	if slots := rs.AcceleratorPages + rs.CPUPages - rs.InlinePages; slots != st.StagedWrites+st.UnusedSlots {
		t.Fatalf("%d staged slots compressed for %d staged writes and %d unused slots: router %+v", slots, st.StagedWrites, st.UnusedSlots, rs)
	}
	t.Logf("staged %d pages (%d on the accelerator), %d inline; %+v", st.StagedWrites, rs.AcceleratorPages, rs.InlinePages, st.Staging)
}

// writeReceived writes p at off as the NBD server does for a Backend that
// receives payloads itself: into the buffers ReceiveWrite gives, then
// CompleteWrite; or, with abort, the request is dropped (AbortWrite) and
// sent again. Where the device declines, it is an ordinary WriteAt.
func writeReceived(d *Device, p []byte, off int64, abort bool) error {
	ctx := context.Background()
	rc, ok := d.ReceiveWrite(off, len(p))
	if !ok {
		return d.WriteAt(ctx, p, off, false)
	}
	rest := p
	for _, b := range rc.Buffers() {
		rest = rest[copy(b, rest):]
	}
	if len(rest) != 0 {
		return fmt.Errorf("ReceiveWrite(%d, %d) gave buffers %d bytes short", off, len(p), len(rest))
	}
	if abort {
		d.AbortWrite(rc)
		return d.WriteAt(ctx, p, off, false)
	}
	return d.CompleteWrite(ctx, rc, false)
}

// injectFaults makes a the accelerator fail, hang past the router's
// watchdog (and then write its outputs late), run slow or work, in turns
// of a few milliseconds, until stop.
func injectFaults(a *routetest.Accelerator, stop <-chan struct{}) {
	r := rand.New(rand.NewPCG(5, 5))
	for {
		a.Failing.Store(false)
		a.FailEvery.Store(0)
		a.HangFor.Store(0)
		a.Delay.Store(0)
		switch r.IntN(5) {
		case 0:
			a.Failing.Store(true)
		case 1:
			a.FailEvery.Store(3)
		case 2:
			a.HangFor.Store(int64(30 * time.Millisecond)) // the watchdog is 20ms
		case 3:
			a.Delay.Store(int64(2 * time.Millisecond))
		}
		select {
		case <-stop:
			a.Failing.Store(false)
			a.FailEvery.Store(0)
			a.HangFor.Store(0)
			a.Delay.Store(0)
			return
		case <-time.After(time.Duration(1+r.IntN(10)) * time.Millisecond):
		}
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
	f.settle(t)
	checkSettled(t, f, 4)
}

// TestLateCommitLoses: a staged page's batch that commits after a newer
// write of the page (a trim, a same-filled page, a write compressed
// inline) committed must not resurface; its object is freed.
func TestLateCommitLoses(t *testing.T) {
	ctx := context.Background()
	p := make([]byte, pageSize)
	for i := range p {
		p[i] = byte(i / 3)
	}
	same := make([]byte, pageSize)
	for i := range same {
		same[i] = 0x5a
	}
	noise := make([]byte, pageSize)
	r := rand.New(rand.NewPCG(1, 1))
	for i := range noise {
		noise[i] = byte(r.Uint32())
	}
	for _, tc := range []struct {
		name  string
		newer func(f *fixture) error
		want  []byte
	}{
		{"trim", func(f *fixture) error { return f.dev.Trim(ctx, 0, pageSize) }, make([]byte, pageSize)},
		{"same-filled", func(f *fixture) error { return f.dev.WriteAt(ctx, same, 0, false) }, same},
		{"inline", func(f *fixture) error { return f.dev.inline.write(0, noise) }, noise},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newDevice(t, pageSize, 0)
			f.accel.Delay.Store(int64(30 * time.Millisecond))
			if err := f.dev.WriteAt(ctx, p, 0, false); err != nil {
				t.Fatal(err)
			}
			if f.dev.Stats().StagedPages != 1 {
				t.Fatalf("the write was not staged: %+v", f.dev.Stats())
			}
			// A read of the staged page is served from staging.
			got := make([]byte, pageSize)
			if err := f.dev.ReadAt(ctx, got, 0); err != nil || !bytes.Equal(got, p) {
				t.Fatalf("reading the staged page: %v, equal %v", err, bytes.Equal(got, p))
			}
			waitCompressing(t, f)
			if err := tc.newer(f); err != nil {
				t.Fatal(err)
			}
			f.settle(t)
			if err := f.dev.ReadAt(ctx, got, 0); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, tc.want) {
				t.Fatal("a late batch overwrote a newer write")
			}
			objects := int64(0)
			if f.dev.table[0].hasAllocation() {
				objects = 1
			}
			checkSettled(t, f, objects)
		})
	}
}

// TestStagingFull: with every staging buffer busy, writes compress inline
// and everything reads back.
func TestStagingFull(t *testing.T) {
	f := newDeviceMode(t, 256*pageSize, pagestore.Config{}, pathMixed)
	f.accel.Delay.Store(int64(20 * time.Millisecond))
	ctx := context.Background()
	r := rand.New(rand.NewPCG(2, 2))
	model := make([]byte, 256*pageSize)
	for pg := range 256 {
		fillData(r, model[pg*pageSize:(pg+1)*pageSize])
	}
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for pg := w * 32; pg < (w+1)*32; pg += 4 {
				if err := f.dev.WriteAt(ctx, model[pg*pageSize:(pg+4)*pageSize], int64(pg)*pageSize, false); err != nil {
					t.Error(err)
				}
			}
		}()
	}
	wg.Wait()
	st := f.dev.Stats()
	if st.Staging.Refused == 0 || f.router.Stats().InlinePages == 0 {
		t.Fatalf("staging never full: %+v, router %+v", st, f.router.Stats())
	}
	got := make([]byte, len(model))
	if err := f.dev.ReadAt(ctx, got, 0); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, model) {
		t.Fatal("contents differ with staging full")
	}
	f.settle(t)
	if err := f.dev.ReadAt(ctx, got, 0); err != nil || !bytes.Equal(got, model) {
		t.Fatalf("contents differ once settled (%v)", err)
	}
}

// TestCloseCommitsStagedPages: closing with batches staged and compressing
// waits for them and commits every page, and leaves no goroutine behind.
func TestCloseCommitsStagedPages(t *testing.T) {
	before := runtime.NumGoroutine()
	store, err := pagestore.New(pagestore.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	accel := routetest.NewAccelerator()
	accel.Delay.Store(int64(10 * time.Millisecond))
	router, err := route.New(route.Config{Codec: codec.NewLZ4(), Accelerator: accel, BatchPages: 32, Workers: 2, MinAcceleratorPages: 1, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	dev, err := New(Config{Size: 1 << 20, Codec: codec.NewLZ4(), Router: router, Store: store, Logger: quiet,
		Staging: stage.Config{Batches: 4, BatchPages: 32, Deadline: time.Second, Workers: 2}})
	if err != nil {
		t.Fatal(err)
	}
	r := rand.New(rand.NewPCG(3, 3))
	p := make([]byte, 48*pageSize)
	for pg := range 48 {
		fillData(r, p[pg*pageSize:(pg+1)*pageSize])
		p[pg*pageSize] = 1 // never same-filled
	}
	if err := dev.WriteAt(context.Background(), p, 0, false); err != nil {
		t.Fatal(err)
	}
	if st := dev.Stats(); st.StagedPages != 48 {
		t.Fatalf("%d pages staged, want 48", st.StagedPages)
	}
	dev.Close()
	if n := accel.Pages.Load(); n != 48 {
		t.Fatalf("Close left %d of 48 staged pages uncompressed", 48-n)
	}
	// Committed, not freed: the objects stay in the store's files.
	if st := store.Stats(); st.Allocations != 48 || st.Reserved != 0 || st.BadHandles != 0 {
		t.Fatalf("store after Close: %+v", st)
	}
	for deadline := time.Now().Add(5 * time.Second); runtime.NumGoroutine() > before; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d goroutines before, %d after Close", before, runtime.NumGoroutine())
		}
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
