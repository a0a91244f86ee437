package device

import (
	"context"
	"testing"
	"time"
)

// age runs d's dense tier until every group is settled.
func age(t testing.TB, d *Device) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		d.RunDense(ctx)
		close(done)
	}()
	deadline := time.Now().Add(20 * time.Second)
	for !d.denseSettled() && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	cancel()
	<-done
	if !d.denseSettled() {
		t.Fatal("the dense tier did not settle every group in 20 s")
	}
}

func newDenseFixture(t *testing.T, pages, objectPages int) *objectFixture {
	f := newObjectFixture(t, pages, objectPages)
	f.cfg.Dense = DenseConfig{After: 100 * time.Microsecond, CPU: 1}
	return f
}

// denseData is pages of content that zstd over a group compresses far
// better than LZ4 over a page, with a same-filled page and a zero page.
func denseData(pages int) []byte {
	data := make([]byte, pages*pageSize)
	for i := range pages {
		objectPage(uint64(i%3), i%5, data[i*pageSize:(i+1)*pageSize])
	}
	fill(data[3*pageSize:4*pageSize], 0x0101010101010101)
	clear(data[9*pageSize : 10*pageSize])
	return data
}

// TestDenseTierKeepsEveryPage ages a device with pages alone and objects
// of 4 pages into the dense tier: every page reads back, the store holds
// exactly the table's chunks, and the compressed data shrinks. Pages then leave
// the tier's objects one by one (a rewrite, a partial write, a trim, a
// write of zeroes) and the objects go with their last pages.
func TestDenseTierKeepsEveryPage(t *testing.T) {
	const pages = 64
	for _, per := range []int{1, 4} {
		f := newDenseFixture(t, pages, per)
		d, store := f.open(t)
		ctx := context.Background()
		data := denseData(pages)
		if err := d.WriteAt(ctx, data, 0, false); err != nil {
			t.Fatal(err)
		}
		before := d.Stats()
		age(t, d)
		st := d.Stats()
		// What the store holds shrinks; its slabs go back once the
		// compactor runs.
		if st.DenseObjects != pages/groupPages || st.DensePages != st.StoredPages || st.ComprDataSize >= before.ComprDataSize {
			t.Fatalf("objects of %d: after aging %d dense pages of %d in %d objects, compr_data %d (%d before)",
				per, st.DensePages, st.StoredPages, st.DenseObjects, st.ComprDataSize, before.ComprDataSize)
		}
		t.Logf("objects of %d: compressed data %d -> %d bytes, mem_used %d -> %d", per, before.ComprDataSize, st.ComprDataSize, before.MemUsedTotal, st.MemUsedTotal)
		checkContents(t, d, data)
		checkStore(t, d, store)
		// A settled group is not done again.
		groups := d.Stats().Dense.Groups
		age(t, d)
		if g := d.Stats().Dense.Groups; g != groups {
			t.Fatalf("aging again recompressed %d groups", g-groups)
		}
		for i := range pages {
			idx := int64(i)
			var err error
			switch i % 4 {
			case 0:
				objectPage(9, i, data[i*pageSize:(i+1)*pageSize])
				err = d.WriteAt(ctx, data[i*pageSize:(i+1)*pageSize], idx*pageSize, false)
			case 1:
				data[i*pageSize+100] ^= 0xff
				err = d.WriteAt(ctx, data[i*pageSize+100:i*pageSize+101], idx*pageSize+100, false)
			case 2:
				clear(data[i*pageSize : (i+1)*pageSize])
				err = d.Trim(ctx, idx*pageSize, pageSize)
			case 3:
				clear(data[i*pageSize : (i+1)*pageSize])
				err = d.WriteZeroes(ctx, idx*pageSize, pageSize, true)
			}
			if err != nil {
				t.Fatal(err)
			}
			if i%7 == 0 {
				checkContents(t, d, data)
				checkStore(t, d, store)
			}
		}
		checkContents(t, d, data)
		checkStore(t, d, store)
		if st := d.Stats(); st.DensePages != 0 || st.DenseObjects != 0 || st.DenseBytes != 0 {
			t.Fatalf("every page left the tier, and it counts %d pages in %d objects of %d bytes", st.DensePages, st.DenseObjects, st.DenseBytes)
		}
		// The pages written since age into the tier again.
		age(t, d)
		checkContents(t, d, data)
		checkStore(t, d, store)
		d.Close()
		store.Close()
	}
}

