package pagestore

import (
	"errors"
	"math/rand/v2"
	"sync"
	"syscall"
	"testing"
)

// fill writes a pattern determined by seed; check verifies it.
func fill(b []byte, seed uint64) {
	x := seed*0x9E3779B97F4A7C15 + 1
	for i := range b {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		b[i] = byte(x)
	}
}

func check(t *testing.T, b []byte, seed uint64, size int) {
	t.Helper()
	if len(b) != size {
		t.Fatalf("allocation %d: %d bytes, want %d", seed, len(b), size)
	}
	want := make([]byte, size)
	fill(want, seed)
	if string(b) != string(want) {
		t.Fatalf("allocation %d (%d bytes): content differs", seed, size)
	}
}

// checkInvariants walks every slab and compares it with the counters.
// Nothing else may use the store meanwhile.
func checkInvariants(t *testing.T, s *Store) {
	t.Helper()
	var held, allocations, bytes int64
	for ci := range s.classes {
		c, g := &s.classes[ci], &s.geo[ci]
		inPartial := map[uint32]bool{}
		for id := c.partial; id != 0; id = s.rec(id).next {
			inPartial[id] = true
		}
		inDraining := map[uint32]bool{}
		for id := c.draining; id != 0; id = s.rec(id).next {
			inDraining[id] = true
		}
		var classAllocs, classBytes int64
		for id := uint32(1); id < s.nslabs.Load(); id++ {
			r := s.rec(id)
			if int(r.class) != ci {
				continue
			}
			held += int64(r.touched) * pageSize
			if r.state == slabEmpty {
				if (r.touched != 0 && id != c.cached) || r.touched > maxCachedPages || r.live != 0 || r.bump != 0 || r.freeHead != 0 {
					t.Fatalf("empty slab %d holds %d pages, %d allocations", id, r.touched, r.live)
				}
				continue
			}
			mem := s.slabMem(r, g)
			live := 0
			for cell := uint32(0); cell < uint32(r.bump); cell++ {
				if !isFree(owner(mem, cell)) {
					live++
					classBytes += int64(g.size - uint32(delta(mem, cell)))
				}
			}
			free := 0
			for f := r.freeHead; f != 0; f = uint16(owner(mem, uint32(f-1)) &^ freeTag) {
				if !isFree(owner(mem, uint32(f-1))) {
					t.Fatalf("slab %d: free list holds live cell %d", id, f-1)
				}
				if free++; free > int(r.bump) {
					t.Fatalf("slab %d: free list loops", id)
				}
			}
			if live != int(r.live) || live+free != int(r.bump) {
				t.Fatalf("slab %d: %d live tags, %d free, bump %d, live count %d", id, live, free, r.bump, r.live)
			}
			if live == 0 {
				t.Fatalf("slab %d (state %d) is empty but holds %d pages", id, r.state, r.touched)
			}
			// A reused cached slab may hold pages its mark has not reached.
			want := pagesFor(cellAt(g, uint32(r.bump)))
			if s.pf.prefault > 0 && !r.cold {
				// Faulted in whole ahead, and counted whole.
				want = g.pages
				if n := residentPages(t, mem); n != int(g.pages) {
					t.Fatalf("slab %d: %d of its %d pages resident, and writers may reach into the rest", id, n, g.pages)
				}
			}
			if uint32(r.touched) != want && (r.touched < uint16(want) || r.touched > maxCachedPages) {
				t.Fatalf("slab %d: %d pages counted, %d reached", id, r.touched, want)
			}
			switch r.state {
			case slabActive:
				if inPartial[id] != (uint32(r.live) < g.cells) {
					t.Fatalf("slab %d: %d of %d cells live, in partial list: %v", id, r.live, g.cells, inPartial[id])
				}
			case slabCold:
				if inPartial[id] || !r.cold {
					t.Fatalf("slab %d: cold and in the partial list (%v), or marked warm (%v)", id, inPartial[id], !r.cold)
				}
			case slabDraining:
				if !inDraining[id] {
					t.Fatalf("draining slab %d not in draining list", id)
				}
			default:
				t.Fatalf("slab %d in state %d outside Compact", id, r.state)
			}
			classAllocs += int64(live)
		}
		if classAllocs != c.allocations.Load() || classBytes != c.bytes.Load() {
			t.Fatalf("class %d: %d allocations of %d bytes, counters say %d of %d", ci, classAllocs, classBytes, c.allocations.Load(), c.bytes.Load())
		}
		allocations += classAllocs
		bytes += classBytes
	}
	st := s.Stats()
	if held != st.MemUsed || allocations != st.Allocations || bytes != st.ComprDataSize {
		t.Fatalf("walk: %d bytes held, %d allocations, %d data bytes; stats %+v", held, allocations, bytes, st)
	}
	if st.MemUsedMax < st.MemUsed || (st.MemLimit > 0 && st.MemUsed > st.MemLimit && st.MemUsed > 0) {
		// Only Alloc grows MemUsed, always within the limit; a lowered
		// limit may leave it above, which the tests that lower it allow.
		if st.MemUsedMax < st.MemUsed {
			t.Fatalf("MemUsedMax %d < MemUsed %d", st.MemUsedMax, st.MemUsed)
		}
	}
}

