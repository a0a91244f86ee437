package pipeline

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/gzramd/gzramd/internal/memfd"
	"github.com/gzramd/gzramd/pkg/device"
)

func newTestState(t *testing.T) *State {
	t.Helper()
	st, err := NewState(t.Name())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return st
}

// TestOpenChecksTheHeader: a state is taken over only by a data path of
// its size, algorithm and layout; one never sealed starts afresh.
func TestOpenChecksTheHeader(t *testing.T) {
	st := newTestState(t)
	cfg := Config{Size: 1 << 20, State: st, Logger: quietLogger()}
	p, rec, err := Open(cfg)
	if err != nil || rec != nil {
		t.Fatalf("Open of an empty state: %v, %v", rec, err)
	}
	page := bytes.Repeat([]byte("gzramd"), 700)[:pageBytes]
	if err := p.Device.WriteAt(context.Background(), page, 5*pageBytes, false); err != nil {
		t.Fatal(err)
	}
	p.Close()
	if _, err := New(cfg); err == nil {
		t.Error("New built a data path over a sealed state")
	}
	other := cfg
	other.Size = 2 << 20
	if _, _, err := Open(other); err == nil {
		t.Error("a state of 1 MiB taken over as 2 MiB")
	}
	other = cfg
	other.Algorithm = "zstd"
	if _, _, err := Open(other); err == nil {
		t.Error("an lz4 state taken over as zstd")
	}
	h, unmap, err := st.mapHeader()
	if err != nil {
		t.Fatal(err)
	}
	h.version++
	if _, _, err := Open(cfg); !errors.Is(err, ErrStateLayout) {
		t.Errorf("Open of another version: %v, want ErrStateLayout", err)
	}
	h.version--
	p, rec, err = Open(cfg)
	if err != nil || rec == nil || rec.Stored != 1 {
		t.Fatalf("Open after the refusals: %v, %v", rec, err)
	}
	got := make([]byte, pageBytes)
	if err := p.Device.ReadAt(context.Background(), got, 5*pageBytes); err != nil || !bytes.Equal(got, page) {
		t.Fatalf("page 5 after the takeover: %v, equal %v", err, bytes.Equal(got, page))
	}
	p.Close()
	// A state whose builder died before sealing it holds nothing.
	h.sealed = 0
	unmap()
	p, rec, err = Open(cfg)
	if err != nil || rec != nil || p.Device.Stats().StoredPages != 0 {
		t.Fatalf("Open of an unsealed state: %v, %v", rec, err)
	}
	p.Close()
}

// TestTakeoverRefusesACorruptTable: a page table that names cells
// outside the arenas, allocations of another page or size, or states no device
// writes is refused with ErrCorrupt, and neither the table nor the arenas
// change; once the table is right again the state is taken over whole.
func TestTakeoverRefusesACorruptTable(t *testing.T) {
	st := newTestState(t)
	cfg := Config{Size: 1 << 20, State: st, Logger: quietLogger()}
	p, _, err := Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	pages := make([]byte, 4*pageBytes)
	for i := range pages {
		pages[i] = byte(i / 100)
	}
	ctx := context.Background()
	if err := p.Device.WriteAt(ctx, pages, 0, false); err != nil {
		t.Fatal(err)
	}
	p.Close()
	table, unmap := mapTable(t, st)
	defer unmap()
	good := table[1]
	const handleBits = 1<<48 - 1 // the handle: the entry's low 48 bits
	for _, c := range []struct {
		name  string
		entry uint64
	}{
		{"a cell outside the arenas", good | handleBits},
		{"another page's allocation", table[2]},
		{"another size", good + 1<<48},
		{"a state no device writes", good&^(7<<61) | 7<<61},
	} {
		t.Run(c.name, func(t *testing.T) {
			table[1] = c.entry
			tableBefore := append([]uint64(nil), table...)
			arenasBefore, slabsBefore := fileBytes(t, st.Store.Arenas), fileBytes(t, st.Store.Slabs)
			p, _, err := Open(cfg)
			if err == nil {
				p.Close()
				t.Fatal("a corrupt table was taken over")
			}
			if !errors.Is(err, device.ErrCorrupt) || !strings.Contains(err.Error(), "page 1:") {
				t.Fatalf("Open: %v, want ErrCorrupt naming page 1", err)
			}
			if !slicesEqual(table, tableBefore) || !bytes.Equal(fileBytes(t, st.Store.Arenas), arenasBefore) ||
				!bytes.Equal(fileBytes(t, st.Store.Slabs), slabsBefore) {
				t.Fatal("a refused takeover changed the state")
			}
		})
	}
	table[1] = good
	p, rec, err := Open(cfg)
	if err != nil || rec.Stored != 4 {
		t.Fatalf("Open of the repaired state: %v, %v", rec, err)
	}
	defer p.Close()
	got := make([]byte, len(pages))
	if err := p.Device.ReadAt(ctx, got, 0); err != nil || !bytes.Equal(got, pages) {
		t.Fatalf("reading back after the refusals: %v", err)
	}
}

func fileBytes(t *testing.T, f *memfd.File) []byte {
	t.Helper()
	size, err := f.Size()
	if err != nil {
		t.Fatal(err)
	}
	b := make([]byte, size)
	if _, err := unix.Pread(f.Fd(), b, 0); err != nil {
		t.Fatal(err)
	}
	return b
}

func slicesEqual(a, b []uint64) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func mapTable(t *testing.T, st *State) ([]uint64, func()) {
	t.Helper()
	size, err := st.Device.Table.Size()
	if err != nil {
		t.Fatal(err)
	}
	mem, err := st.Device.Table.Map(0, int(size))
	if err != nil {
		t.Fatal(err)
	}
	return unsafeWords(mem), func() { munmap(mem) }
}

func unsafeWords(mem []byte) []uint64 {
	return unsafe.Slice((*uint64)(unsafe.Pointer(&mem[0])), len(mem)/8)
}

func munmap(mem []byte) { unix.Munmap(mem) }