// TestRecoverKeepsDenseObjects takes over a device with dense objects,
// in a process whose dense tier is off: their pages read back, and are
// freed exactly once when rewritten.
func TestRecoverKeepsDenseObjects(t *testing.T) {
	const pages = 48
	f := newDenseFixture(t, pages, 1)
	d, store := f.open(t)
	data := denseData(pages)
	if err := d.WriteAt(context.Background(), data, 0, false); err != nil {
		t.Fatal(err)
	}
	age(t, d)
	want := d.Stats()
	d.Close()
	store.Close()
	f.cfg.Dense = DenseConfig{}
	d, store = f.recover(t)
	defer func() { d.Close(); store.Close() }()
	if st := d.Stats(); st.DensePages != want.DensePages || st.DenseObjects != want.DenseObjects || st.DenseBytes != want.DenseBytes || st.DensePages == 0 {
		t.Fatalf("took over %d dense pages in %d objects of %d bytes, the device had %d in %d of %d",
			st.DensePages, st.DenseObjects, st.DenseBytes, want.DensePages, want.DenseObjects, want.DenseBytes)
	}
	checkContents(t, d, data)
	checkStore(t, d, store)
	if h := d.Held(); h.Dense == 0 {
		t.Error("the decoder made for the dense objects taken over is not counted in Held")
	}
	for i := range data {
		data[i] = byte(i / 5)
	}
	if err := d.WriteAt(context.Background(), data, 0, false); err != nil {
		t.Fatal(err)
	}
	checkContents(t, d, data)
	checkStore(t, d, store)
	if st := d.Stats(); st.DenseObjects != 0 {
		t.Fatalf("%d dense objects left after every page was rewritten", st.DenseObjects)
	}
}

// TestRecoverRefusesATierMismatch: an entry whose dense bit disagrees with
// its object's codec is corruption, and the takeover leaves the table as
// it was.
func TestRecoverRefusesATierMismatch(t *testing.T) {
	const pages = 16
	f := newDenseFixture(t, pages, 1)
	d, store := f.open(t)
	if err := d.WriteAt(context.Background(), denseData(pages), 0, false); err != nil {
		t.Fatal(err)
	}
	age(t, d)
	if !d.table[0].dense() {
		t.Fatal("page 0 is not dense: the test proves nothing")
	}
	d.table[0] &^= denseBit
	f.checkRefused(t, d, store, "an entry of the wrong tier")
}

// TestDenseReadsDoNotAllocate: reading dense pages, alone and together,
// allocates nothing.
func TestDenseReadsDoNotAllocate(t *testing.T) {
	const pages = 32
	f := newDenseFixture(t, pages, 1)
	d, store := f.open(t)
	defer func() { d.Close(); store.Close() }()
	ctx := context.Background()
	if err := d.WriteAt(ctx, denseData(pages), 0, false); err != nil {
		t.Fatal(err)
	}
	age(t, d)
	got := make([]byte, 8*pageSize)
	run := func() {
		if err := d.ReadAt(ctx, got[:pageSize], 5*pageSize); err != nil {
			t.Fatal(err)
		}
		if err := d.ReadAt(ctx, got, 12*pageSize); err != nil {
			t.Fatal(err)
		}
	}
	if n := testing.AllocsPerRun(100, run); n != 0 {
		t.Fatalf("%.1f allocations a round", n)
	}
}