// expectEmpty checks a store whose allocations were all freed: it holds only
// the classes' cached slabs, and Compact gives those back.
func expectEmpty(t *testing.T, s *Store) {
	t.Helper()
	checkInvariants(t, s)
	st := s.Stats()
	if st.Allocations != 0 || st.ComprDataSize != 0 || st.MemUsed > numClasses*maxCachedPages*pageSize {
		t.Fatalf("after freeing everything: %+v", st)
	}
	if moved := s.Compact(func(uint32, Handle, Handle) bool { t.Fatal("relocate called on an empty store"); return false }); moved != 0 {
		t.Fatalf("Compact moved %d allocations of an empty store", moved)
	}
	if st := s.Stats(); st.MemUsed != 0 {
		t.Fatalf("after Compact of an empty store, MemUsed %d", st.MemUsed)
	}
	checkInvariants(t, s)
}

func newStore(t testing.TB, cfg Config) *Store {
	t.Helper()
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Error(err)
		}
	})
	return s
}

type allocation struct {
	h    Handle
	size int
}

func TestRoundTrip(t *testing.T) {
	s := newStore(t, Config{ArenaSize: 4 << 20}) // small arenas: exercise several
	n := 20000
	if testing.Short() {
		n = 4000
	}
	rng := rand.New(rand.NewPCG(1, 2))
	allocs := map[uint64]allocation{}
	var next uint64
	alloc := func() {
		size := 1 + rng.IntN(MaxAllocSize)
		if rng.IntN(8) == 0 {
			size = MaxAllocSize
		}
		h, b, err := s.Alloc(size, uint32(next))
		if err != nil {
			t.Fatal(err)
		}
		if h == 0 || h >= 1<<48 {
			t.Fatalf("handle %#x out of range", h)
		}
		fill(b, next)
		allocs[next] = allocation{h, size}
		next++
	}
	for range n {
		alloc()
	}
	checkInvariants(t, s)
	for k, o := range allocs {
		check(t, s.Bytes(o.h, o.size), k, o.size)
	}
	// Free about half, refill, and check everything again.
	for k, o := range allocs {
		if rng.IntN(2) == 0 {
			s.Free(o.h)
			delete(allocs, k)
		}
	}
	checkInvariants(t, s)
	for range n / 2 {
		alloc()
	}
	checkInvariants(t, s)
	for k, o := range allocs {
		check(t, s.Bytes(o.h, o.size), k, o.size)
	}
	var sum int64
	for _, o := range allocs {
		sum += int64(o.size)
	}
	if st := s.Stats(); st.Allocations != int64(len(allocs)) || st.ComprDataSize != sum || st.MemUsed < sum {
		t.Fatalf("stats %+v, want %d allocations of %d bytes", st, len(allocs), sum)
	}
	for _, o := range allocs {
		s.Free(o.h)
	}
	checkInvariants(t, s)
	expectEmpty(t, s)
	if st := s.Stats(); st.MemUsedMax == 0 {
		t.Fatalf("MemUsedMax not kept: %+v", st)
	}
	s.ResetMemUsedMax()
	if st := s.Stats(); st.MemUsedMax != 0 {
		t.Fatalf("MemUsedMax after reset: %d", st.MemUsedMax)
	}
}

