package pagestore

import (
	"errors"
	"math/rand/v2"
	"syscall"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"
)

func newFiles(t *testing.T) *Files {
	t.Helper()
	f, err := NewFiles(t.Name())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return &f
}

// recoverStore takes over the store in files, keeping m's allocations.
func recoverStore(t *testing.T, cfg Config, m *model) *Store {
	t.Helper()
	rc, err := Recover(cfg)
	if err != nil {
		t.Fatal(err)
	}
	for o, al := range m.allocs {
		if al.h != 0 {
			if err := rc.Keep(al.h, uint32(o), al.size); err != nil {
				rc.Close()
				t.Fatal(err)
			}
		}
	}
	s, err := rc.Done()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// churn runs random allocations, frees and compactions on s against m,
// and leaves some allocations that m does not know of, as a writer
// killed between storing a page and committing it would.
func churn(t *testing.T, s *Store, m *model, rng *rand.Rand, ops int) {
	t.Helper()
	for range ops {
		o := uint32(rng.IntN(len(m.allocs)))
		if m.allocs[o].h != 0 && rng.IntN(3) == 0 {
			s.Free(m.allocs[o].h)
			m.allocs[o] = allocation{}
			continue
		}
		size := 1 + rng.IntN(MaxAllocSize)
		if rng.IntN(4) == 0 {
			size = 1 + rng.IntN(64)
		}
		h, b, err := allocOf(s, Lifetime(rng.IntN(lifetimes)), size, o)
		if err != nil {
			t.Fatal(err)
		}
		fill(b, uint64(o)<<20|uint64(size))
		if old := m.allocs[o].h; old != 0 {
			s.Free(old)
		}
		m.allocs[o] = allocation{h, size}
		if rng.IntN(2000) == 0 {
			s.Compact(m.relocate)
		}
	}
	for range 50 {
		if _, _, err := s.Alloc(1+rng.IntN(MaxAllocSize), uint32(rng.IntN(len(m.allocs)))); err != nil {
			t.Fatal(err)
		}
	}
}

// allocOf makes one allocation of lifetime lt, as Alloc does a short one.
func allocOf(s *Store, lt Lifetime, size int, owner uint32) (Handle, []byte, error) {
	if lt == Short {
		return s.Alloc(size, owner)
	}
	h := []Handle{0}
	if _, _, err := s.AllocBatch(lt, []int{size}, []uint32{owner}, h, 0); err != nil {
		return 0, nil, err
	}
	return h[0], s.Bytes(h[0], size), nil
}

func checkModel(t *testing.T, s *Store, m *model) {
	t.Helper()
	n, bytes := 0, 0
	for o, al := range m.allocs {
		if al.h != 0 {
			check(t, s.Bytes(al.h, al.size), uint64(o)<<20|uint64(al.size), al.size)
			n, bytes = n+1, bytes+al.size
		}
	}
	st := s.Stats()
	if st.Allocations != int64(n) || st.ComprDataSize != int64(bytes) {
		t.Fatalf("store counts %d allocations of %d bytes, the model %d of %d", st.Allocations, st.ComprDataSize, n, bytes)
	}
	checkInvariants(t, s)
}

// TestRecoverKeepsWhatItIsTold takes a store over three times, each after
// churning it: every allocation named survives intact, every other one is
// gone, the counts and the memory held are what a store that never
// stopped would have, and the recovered store goes on working.
func TestRecoverKeepsWhatItIsTold(t *testing.T) {
	t.Run("lazy", func(t *testing.T) { testRecover(t, 0) })
	t.Run("prefault", func(t *testing.T) { testRecover(t, 1<<20) })
}

func testRecover(t *testing.T, prefault int64) {
	files := newFiles(t)
	cfg := Config{ArenaSize: 2 << 20, Files: files, Prefault: prefault}
	rng := rand.New(rand.NewPCG(5, 6))
	m := newModel(3000)
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	for round := range 3 {
		churn(t, s, m, rng, 20000)
		if err := s.Close(); err != nil { // unmaps; the files stay as they are
			t.Fatal(err)
		}
		s = recoverStore(t, cfg, m)
		checkModel(t, s, m)
		st := s.Stats()
		res := resident(t, s)
		t.Logf("round %d: %d allocations, MemUsed %d pages, %d resident", round, st.Allocations, st.MemUsed/pageSize, res)
		if prefault == 0 && (res > st.MemUsed/pageSize || float64(res) < 0.97*float64(st.MemUsed/pageSize)) {
			t.Fatalf("round %d: MemUsed %d pages, %d resident", round, st.MemUsed/pageSize, res)
		}
	}
	s.Compact(m.relocate)
	checkModel(t, s, m)
	if prefault > 0 {
		return // emptied slabs stay resident, which expectEmpty does not allow
	}
	for _, al := range m.allocs {
		if al.h != 0 {
			s.Free(al.h)
		}
	}
	expectEmpty(t, s)
}

func TestRecoverRefuses(t *testing.T) {
	files := newFiles(t)
	cfg := Config{ArenaSize: 2 << 20, Files: files}
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	h, b, err := s.Alloc(100, 7)
	if err != nil {
		t.Fatal(err)
	}
	fill(b, 7)
	s.Close()

	if _, err := New(cfg); err == nil {
		t.Error("New took files that hold a store")
	}
	if _, err := Recover(Config{ArenaSize: 4 << 20, Files: files}); !errors.Is(err, ErrLayout) {
		t.Errorf("Recover with another arena size: %v, want ErrLayout", err)
	}
	rc, err := Recover(cfg)
	if err != nil {
		t.Fatal(err)
	}
	for _, bad := range []struct {
		h     Handle
		owner uint32
		size  int
	}{
		{h + 1, 7, 100},       // a cell never used
		{h, 8, 100},           // another owner
		{h, 7, 99},            // another size
		{1 << 40, 7, 100},     // no such slab
		{h &^ cellMask, 7, 0}, // cell 0 of its slab is h itself: size 0
	} {
		if err := rc.Keep(bad.h, bad.owner, bad.size); !errors.Is(err, syscall.EUCLEAN) {
			t.Errorf("Keep(%#x, %d, %d): %v, want EUCLEAN", bad.h, bad.owner, bad.size, err)
		}
	}
	if err := rc.Keep(h, 7, 100); err != nil {
		t.Fatal(err)
	}
	if err := rc.Keep(h, 7, 100); !errors.Is(err, syscall.EUCLEAN) {
		t.Errorf("Keep twice: %v", err)
	}
	// Given up: the files are as they were, for another try.
	rc.Close()
	m := newModel(8)
	m.allocs[7] = allocation{h, 100}
	s = recoverStore(t, cfg, m)
	check(t, s.Bytes(h, 100), 7, 100)
	s.Close()

	// A slab file from a build before lifetimes, which had the
	// short-lived classes alone: taken over, and marked as this build's
	// only once it holds a long-lived slab, which such a build would not
	// read; a file so marked but with no such slab is still taken over.
	rc, err = Recover(cfg)
	if err != nil {
		t.Fatal(err)
	}
	rc.s.header().classes = numClasses
	rc.Close()
	s = recoverStore(t, cfg, m)
	check(t, s.Bytes(h, 100), 7, 100)
	if _, _, err := s.Alloc(200, 3); err != nil {
		t.Fatal(err)
	}
	if got := s.header().classes; got != numClasses {
		t.Errorf("header after a short-lived allocation: %d classes, want %d still", got, numClasses)
	}
	hl, b, err := allocOf(s, Long, 300, 5)
	if err != nil {
		t.Fatal(err)
	}
	fill(b, 5)
	if got := s.header().classes; got != allClasses {
		t.Errorf("header once a long-lived slab is made: %d classes, want %d", got, allClasses)
	}
	s.Close()
	m.allocs[5] = allocation{hl, 300}
	s = recoverStore(t, cfg, m)
	check(t, s.Bytes(hl, 300), 5, 300)
	s.Close()
	// A long-lived slab in a file marked as from before lifetimes is not
	// this layout.
	header := func(classes uint32) {
		mem, err := files.Slabs.Map(0, pageSize)
		if err != nil {
			t.Fatal(err)
		}
		(*slabsHeader)(unsafe.Pointer(&mem[0])).classes = classes
		unix.Munmap(mem)
	}
	header(numClasses)
	if _, err := Recover(cfg); !errors.Is(err, ErrLayout) {
		t.Errorf("Recover of a long-lived slab in a file from before lifetimes: %v, want ErrLayout", err)
	}
	header(allClasses)

	// A slab file from another layout version.
	rc, err = Recover(cfg)
	if err != nil {
		t.Fatal(err)
	}
	(*slabsHeader)(unsafe.Pointer(&rc.s.recs[0])).version++
	rc.Close()
	if _, err := Recover(cfg); !errors.Is(err, ErrLayout) {
		t.Errorf("Recover of another version: %v, want ErrLayout", err)
	}
}
