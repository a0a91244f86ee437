package device

import (
	"bytes"
	"context"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/gzramd/gzramd/internal/memfd"
)

// tablePagesIn returns the pages of table the file holds (faulted in by
// some process, and so memory).
func tablePagesIn(t *testing.T, f *memfd.File) map[uint32]bool {
	t.Helper()
	in := map[uint32]bool{}
	err := f.Extents(func(off, n int64) bool {
		for p := off / pageSize; p < (off+n)/pageSize; p++ {
			in[uint32(p)] = true
		}
		return true
	})
	if err != nil {
		t.Fatal(err)
	}
	return in
}

// waitFront waits until gzramd-table has faulted in every page of table
// below p.
func waitFront(t *testing.T, d *Device, p uint32) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); d.backing.front.Load() < p; {
		if time.Now().After(deadline) {
			t.Fatalf("gzramd-table's front is at page of table %d, not %d", d.backing.front.Load(), p)
		}
		time.Sleep(100 * time.Microsecond)
	}
}

// The table of a large device is faulted in as far as writes reach, and
// tableAhead pages beyond, by gzramd-table: writes going forward, as swap
// goes into never-used parts of the device, fault none in themselves.
// Reads, trims and a takeover's scan of the never-written part fault in
// nothing, and a takeover keeps what the process before faulted in.
func TestTableFaultedInAheadOfWrites(t *testing.T) {
	const size = 8 << 30
	fx := newObjectFixture(t, size/pageSize, 0)
	d, store := fx.open(t)
	if got, want := d.Held().Table, int64(tableAhead*pageSize); got != want {
		t.Fatalf("a fresh device of 8 GiB holds %d bytes of table, want %d", got, want)
	}
	const written = 256 // pages of table written, one page each
	page := make([]byte, pageSize)
	for p := range uint32(written) {
		fillData(rand.New(rand.NewPCG(uint64(p), 1)), page)
		page[0] = byte(p) | 1 // not a same-filled page
		if err := d.WriteAt(context.Background(), page, int64(p)*entriesPerPage*pageSize, false); err != nil {
			t.Fatal(err)
		}
		waitFront(t, d, p+1+tableAhead)
	}
	far := int64(6<<30) / pageSize // a write far beyond: faulted in late
	if err := d.WriteAt(context.Background(), page, far*pageSize, false); err != nil {
		t.Fatal(err)
	}
	if err := d.ReadAt(context.Background(), page, 7<<30); err != nil || !bytes.Equal(page, make([]byte, pageSize)) {
		t.Fatalf("a never-written page reads %v, %x...", err, page[:8])
	}
	if err := d.Trim(context.Background(), 7<<30, 512<<20); err != nil {
		t.Fatal(err)
	}
	if st := d.Stats(); st.TableLate != 1 {
		t.Errorf("%d pages of table faulted in late, want 1 (the far write's)", st.TableLate)
	}
	want := map[uint32]bool{uint32(far >> entryPageShift): true}
	for p := range uint32(written + tableAhead) {
		want[p] = true
	}
	checkTablePages := func(d *Device) {
		t.Helper()
		got := tablePagesIn(t, fx.cfg.Files.Table)
		for p := range got {
			if !want[p] {
				t.Errorf("page of table %d faulted in", p)
			}
		}
		if len(got) != len(want) {
			t.Errorf("%d pages of table faulted in, want %d", len(got), len(want))
		}
		if h := d.Held().Table; h != int64(len(want))*pageSize {
			t.Errorf("Held().Table = %d, want %d", h, len(want)*pageSize)
		}
	}
	checkTablePages(d)
	d.Close()
	store.Close()

	d, store = fx.recover(t)
	defer store.Close()
	defer d.Close()
	checkTablePages(d)
	if r := d.backing.reach.Load(); r != written {
		t.Errorf("a takeover finds writes reaching page of table %d, want %d", r, written)
	}
	for p := range uint32(written) {
		if err := d.ReadAt(context.Background(), page, int64(p)*entriesPerPage*pageSize); err != nil || page[0] != byte(p)|1 {
			t.Fatalf("page of table %d's first page reads back %v, %x", p, err, page[0])
		}
	}
}

// A table an older gzramd faulted in whole is taken over whole.
func TestRecoverTakesAWholeTable(t *testing.T) {
	const size = 1 << 30
	fx := newObjectFixture(t, size/pageSize, 0)
	d, store := fx.open(t)
	page := bytes.Repeat([]byte("older"), pageSize/5+1)[:pageSize]
	if err := d.WriteAt(context.Background(), page, size-pageSize, false); err != nil {
		t.Fatal(err)
	}
	d.Close()
	store.Close()
	mem, err := fx.cfg.Files.Table.Map(0, size/pageSize*8)
	if err != nil {
		t.Fatal(err)
	}
	memfd.Populate(mem)
	d, store = fx.recover(t)
	defer store.Close()
	defer d.Close()
	if got, want := d.Held().Table, int64(size/pageSize*8); got != want {
		t.Errorf("Held().Table = %d after taking over a whole table, want %d", got, want)
	}
	got := make([]byte, pageSize)
	if err := d.ReadAt(context.Background(), got, size-pageSize); err != nil || !bytes.Equal(got, page) {
		t.Fatalf("the last page reads back %v, %q...", err, got[:10])
	}
}

// Writers and readers all over a large device, its table faulted in by
// writes and by gzramd-table at once: every page reads back as written.
func TestTableFaultedInUnderConcurrentWrites(t *testing.T) {
	const size = 4 << 30
	f := newDevice(t, size, 0)
	const workers, writes = 4, 400
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(w), 2))
			mine := map[int64][]byte{}
			page, got := make([]byte, pageSize), make([]byte, pageSize)
			for range writes {
				// Each worker owns the pages p ≡ w (mod workers).
				off := (r.Int64N(size/pageSize/workers)*workers + int64(w)) * pageSize
				if r.IntN(3) == 0 {
					off = (r.Int64N(4096)*workers + int64(w)) * pageSize // near the start
				}
				fillData(r, page)
				if err := f.dev.WriteAt(context.Background(), page, off, false); err != nil {
					t.Error(err)
					return
				}
				mine[off] = bytes.Clone(page)
				off = (r.Int64N(size/pageSize/workers)*workers + int64(w)) * pageSize
				if err := f.dev.ReadAt(context.Background(), got, off); err != nil {
					t.Error(err)
					return
				}
				if want, ok := mine[off]; ok && !bytes.Equal(got, want) || !ok && !bytes.Equal(got, make([]byte, pageSize)) {
					t.Errorf("page %d reads back otherwise", off/pageSize)
					return
				}
			}
			f.settle(t)
			for off, want := range mine {
				if err := f.dev.ReadAt(context.Background(), got, off); err != nil || !bytes.Equal(got, want) {
					t.Errorf("page %d reads back otherwise at the end (%v)", off/pageSize, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	st := f.dev.Stats()
	t.Logf("%d pages of table faulted in, %d of them late", f.dev.Held().Table/pageSize, st.TableLate)
	if st.TableLate == 0 {
		t.Error("no page of table faulted in late, though the writes went all over the device")
	}
}