func TestBadInput(t *testing.T) {
	s := newStore(t, Config{})
	for _, size := range []int{-1, 0, MaxAllocSize + 1, 1 << 40} {
		if _, _, err := s.Alloc(size, 1); !errors.Is(err, syscall.EINVAL) {
			t.Errorf("Alloc(%d): %v, want EINVAL", size, err)
		}
	}
	for _, o := range []uint32{MaxOwner + 1, ^uint32(0)} {
		if _, _, err := s.Alloc(10, o); !errors.Is(err, syscall.EINVAL) {
			t.Errorf("Alloc with reserved owner %#x: %v, want EINVAL", o, err)
		}
	}
	if h, _, err := s.Alloc(10, MaxOwner); err != nil {
		t.Errorf("Alloc with owner MaxOwner: %v", err)
	} else {
		s.Free(h)
	}
	h, b, err := s.Alloc(100, 7)
	if err != nil {
		t.Fatal(err)
	}
	fill(b, 7)
	bad := []Handle{0, 1, h + 1, h + cellMask, h + 1<<cellBits, 1 << 47, ^Handle(0)}
	for _, x := range bad {
		if b := s.Bytes(x, 10); b != nil && x>>cellBits != h>>cellBits {
			t.Errorf("Bytes(%#x) = %d bytes, want nil", x, len(b))
		}
		s.Free(x)
	}
	if got := s.Stats().BadHandles; got != int64(len(bad)) {
		t.Errorf("BadHandles = %d, want %d", got, len(bad))
	}
	if got := len(s.Bytes(h, 1000)); got != 112 {
		t.Errorf("Bytes clamps to the class: got %d bytes, want 112", got)
	}
	if got := len(s.Bytes(h, -5)); got != 0 {
		t.Errorf("Bytes(h, -5) = %d bytes", got)
	}
	check(t, s.Bytes(h, 100), 7, 100)
	s.Free(h)
	s.Free(h) // double free
	if got := s.Stats(); got.BadHandles != int64(len(bad))+1 || got.Allocations != 0 {
		t.Errorf("after double free: %+v", got)
	}
	checkInvariants(t, s)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.Alloc(10, 1); !errors.Is(err, ErrClosed) {
		t.Errorf("Alloc after Close: %v", err)
	}
	if s.Bytes(h, 100) != nil {
		t.Error("Bytes after Close is not nil")
	}
	s.Free(h)
	if _, err := New(Config{MemLimit: -1}); err == nil {
		t.Error("New accepts a negative limit")
	}
	if _, err := New(Config{ArenaSize: -1}); err == nil {
		t.Error("New accepts a negative arena size")
	}
}

