package device

import (
	"bytes"
	"context"
	"errors"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/gzramd/gzramd/pkg/codec"
	"github.com/gzramd/gzramd/pkg/pagestore"
	"github.com/gzramd/gzramd/pkg/route"
)

// objectPage fills p with page i of the test's content: half random, half
// a repeated pattern, so that eight pages compress to several chunks.
func objectPage(seed uint64, i int, p []byte) {
	r := rand.New(rand.NewPCG(seed, uint64(i)))
	for j := range p {
		if j < len(p)/3 {
			p[j] = byte(r.Uint32())
		} else {
			p[j] = byte(j/32) ^ byte(i)
		}
	}
}

// objectFixture is a device on the CPU alone that keeps the pages of a
// write together, in files that a takeover can recover.
type objectFixture struct {
	cfg    Config
	sc     pagestore.Config
	dfiles Files
}

func newObjectFixture(t *testing.T, pages, objectPages int) *objectFixture {
	t.Helper()
	df, err := NewFiles(t.Name())
	if err != nil {
		t.Fatal(err)
	}
	sf, err := pagestore.NewFiles(t.Name())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { df.Close(); sf.Close() })
	router, err := route.New(route.Config{Codec: codec.NewLZ4(), CPUWorkers: 1, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	return &objectFixture{
		cfg: Config{Size: int64(pages) * pageSize, Codec: codec.NewLZ4(), Router: router, Files: &df, Logger: quiet, ObjectPages: objectPages},
		sc:  pagestore.Config{ArenaSize: 1 << 20, Files: &sf},
	}
}

// useCodec has the fixture's device store its pages with the named codec.
func (f *objectFixture) useCodec(t *testing.T, name string) {
	t.Helper()
	c, err := codec.New(name)
	if err != nil {
		t.Fatal(err)
	}
	router, err := route.New(route.Config{Codec: c, CPUWorkers: 1, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	f.cfg.Codec, f.cfg.Router = c, router
}

func (f *objectFixture) open(t *testing.T) (*Device, *pagestore.Store) {
	t.Helper()
	store, err := pagestore.New(f.sc)
	if err != nil {
		t.Fatal(err)
	}
	cfg := f.cfg
	cfg.Store = store
	d, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return d, store
}

func (f *objectFixture) recover(t *testing.T) (*Device, *pagestore.Store) {
	t.Helper()
	rc, err := pagestore.Recover(f.sc)
	if err != nil {
		t.Fatal(err)
	}
	d, store, rep, err := Recover(f.cfg, rc)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("recovered: %v", rep)
	return d, store
}

func checkContents(t *testing.T, d *Device, want []byte) {
	t.Helper()
	got := make([]byte, len(want))
	if err := d.ReadAt(context.Background(), got, 0); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < len(want); i += pageSize {
		if !bytes.Equal(got[i:i+pageSize], want[i:i+pageSize]) {
			t.Fatalf("page %d differs", i/pageSize)
		}
	}
	// Page by page too: each read decodes its object alone.
	for i := 0; i < len(want); i += pageSize {
		if err := d.ReadAt(context.Background(), got[:pageSize], int64(i)); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got[:pageSize], want[i:i+pageSize]) {
			t.Fatalf("page %d read alone differs", i/pageSize)
		}
	}
}

// checkStore checks that the store holds exactly the objects the table
// names: every page's own object, every chunk of the objects of several
// pages, once.
func checkStore(t *testing.T, d *Device, store *pagestore.Store) {
	t.Helper()
	st, ss := d.Stats(), store.Stats()
	var fills int64
	for _, e := range d.table {
		if e.state() == stateFill {
			fills++
		}
	}
	if want := st.StoredPages - st.PackedPages + st.PackedChunks + fills; ss.Allocations != want || ss.BadHandles != 0 {
		t.Fatalf("store holds %d objects (%d bad frees), the table names %d", ss.Allocations, ss.BadHandles, want)
	}
}

// A takeover keeps objects of several pages: whole, partly overwritten
// and trimmed, and one that the compactor was moving when the process
// died, its first chunk copied and only some of its pages pointed at the
// copy. Their pages read back, the copy is dropped, and every chunk is
// freed exactly once when the pages go, also by a process that keeps
// pages alone.
func TestRecoverKeepsObjectsOfSeveralPages(t *testing.T) {
	const pages = 64
	f := newObjectFixture(t, pages, 8)
	d, store := f.open(t)
	ctx := context.Background()
	want := make([]byte, pages*pageSize)
	for i := range pages {
		objectPage(1, i, want[i*pageSize:(i+1)*pageSize])
	}
	for at := 0; at < pages; at += 8 {
		if err := d.WriteAt(ctx, want[at*pageSize:(at+8)*pageSize], int64(at)*pageSize, false); err != nil {
			t.Fatal(err)
		}
	}
	st := d.Stats()
	if st.PackedObjects != pages/8 || st.PackedChunks <= st.PackedObjects {
		t.Fatalf("%d objects of several pages in %d chunks; want %d, of several chunks each", st.PackedObjects, st.PackedChunks, pages/8)
	}
	// Pages 0-2 trimmed, 20 rewritten on its own.
	if err := d.Trim(ctx, 0, 3*pageSize); err != nil {
		t.Fatal(err)
	}
	clear(want[:3*pageSize])
	objectPage(2, 20, want[20*pageSize:21*pageSize])
	if err := d.WriteAt(ctx, want[20*pageSize:21*pageSize], 20*pageSize, false); err != nil {
		t.Fatal(err)
	}
	// The compactor's move of the first chunk of pages 8-15, cut short.
	e := d.table[8]
	copyH, b, err := store.Alloc(e.length(), 8)
	if err != nil {
		t.Fatal(err)
	}
	copy(b, store.Bytes(e.handle(), e.length()))
	for i := 12; i < 16; i++ {
		d.table[i] = partEntry(copyH, d.table[i].partIndex(), d.table[i].partPages(), d.table[i].length())
	}
	d.Close()
	store.Close()

	// Taken over by a process that keeps pages alone: it still reads
	// the objects, and frees them as their pages go.
	f.cfg.ObjectPages = 0
	d, store = f.recover(t)
	defer func() { d.Close(); store.Close() }()
	if d.groupShift != groupShift || d.obj.scratches == nil {
		t.Fatal("a device that took objects of several pages over does not lock and read them as such")
	}
	if d.table[12].handle() != d.table[8].handle() {
		t.Fatal("pages of the object whose first chunk was being moved still name two")
	}
	checkContents(t, d, want)
	checkStore(t, d, store)
	// Everything rewritten page by page: every object's last page goes.
	for i := range pages {
		objectPage(3, i, want[i*pageSize:(i+1)*pageSize])
		if err := d.WriteAt(ctx, want[i*pageSize:(i+1)*pageSize], int64(i)*pageSize, false); err != nil {
			t.Fatal(err)
		}
	}
	if st := d.Stats(); st.PackedObjects != 0 || st.PackedChunks != 0 || st.PackedPages != 0 {
		t.Fatalf("after every page was rewritten alone: %d pages in %d objects of %d chunks", st.PackedPages, st.PackedObjects, st.PackedChunks)
	}
	checkContents(t, d, want)
	checkStore(t, d, store)
}

// A takeover refuses an object whose header disagrees with its pages'
// entries, and leaves the table as it was.
func TestRecoverRefusesABadObjectHeader(t *testing.T) {
	const pages = 16
	f := newObjectFixture(t, pages, 8)
	d, store := f.open(t)
	buf := make([]byte, pages*pageSize)
	for i := range pages {
		objectPage(1, i, buf[i*pageSize:(i+1)*pageSize])
	}
	if err := d.WriteAt(context.Background(), buf, 0, false); err != nil {
		t.Fatal(err)
	}
	e := d.table[0]
	store.Bytes(e.handle(), e.length())[4] = 7 // seven pages, not eight
	f.checkRefused(t, d, store, "a bad object header")
}

// checkRefused closes d and its store and checks that a takeover of what
// they left fails with ErrCorrupt, leaving the table as it was.
func (f *objectFixture) checkRefused(t *testing.T, d *Device, store *pagestore.Store, what string) {
	t.Helper()
	before := append([]entry(nil), d.table...)
	d.Close()
	store.Close()
	rc, err := pagestore.Recover(f.sc)
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	if _, _, _, err := Recover(f.cfg, rc); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("Recover over %s: %v, want ErrCorrupt", what, err)
	}
	d2, err := open(f.cfg, false)
	if err != nil {
		t.Fatal(err)
	}
	defer d2.unmap()
	if !slices.Equal(d2.table, before) {
		t.Fatal("a refused takeover changed the table")
	}
}

// Writing, reading and partly overwriting objects of several pages
// allocates nothing: the daemon serves the memory the kernel reclaims.
func TestObjectsDoNotAllocate(t *testing.T) {
	const pages = 64
	f := newObjectFixture(t, pages, 16)
	d, store := f.open(t)
	defer func() { d.Close(); store.Close() }()
	ctx := context.Background()
	data := make([]byte, 32*pageSize)
	for i := range 32 {
		objectPage(4, i, data[i*pageSize:(i+1)*pageSize])
	}
	got := make([]byte, 3*pageSize)
	run := func() {
		if err := d.WriteAt(ctx, data, 16*pageSize, false); err != nil {
			t.Fatal(err)
		}
		if err := d.ReadAt(ctx, got, 21*pageSize); err != nil {
			t.Fatal(err)
		}
		if err := d.WriteAt(ctx, data[:100], 30*pageSize+7, false); err != nil {
			t.Fatal(err)
		}
		if err := d.Trim(ctx, 40*pageSize, 4*pageSize); err != nil {
			t.Fatal(err)
		}
	}
	run() // the store's slabs made once
	if n := testing.AllocsPerRun(100, run); n != 0 {
		t.Fatalf("%.1f allocations a round", n)
	}
	if d.Stats().PackedObjects == 0 {
		t.Fatal("no object of several pages: the test proved nothing")
	}
}

// TestZstdObjects: a zstd device keeps the pages of a write together as
// zstd frames of a block a page, as an LZ4 device keeps LZ4 ones: they
// store less than the pages alone, read back whole and page by page, lose
// pages to rewrites and trims, and survive a takeover.
func TestZstdObjects(t *testing.T) {
	const pages = 64
	stored := map[int]int64{}
	for _, per := range []int{1, 8} {
		f := newObjectFixture(t, pages, per)
		z, err := codec.NewZstd(1)
		if err != nil {
			t.Fatal(err)
		}
		if f.cfg.Router, err = route.New(route.Config{Codec: z, CPUWorkers: 1, Logger: quiet}); err != nil {
			t.Fatal(err)
		}
		f.cfg.Codec = z
		d, store := f.open(t)
		ctx := context.Background()
		want := make([]byte, pages*pageSize)
		for i := range pages {
			objectPage(1, i%3, want[i*pageSize:(i+1)*pageSize]) // alike across pages
		}
		for at := 0; at < pages; at += 8 {
			if err := d.WriteAt(ctx, want[at*pageSize:(at+8)*pageSize], int64(at)*pageSize, false); err != nil {
				t.Fatal(err)
			}
		}
		st := d.Stats()
		stored[per] = st.ComprDataSize
		if per == 1 {
			d.Close()
			store.Close()
			continue
		}
		if st.PackedObjects != pages/8 {
			t.Fatalf("%d objects of several pages; want %d", st.PackedObjects, pages/8)
		}
		first := store.Bytes(d.table[0].handle(), d.table[0].length())
		if l, err := objectHeader(first, 8); err != nil || l.codec != streamZstd {
			t.Fatalf("the first object's header: %+v, %v; want a zstd stream", l, err)
		}
		checkContents(t, d, want)
		if err := d.Trim(ctx, 0, 3*pageSize); err != nil {
			t.Fatal(err)
		}
		clear(want[:3*pageSize])
		objectPage(2, 20, want[20*pageSize:21*pageSize])
		if err := d.WriteAt(ctx, want[20*pageSize:21*pageSize], 20*pageSize, false); err != nil {
			t.Fatal(err)
		}
		checkContents(t, d, want)
		checkStore(t, d, store)
		checkNotDense(t, d, "written")
		d.Close()
		store.Close()
		d, store = f.recover(t)
		checkContents(t, d, want)
		checkStore(t, d, store)
		checkNotDense(t, d, "recovered")
		if err := d.Trim(ctx, 0, pages*pageSize); err != nil {
			t.Fatal(err)
		}
		checkNotDense(t, d, "trimmed")
		d.Close()
		store.Close()
	}
	if stored[8] >= stored[1] {
		t.Fatalf("objects of 8 pages took %d bytes, the pages alone %d", stored[8], stored[1])
	}
	t.Logf("compressed: %d bytes in objects of 8 pages, %d pages alone", stored[8], stored[1])
}

// TestStagedWritesMakeObjects: staged writes are kept in objects of
// several pages as inline writes are, made by the accelerator: an object
// whose pages were all written again while its batch compressed is
// freed, one that lost some keeps the others, and the store holds
// exactly what the table names.
func TestStagedWritesMakeObjects(t *testing.T) {
	const pages = 64
	f := newDeviceObjects(t, pages*pageSize, pagestore.Config{}, pathStaged, 4)
	ctx := context.Background()
	want := make([]byte, pages*pageSize)
	for i := range pages {
		objectPage(1, i, want[i*pageSize:(i+1)*pageSize])
	}
	// Held in the accelerator long enough to write over some pages:
	// all of the object of pages 8-11, and pages 17 and 18.
	f.accel.Delay.Store(int64(50 * time.Millisecond))
	if err := f.dev.WriteAt(ctx, want[:32*pageSize], 0, false); err != nil {
		t.Fatal(err)
	}
	time.Sleep(5 * time.Millisecond) // sealed at its deadline, compressing
	f.accel.Delay.Store(0)
	// In descending order, so that they make no objects of their own.
	for _, i := range []int{11, 10, 9, 8, 18, 17} {
		objectPage(2, i, want[i*pageSize:(i+1)*pageSize])
		if err := f.dev.WriteAt(ctx, want[i*pageSize:(i+1)*pageSize], int64(i)*pageSize, false); err != nil {
			t.Fatal(err)
		}
	}
	f.settle(t) // the next write fills a batch of its own: one object every 4 pages
	if err := f.dev.WriteAt(ctx, want[32*pageSize:], 32*pageSize, false); err != nil {
		t.Fatal(err)
	}
	f.settle(t)
	st := f.dev.Stats()
	// Pages 0-31 in 8 objects less the one written over; 32-63 in 8.
	if st.PackedObjects != 15 || st.PackedPages != 58 || f.accel.Pages.Load() == 0 {
		t.Errorf("%d objects holding %d pages (%d on the accelerator), want 15 holding 58", st.PackedObjects, st.PackedPages, f.accel.Pages.Load())
	}
	checkContents(t, f.dev, want)
	checkStore(t, f.dev, f.store)
	if err := f.dev.Trim(ctx, 0, pages*pageSize); err != nil {
		t.Fatal(err)
	}
	if st, ss := f.dev.Stats(), f.store.Stats(); st.PackedObjects != 0 || ss.Allocations != 0 {
		t.Errorf("trimmed: %d objects, %d in the store", st.PackedObjects, ss.Allocations)
	}
}

// checkNotDense checks that d counts none of its objects in the dense
// tier: the fast tier's zstd objects are not the tier's.
func checkNotDense(t *testing.T, d *Device, when string) {
	t.Helper()
	if st := d.Stats(); st.DenseObjects != 0 || st.DenseBytes != 0 || st.DensePages != 0 {
		t.Errorf("%s: %d dense objects of %d bytes, %d dense pages; want none", when, st.DenseObjects, st.DenseBytes, st.DensePages)
	}
}
