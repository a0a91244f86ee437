package pipeline

import (
	"bytes"
	"context"
	"errors"
	"syscall"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"
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

// TestTakeoverMarksUntrustedEntriesLost: an entry naming an object the
// store does not hold reads as EIO, is counted, and is replaced by the
// next write; the other pages are untouched.
func TestTakeoverMarksUntrustedEntriesLost(t *testing.T) {
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
	// Point page 1's entry at page 2's object: its tag names page 2.
	table, unmap := mapTable(t, st)
	table[1] = table[2]
	unmap()
	p, rec, err := Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if rec.Lost != 1 || rec.FirstLost != 1 || p.Device.Stats().LostPages != 1 {
		t.Fatalf("recovered %v, stats %+v", rec, p.Device.Stats())
	}
	got := make([]byte, pageBytes)
	if err := p.Device.ReadAt(ctx, got, pageBytes); !errors.Is(err, syscall.EIO) {
		t.Fatalf("reading the lost page: %v, want EIO", err)
	}
	for _, i := range []int{0, 2, 3} {
		if err := p.Device.ReadAt(ctx, got, int64(i)*pageBytes); err != nil || !bytes.Equal(got, pages[i*pageBytes:(i+1)*pageBytes]) {
			t.Fatalf("page %d: %v", i, err)
		}
	}
	if err := p.Device.WriteAt(ctx, pages[:pageBytes], pageBytes, false); err != nil {
		t.Fatal(err)
	}
	if err := p.Device.ReadAt(ctx, got, pageBytes); err != nil || p.Device.Stats().LostPages != 0 {
		t.Fatalf("after rewriting the lost page: %v, %+v", err, p.Device.Stats())
	}
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