func TestMemLimit(t *testing.T) {
	const limit = 256 << 10
	s := newStore(t, Config{MemLimit: limit, ArenaSize: 1})
	rng := rand.New(rand.NewPCG(3, 4))
	var allocs []allocation
	var full error
	for i := 0; full == nil; i++ {
		size := 1 + rng.IntN(MaxAllocSize)
		before := s.Stats()
		h, b, err := s.Alloc(size, uint32(i))
		if err != nil {
			after := s.Stats()
			if after.MemUsed > before.MemUsed || after.Allocations != before.Allocations || after.ComprDataSize != before.ComprDataSize || after.MemUsedMax != before.MemUsedMax {
				t.Fatalf("failed Alloc changed stats: %+v -> %+v", before, after)
			}
			full = err
			break
		}
		fill(b, uint64(i))
		allocs = append(allocs, allocation{h, size})
	}
	if !errors.Is(full, ErrFull) || !errors.Is(full, syscall.ENOSPC) {
		t.Fatalf("Alloc past the limit: %v, want ErrFull/ENOSPC", full)
	}
	st := s.Stats()
	if st.MemUsed > limit || st.MemUsedMax > limit || st.MemLimit != limit {
		t.Fatalf("over the limit: %+v", st)
	}
	if st.MemUsed < limit-16*pageSize {
		t.Fatalf("full at %d bytes of %d", st.MemUsed, limit)
	}
	checkInvariants(t, s)
	// Small allocations still fit in slabs' held pages; a big one needs more.
	s.SetMemLimit(limit * 2)
	if _, _, err := s.Alloc(MaxAllocSize, 1); err != nil {
		t.Fatalf("after raising the limit: %v", err)
	}
	s.SetMemLimit(0)
	for i := range 200 {
		if _, _, err := s.Alloc(MaxAllocSize, uint32(i)); err != nil {
			t.Fatalf("unlimited: %v", err)
		}
	}
	if st := s.Stats(); st.MemUsed <= 2*limit || st.MemLimit != 0 {
		t.Fatalf("unlimited store did not grow: %+v", st)
	}
	for i, o := range allocs {
		check(t, s.Bytes(o.h, o.size), uint64(i), o.size)
	}
	checkInvariants(t, s)
}

// model is the test's page table: owner -> handle, as the device keeps it.
type model struct {
	mu     []sync.Mutex // per owner, like the device's page locks
	allocs []allocation // allocs[owner]; h == 0 means none
	// copyFrom, when set, is the store whose allocations relocate copies
	// under the owner's lock: needed when allocations are filled after Alloc
	// returns while Compact runs (see Compact).
	copyFrom *Store
}

// drain checks every allocation the model holds, frees it, and checks the
// store ends empty and consistent.
func (m *model) drain(t *testing.T, s *Store) {
	t.Helper()
	for o, al := range m.allocs {
		if al.h != 0 {
			check(t, s.Bytes(al.h, al.size), uint64(o), al.size)
			s.Free(al.h)
		}
	}
	checkInvariants(t, s)
	expectEmpty(t, s)
}

func newModel(n int) *model { return &model{mu: make([]sync.Mutex, n), allocs: make([]allocation, n)} }

func (m *model) relocate(owner uint32, old, new Handle) bool {
	m.mu[owner].Lock()
	defer m.mu[owner].Unlock()
	if m.allocs[owner].h != old {
		return false
	}
	if s := m.copyFrom; s != nil {
		n := m.allocs[owner].size
		copy(s.Bytes(new, n), s.Bytes(old, n))
	}
	m.allocs[owner].h = new
	return true
}

// allocRandom stores an allocation of 200 to 3199 bytes for owner o, filled
// from o, and records it in m.
func allocRandom(t *testing.T, s *Store, m *model, rng *rand.Rand, o uint32) {
	t.Helper()
	size := 200 + rng.IntN(3000)
	h, b, err := s.Alloc(size, o)
	if err != nil {
		t.Fatal(err)
	}
	fill(b, uint64(o))
	m.allocs[o] = allocation{h, size}
}

// freeMost fragments the store: it frees 85% of the first n owners'
// allocations at random.
func freeMost(s *Store, m *model, rng *rand.Rand, n int) {
	for o := range n {
		if rng.IntN(100) < 85 {
			s.Free(m.allocs[o].h)
			m.allocs[o] = allocation{}
		}
	}
}

