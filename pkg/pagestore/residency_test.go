package pagestore

import (
	"math/rand/v2"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/gzramd/gzramd/internal/testneeds"
)

func mincore(mem, vec []byte) error {
	_, _, errno := unix.Syscall(unix.SYS_MINCORE, uintptr(unsafe.Pointer(&mem[0])), uintptr(len(mem)), uintptr(unsafe.Pointer(&vec[0])))
	if errno != 0 {
		return errno
	}
	return nil
}

// residentPages counts the pages of mem the kernel holds.
func residentPages(t *testing.T, mem []byte) int {
	t.Helper()
	if len(mem) == 0 {
		return 0
	}
	vec := make([]byte, len(mem)/pageSize)
	if err := mincore(mem, vec); err != nil {
		t.Fatalf("mincore: %v", err)
	}
	n := 0
	for _, v := range vec {
		n += int(v & 1)
	}
	return n
}

// resident counts the arenas' pages the kernel holds.
func resident(t *testing.T, s *Store) int64 {
	t.Helper()
	var n int64
	for _, mem := range *s.arenas.Load() {
		n += int64(residentPages(t, mem))
	}
	return n
}

// touchedPages is what the kernel holds at least for the store's slabs when
// every allocation handed out was written: the tags in use and the allocations.
func touchedPages(s *Store) int64 {
	var n int64
	for id := uint32(1); id < s.nslabs.Load(); id++ {
		r := s.rec(id)
		if r.state == slabEmpty {
			continue
		}
		g := &s.geo[r.class]
		tags := pagesFor(tagSize * uint32(r.bump))
		first := g.tagBytes / pageSize
		end := pagesFor(cellAt(g, uint32(r.bump)))
		n += int64(end-first) + int64(min(tags, first))
	}
	return n
}

// TestMemUsedIsResident checks MemUsed against what the kernel holds: it
// counts every touched page, over-counting only tag pages not yet reached,
// and empty slabs really go back.
func TestMemUsedIsResident(t *testing.T) {
	s := newStore(t, Config{ArenaSize: 8 << 20})
	rng := rand.New(rand.NewPCG(21, 22))
	const owners = 20000
	m := newModel(owners)
	for o := range uint32(owners) {
		size := 1 + rng.IntN(MaxAllocSize)
		h, b, err := s.Alloc(size, o)
		if err != nil {
			t.Fatal(err)
		}
		fill(b, uint64(o))
		m.allocs[o] = allocation{h, size}
	}
	checkResidency := func(when string) {
		t.Helper()
		st := s.Stats()
		res, want := resident(t, s), touchedPages(s)
		t.Logf("%s: MemUsed %d pages, resident %d, touched %d", when, st.MemUsed/pageSize, res, want)
		if res < want || res > st.MemUsed/pageSize {
			t.Fatalf("%s: %d pages resident, %d touched, MemUsed %d pages", when, res, want, st.MemUsed/pageSize)
		}
		if float64(res) < 0.97*float64(st.MemUsed/pageSize) {
			t.Fatalf("%s: MemUsed %d pages, only %d resident", when, st.MemUsed/pageSize, res)
		}
	}
	checkResidency("stored")
	for o := range m.allocs {
		if rng.IntN(10) < 8 {
			s.Free(m.allocs[o].h)
			m.allocs[o] = allocation{}
		}
	}
	checkResidency("freed 80%")
	s.Compact(m.relocate)
	checkResidency("compacted")
	for o, al := range m.allocs {
		if al.h != 0 {
			check(t, s.Bytes(al.h, al.size), uint64(o), al.size)
			s.Free(al.h)
		}
	}
	expectEmpty(t, s)
	if res := resident(t, s); res != 0 || s.Stats().MemUsed != 0 {
		t.Fatalf("after freeing everything: %d pages resident, MemUsed %d", res, s.Stats().MemUsed)
	}
}

// TestReleaseLocked gives back pages locked the way mlockall locks the
// daemon's memory.
func TestReleaseLocked(t *testing.T) {
	s := newStore(t, Config{ArenaSize: 1 << 20})
	h, _, err := s.Alloc(MaxAllocSize, 1)
	if err != nil {
		t.Fatal(err)
	}
	r := s.rec(uint32(h >> cellBits))
	mem := (*s.arenas.Load())[r.arena]
	if err := unix.Mlock(mem[:64<<10]); err != nil {
		testneeds.MlockRefused(t, err, "mlock of the pages")
	}
	for i := range 64 << 10 {
		mem[i] = 0xA5
	}
	if err := s.releasePages(r, mem[:64<<10]); err != nil {
		t.Fatalf("releasing locked pages: %v", err)
	}
	vec := make([]byte, 16)
	if err := mincore(mem[:64<<10], vec); err != nil {
		t.Fatal(err)
	}
	for i, v := range vec {
		if v&1 != 0 {
			t.Fatalf("page %d still resident", i)
		}
	}
	for i := range 64 << 10 {
		if mem[i] != 0 {
			t.Fatalf("byte %d is %#x after release", i, mem[i])
		}
	}
}

// TestRandomOps runs random operations, bad ones included, checking the
// store's internal consistency as it goes.
func TestRandomOps(t *testing.T) {
	s := newStore(t, Config{ArenaSize: 1})
	rng := rand.New(rand.NewPCG(31, 32))
	const owners = 3000
	m := newModel(owners)
	steps := 60000
	if testing.Short() {
		steps = 15000
	}
	var stale []Handle
	for step := range steps {
		o := uint32(rng.IntN(owners))
		switch op := rng.IntN(100); {
		case op < 55:
			size := 1 + rng.IntN(MaxAllocSize)
			if rng.IntN(4) == 0 {
				size = 1 + rng.IntN(64)
			}
			h, b, err := s.Alloc(size, o)
			if err != nil {
				if s.Stats().MemLimit == 0 {
					t.Fatalf("step %d: %v", step, err)
				}
				continue
			}
			fill(b, uint64(o))
			if old := m.allocs[o].h; old != 0 {
				s.Free(old)
				stale = append(stale, old)
			}
			m.allocs[o] = allocation{h, size}
		case op < 85:
			if h := m.allocs[o].h; h != 0 {
				check(t, s.Bytes(h, m.allocs[o].size), uint64(o), m.allocs[o].size)
				s.Free(h)
				stale = append(stale, h)
				m.allocs[o] = allocation{}
			}
		case op < 88:
			// A stale handle may name a cell reused since; free it only
			// when nobody holds that handle now.
			if len(stale) > 0 {
				h := stale[rng.IntN(len(stale))]
				inUse := false
				for _, al := range m.allocs {
					inUse = inUse || al.h == h
				}
				if !inUse {
					s.Free(h)
				}
			}
		case op < 90:
			s.Compact(func(owner uint32, old, new Handle) bool {
				if rng.IntN(5) == 0 && m.allocs[owner].h == old {
					// The owner rewrote its page meanwhile.
					s.Free(old)
					m.allocs[owner] = allocation{}
					return false
				}
				return m.relocate(owner, old, new)
			})
		case op < 91:
			if rng.IntN(2) == 0 {
				s.SetMemLimit(0)
			} else {
				s.SetMemLimit(s.Stats().MemUsed + int64(rng.IntN(64))*pageSize)
			}
		}
		if step%1000 == 0 {
			checkInvariants(t, s)
		}
	}
	checkInvariants(t, s)
	m.drain(t, s)
}