func TestCompact(t *testing.T) {
	s := newStore(t, Config{})
	const owners = 30000
	m := newModel(owners)
	rng := rand.New(rand.NewPCG(5, 6))
	for o := range uint32(owners) {
		allocRandom(t, s, m, rng, o)
	}
	freeMost(s, m, rng, owners)
	checkInvariants(t, s)
	before := s.Stats()
	moved := s.Compact(m.relocate)
	after := s.Stats()
	t.Logf("moved %d allocations; MemUsed %d -> %d bytes for %d data bytes; %d pages compacted",
		moved, before.MemUsed, after.MemUsed, after.ComprDataSize, after.PagesCompacted)
	if moved == 0 || after.PagesCompacted == 0 {
		t.Fatalf("nothing compacted: moved %d, %+v", moved, after)
	}
	if after.MemUsed*3 > before.MemUsed*2 {
		t.Fatalf("MemUsed only dropped from %d to %d", before.MemUsed, after.MemUsed)
	}
	if after.Allocations != before.Allocations || after.ComprDataSize != before.ComprDataSize {
		t.Fatalf("compaction changed the data: %+v -> %+v", before, after)
	}
	// Destinations may have reached into a few more pages, and Compact
	// released the classes' cached empty slabs too.
	if got := (before.MemUsed - after.MemUsed) / pageSize; got > after.PagesCompacted+numClasses*maxCachedPages || got < after.PagesCompacted*9/10 {
		t.Fatalf("MemUsed dropped by %d pages, PagesCompacted %d", got, after.PagesCompacted)
	}
	// What compaction leaves is the allocations rounded up to their class,
	// their tags, slab tails, and about two part-filled pages per class.
	classes := 0
	for ci := range s.classes {
		if s.classes[ci].allocations.Load() > 0 {
			classes++
		}
	}
	allowed := after.ComprDataSize + after.Allocations*(classStep+tagSize) + after.ComprDataSize/maxTailWaste + int64(classes)*2*pageSize
	if after.MemUsed > allowed {
		t.Fatalf("after compaction %d bytes held for %d data bytes in %d classes, want <= %d", after.MemUsed, after.ComprDataSize, classes, allowed)
	}
	// What compaction leaves free in held memory is less than one slab's
	// cells per class.
	for ci := range s.classes {
		g := &s.geo[ci]
		free := 0
		for id := uint32(1); id < s.nslabs.Load(); id++ {
			if r := s.rec(id); int(r.class) == ci && r.state != slabEmpty {
				free += int(r.bump) - int(r.live)
			}
		}
		if free >= int(g.cells) {
			t.Fatalf("class %d: %d free cells below the slabs' marks after compaction, slab has %d", ci, free, g.cells)
		}
	}
	checkInvariants(t, s)
	for o, al := range m.allocs {
		if al.h != 0 {
			check(t, s.Bytes(al.h, al.size), uint64(o), al.size)
		}
	}
	if again := s.Compact(m.relocate); again > moved/10 {
		t.Fatalf("second Compact moved %d allocations after the first moved %d", again, moved)
	}
	for o, al := range m.allocs {
		if al.h != 0 {
			s.Free(al.h)
		}
		_ = o
	}
	checkInvariants(t, s)
	expectEmpty(t, s)
}

// TestCompactTrimmedSlabsStayCold: with a prefaulter, the pages Compact trims
// off a slab are never reached into again by a writer (they were given back,
// so a writer storing a swapped-out page would fault them in): the trimmed
// slabs take allocations into their free cells only, new allocations go to
// slabs with resident room, and every allocation survives.
func TestCompactTrimmedSlabsStayCold(t *testing.T) {
	s := newStore(t, Config{Prefault: 4 << 20})
	const owners = 30000
	m := newModel(2 * owners)
	rng := rand.New(rand.NewPCG(7, 8))
	for o := range uint32(owners) {
		allocRandom(t, s, m, rng, o)
	}
	freeMost(s, m, rng, owners)
	if s.Compact(m.relocate) == 0 {
		t.Fatal("nothing compacted")
	}
	trimmed := map[uint32]uint16{} // slab: pages held after the trim
	for id := uint32(1); id < s.nslabs.Load(); id++ {
		if r := s.rec(id); r.cold && r.state != slabEmpty {
			trimmed[id] = r.touched
		}
	}
	if len(trimmed) == 0 {
		t.Fatal("Compact trimmed no slab")
	}
	for o := uint32(owners); o < 2*owners; o++ {
		allocRandom(t, s, m, rng, o)
	}
	for id, held := range trimmed {
		if r := s.rec(id); r.cold && r.touched > held {
			t.Errorf("slab %d reached from %d into %d pages after Compact gave the rest back", id, held, r.touched)
		}
	}
	checkInvariants(t, s)
	for o, al := range m.allocs {
		if al.h != 0 {
			check(t, s.Bytes(al.h, al.size), uint64(o), al.size)
		}
	}
}

// TestCompactRefused has the owner change while relocating: the new copy
// must be freed by Compact and the old one by the owner, and a slab left
// with such allocations drains when they go.
func TestCompactRefused(t *testing.T) {
	s := newStore(t, Config{})
	const owners = 4000
	m := newModel(owners)
	for o := range uint32(owners) {
		h, b, err := s.Alloc(1000, o)
		if err != nil {
			t.Fatal(err)
		}
		fill(b, uint64(o))
		m.allocs[o] = allocation{h, 1000}
	}
	for o := range m.allocs {
		if o%5 != 0 {
			s.Free(m.allocs[o].h)
			m.allocs[o] = allocation{}
		}
	}
	var refused []Handle
	moved := s.Compact(func(owner uint32, old, new Handle) bool {
		if owner%3 == 0 {
			// The page was rewritten meanwhile; its writer frees old later.
			m.allocs[owner] = allocation{}
			refused = append(refused, old)
			return false
		}
		return m.relocate(owner, old, new)
	})
	if moved == 0 || len(refused) == 0 {
		t.Fatalf("moved %d, refused %d", moved, len(refused))
	}
	checkInvariants(t, s)
	draining := 0
	for id := uint32(1); id < s.nslabs.Load(); id++ {
		if s.rec(id).state == slabDraining {
			draining++
		}
	}
	compacted := s.Stats().PagesCompacted
	if draining == 0 {
		t.Fatal("no slab left draining by refused relocations")
	}
	for _, h := range refused {
		s.Free(h)
	}
	checkInvariants(t, s)
	for id := uint32(1); id < s.nslabs.Load(); id++ {
		if s.rec(id).state == slabDraining {
			t.Fatalf("slab %d still draining after its last allocations were freed", id)
		}
	}
	if s.Stats().PagesCompacted <= compacted {
		t.Fatalf("drained slabs not counted as compacted: %d pages before, %d after", compacted, s.Stats().PagesCompacted)
	}
	st := s.Stats()
	if st.Allocations != int64(moved) {
		// Every survivor was moved (its owner%3 != 0), the rest are gone.
		n := 0
		for _, o := range m.allocs {
			if o.h != 0 {
				n++
			}
		}
		if st.Allocations != int64(n) {
			t.Fatalf("%d allocations stored, model has %d", st.Allocations, n)
		}
	}
	m.drain(t, s)
}

func TestCompactConcurrent(t *testing.T) {
	s := newStore(t, Config{})
	const owners = 4096
	workers, ops := 4, 40000
	if testing.Short() {
		ops = 20000
	}
	m := newModel(owners)
	m.copyFrom = s // the workers fill allocations after Alloc, as the device does
	var wg sync.WaitGroup
	errs := make(chan error, workers+1)
	stop := make(chan struct{})
	for w := range workers {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), 9))
			seq := uint64(w) << 40
			for range ops {
				o := uint32(rng.IntN(owners))
				m.mu[o].Lock()
				cur := m.allocs[o]
				switch {
				case cur.h != 0 && rng.IntN(3) == 0:
					want := make([]byte, cur.size)
					fill(want, uint64(o))
					if string(s.Bytes(cur.h, cur.size)) != string(want) {
						errs <- errors.New("content differs")
					}
				case cur.h != 0 && rng.IntN(2) == 0:
					s.Free(cur.h)
					m.allocs[o] = allocation{}
				default:
					size := 1 + rng.IntN(MaxAllocSize)
					h, b, err := s.Alloc(size, o)
					if err != nil {
						errs <- err
						m.mu[o].Unlock()
						return
					}
					fill(b, uint64(o))
					if cur.h != 0 {
						s.Free(cur.h)
					}
					m.allocs[o] = allocation{h, size}
				}
				m.mu[o].Unlock()
				seq++
			}
		})
	}
	var compactions, moved int
	cwg := sync.WaitGroup{}
	cwg.Go(func() {
		for {
			select {
			case <-stop:
				return
			default:
			}
			moved += s.Compact(m.relocate)
			compactions++
		}
	})
	wg.Wait()
	close(stop)
	cwg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	t.Logf("%d compactions moved %d allocations", compactions, moved)
	moved += s.Compact(m.relocate)
	checkInvariants(t, s)
	m.drain(t, s)
}

func TestMetadataPerAllocation(t *testing.T) {
	s := newStore(t, Config{})
	rng := rand.New(rand.NewPCG(7, 8))
	const n = 50000
	for i := range n {
		// Typical compressed pages: ratio 1.5 to 4.
		if _, _, err := s.Alloc(1000+rng.IntN(1800), uint32(i)); err != nil {
			t.Fatal(err)
		}
	}
	st := s.Stats()
	per := float64(st.MetadataBytes) / float64(st.Allocations)
	t.Logf("%.2f metadata bytes per allocation (%d slab records)", per, s.nslabs.Load()-1)
	if per > 8 {
		t.Fatalf("%.2f metadata bytes per allocation, want <= 8", per)
	}
	if st.MetadataBytes < n*tagSize {
		t.Fatalf("MetadataBytes %d misses the tags", st.MetadataBytes)
	}
}

func TestGeometry(t *testing.T) {
	if slabRecSize != 32 {
		t.Errorf("slab record is %d bytes, the package doc says 32", slabRecSize)
	}
	largest := uint32(0)
	for ci := range numClasses {
		g := newGeometry(ci)
		largest = max(largest, g.pages)
		if g.cells == 0 || g.cells > maxCells || g.pages > maxSlabPages {
			t.Fatalf("class %d: %+v", ci, g)
		}
		bytes := g.pages * pageSize
		if used := g.cells * (g.size + tagSize); used > bytes || (bytes-used)*100 > bytes {
			t.Fatalf("class %d: %d of %d slab bytes used", ci, used, bytes)
		}
		if g.size < 2 {
			t.Fatalf("class %d too small for the free list", ci)
		}
	}
	if largest != 161 {
		t.Errorf("largest slab has %d pages, the package doc says 161", largest)
	}
	if classOf(1) != 0 || classOf(16) != 0 || classOf(17) != 1 || classOf(MaxAllocSize) != numClasses-1 {
		t.Fatal("classOf")
	}
}

// TestCachedSlabs checks the slab each class keeps when its last allocation
// goes: it is reused without growing MemUsed and yields to the limit.
func TestCachedSlabs(t *testing.T) {
	const limit = 32 * pageSize
	s := newStore(t, Config{MemLimit: limit})
	for i := range 1000 {
		h, b, err := s.Alloc(1000, 1)
		if err != nil {
			t.Fatal(err)
		}
		fill(b, uint64(i))
		s.Free(h)
		if st := s.Stats(); st.MemUsed != pageSize || st.Allocations != 0 {
			t.Fatalf("round %d: %+v", i, st)
		}
	}
	// Fill the limit with cached slabs of many classes.
	for size := 16; s.Stats().MemUsed < limit; size += 16 {
		h, _, err := s.Alloc(size, 1)
		if err != nil {
			t.Fatal(err)
		}
		s.Free(h)
	}
	checkInvariants(t, s)
	if st := s.Stats(); st.Allocations != 0 || st.MemUsed != limit {
		t.Fatalf("cached slabs: %+v", st)
	}
	// A class with no cached slab still gets memory: the others give way.
	h, b, err := s.Alloc(MaxAllocSize, 2)
	if err != nil {
		t.Fatalf("Alloc with the limit held by cached slabs: %v", err)
	}
	fill(b, 2)
	checkInvariants(t, s)
	check(t, s.Bytes(h, MaxAllocSize), 2, MaxAllocSize)
	s.Free(h)
	expectEmpty(t, s)
}
