package pagestore

import (
	"errors"
	"math/rand/v2"
	"sync"
	"syscall"
	"testing"
)

// TestAllocBatchRoundTrip stores batches mixing runs of one class with
// scattered sizes, checks every allocation, and frees them in batches again.
func TestAllocBatchRoundTrip(t *testing.T) {
	s := newStore(t, Config{ArenaSize: 4 << 20})
	r := rand.New(rand.NewPCG(3, 4))
	var all []allocation
	seeds := map[Handle]uint64{}
	for b := range 200 {
		n := 1 + r.IntN(64)
		sizes := make([]int, n)
		owners := make([]uint32, n)
		for i := range sizes {
			switch {
			case b%3 == 0:
				sizes[i] = 1700 + r.IntN(16) // one class, as fio's pages compress
			case i%7 == 0:
				sizes[i] = MaxAllocSize
			default:
				sizes[i] = 1 + r.IntN(MaxAllocSize)
			}
			owners[i] = uint32(b*100 + i)
		}
		handles := make([]Handle, n)
		if n, _, err := s.AllocBatch(Short, sizes, owners, handles, 0); err != nil || n != len(sizes) {
			t.Fatalf("AllocBatch: %d of %d, %v", n, len(sizes), err)
		}
		for i, h := range handles {
			if h == 0 {
				t.Fatalf("batch %d: allocation %d has no handle", b, i)
			}
			if _, ok := seeds[h]; ok {
				t.Fatalf("batch %d: handle %#x handed out twice", b, h)
			}
			seed := uint64(b)<<32 | uint64(i)
			seeds[h] = seed
			fill(s.Bytes(h, sizes[i]), seed)
			all = append(all, allocation{h, sizes[i]})
		}
	}
	checkInvariants(t, s)
	var want int64
	for _, o := range all {
		check(t, s.Bytes(o.h, o.size), seeds[o.h], o.size)
		want += int64(o.size)
	}
	if st := s.Stats(); st.Allocations != int64(len(all)) || st.ComprDataSize != want {
		t.Fatalf("stats %+v, want %d allocations of %d bytes", st, len(all), want)
	}
	// Free in batches with holes (zero handles are skipped).
	r.Shuffle(len(all), func(i, j int) { all[i], all[j] = all[j], all[i] })
	for lo := 0; lo < len(all); lo += 50 {
		hs := make([]Handle, 0, 51)
		for _, o := range all[lo:min(lo+50, len(all))] {
			hs = append(hs, o.h, 0)
		}
		s.FreeBatch(hs)
	}
	if st := s.Stats(); st.BadHandles != 0 {
		t.Fatalf("FreeBatch counted %d bad handles", st.BadHandles)
	}
	expectEmpty(t, s)
}

// TestAllocBatchStopsAtTheLimit: a batch that runs into the memory limit
// part way stops there, with ENOSPC, its first allocations made.
func TestAllocBatchStopsAtTheLimit(t *testing.T) {
	s := newStore(t, Config{MemLimit: 64 * pageSize})
	sizes := make([]int, 200) // about 100 pages
	for i := range sizes {
		sizes[i] = 2000 + 16*(i%5) // several classes, 2 allocations a page
	}
	owners := make([]uint32, len(sizes))
	handles := make([]Handle, len(sizes))
	n, _, err := s.AllocBatch(Short, sizes, owners, handles, 0)
	if !errors.Is(err, syscall.ENOSPC) || n == 0 || n == len(sizes) {
		t.Fatalf("AllocBatch past the limit: %d of %d allocated, %v; want some, and ENOSPC", n, len(sizes), err)
	}
	for i, h := range handles {
		if (h != 0) != (i < n) {
			t.Fatalf("handle %d set %v with %d allocated", i, h != 0, n)
		}
	}
	if st := s.Stats(); st.Allocations != int64(n) || st.MemUsed > 64*pageSize {
		t.Fatalf("after a batch stopped by the limit: %+v, want %d allocations within the limit", st, n)
	}
	checkInvariants(t, s)
	s.FreeBatch(handles[:n])
	expectEmpty(t, s)
}

// TestReserveCoversAllocations: reserved bytes count as used and against
// the limit; allocations drawing on them are stored even when the store is at
// its limit, without going over it; what they do not use stays reserved
// until Unreserve.
func TestReserveCoversAllocations(t *testing.T) {
	const limit = 32 * pageSize
	s := newStore(t, Config{MemLimit: limit})
	if err := s.Reserve(limit + 1); !errors.Is(err, ErrFull) {
		t.Fatalf("Reserve beyond the limit: %v, want ErrFull", err)
	}
	if st := s.Stats(); st.MemUsed != 0 || st.Reserved != 0 {
		t.Fatalf("a refused Reserve changed the counters: %+v", st)
	}
	const pages = 16
	if err := s.Reserve(pages * pageSize); err != nil {
		t.Fatal(err)
	}
	if st := s.Stats(); st.MemUsed != pages*pageSize || st.Reserved != pages*pageSize {
		t.Fatalf("after Reserve: %+v", st)
	}
	// Fill the rest of the limit with allocations of their own.
	var filler []Handle
	for {
		h, _, err := s.Alloc(MaxAllocSize, 1)
		if errors.Is(err, ErrFull) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		filler = append(filler, h)
	}
	if len(filler) == 0 || len(filler) > limit/pageSize-pages {
		t.Fatalf("%d raw pages fit beside a reservation of %d pages under a limit of %d", len(filler), pages, limit/pageSize)
	}
	// Pages that compressed to half a page: 16 pages of reservation
	// store about 32 of them.
	sizes := make([]int, 2*pages-2)
	for i := range sizes {
		sizes[i] = 2000
	}
	owners := make([]uint32, len(sizes))
	handles := make([]Handle, len(sizes))
	if n, _, err := s.AllocBatch(Short, sizes, owners, handles, 0); !errors.Is(err, ErrFull) || n != 0 {
		t.Fatalf("a batch without the reservation at the limit: %d allocated, %v; want none, ErrFull", n, err)
	}
	// More than the reservation holds stops where it runs out, keeping
	// the rest of it reserved.
	big := make([]int, 3*pages)
	for i := range big {
		big[i] = 2000
	}
	bigHandles := make([]Handle, len(big))
	n, unused, err := s.AllocBatch(Short, big, make([]uint32, len(big)), bigHandles, pages*pageSize)
	if !errors.Is(err, ErrFull) || n < pages || n == len(big) {
		t.Fatalf("a batch beyond its reservation: %d of %d allocated, %v; want ErrFull after at least %d", n, len(big), err, pages)
	}
	if st := s.Stats(); st.Reserved != unused || st.MemUsed > limit {
		t.Fatalf("after a batch beyond its reservation: %+v, unused %d", st, unused)
	}
	s.FreeBatch(bigHandles[:n])
	s.Unreserve(unused)
	if err := s.Reserve(pages * pageSize); err != nil {
		t.Fatal(err)
	}
	n, unused, err = s.AllocBatch(Short, sizes, owners, handles, pages*pageSize)
	if err != nil || n != len(sizes) {
		t.Fatalf("a batch within its reservation at the limit: %d of %d, %v", n, len(sizes), err)
	}
	st := s.Stats()
	if st.Reserved != unused || st.MemUsed > limit {
		t.Fatalf("after storing the reserved pages: %+v, unused %d (limit %d)", st, unused, limit)
	}
	s.Unreserve(unused)
	if st := s.Stats(); st.Reserved != 0 {
		t.Fatalf("after Unreserve: %+v", st)
	}
	s.FreeBatch(handles)
	s.FreeBatch(filler)
	expectEmpty(t, s)
}

// TestAllocBatchConcurrent runs batch and single allocations and frees
// from many goroutines on few classes, so that they contend (run with
// -race).
func TestAllocBatchConcurrent(t *testing.T) {
	s := newStore(t, Config{ArenaSize: 4 << 20})
	rounds := 300
	if testing.Short() {
		rounds = 50
	}
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(w), 1))
			live := map[Handle]uint64{}
			sizes := make([]int, 32)
			owners := make([]uint32, 32)
			handles := make([]Handle, 32)
			for round := range rounds {
				for i := range sizes {
					sizes[i] = 1024 + 16*r.IntN(3)
				}
				if _, _, err := s.AllocBatch(Short, sizes, owners, handles, 0); err != nil {
					t.Error(err)
					return
				}
				for i, h := range handles {
					seed := uint64(w)<<40 | uint64(round)<<8 | uint64(i)
					fill(s.Bytes(h, sizes[i]), seed)
					live[h] = seed<<16 | uint64(sizes[i])
				}
				// Free about as many as were added, some one by one.
				var free []Handle
				for h, v := range live {
					if len(free) == 32 {
						break
					}
					seed, size := v>>16, int(v&0xffff)
					b := s.Bytes(h, size)
					want := make([]byte, size)
					fill(want, seed)
					if string(b) != string(want) {
						t.Errorf("allocation %#x changed under other goroutines", h)
						return
					}
					delete(live, h)
					free = append(free, h)
				}
				if round%2 == 0 {
					s.FreeBatch(free)
				} else {
					for _, h := range free {
						s.Free(h)
					}
				}
			}
			for h := range live {
				s.Free(h)
			}
		}()
	}
	wg.Wait()
	if st := s.Stats(); st.BadHandles != 0 {
		t.Fatalf("%d bad handles", st.BadHandles)
	}
	expectEmpty(t, s)
}

// Long-lived allocations fill slabs of their own: once the short-lived
// ones made between them are freed, their slabs go back whole, with no
// Compact, where sharing slabs would have pinned about one slab page for
// each long-lived allocation.
func TestLifetimesKeepToTheirOwnSlabs(t *testing.T) {
	s := newStore(t, Config{ArenaSize: 4 << 20})
	const n, size = 4000, 1500
	short := make([]Handle, 0, n)
	long := make([]Handle, 0, n)
	for i := range n {
		h, b, err := allocOf(s, Short, size, uint32(i))
		if err != nil {
			t.Fatal(err)
		}
		fill(b, uint64(i))
		short = append(short, h)
		// Every other one, a long-lived allocation, as the dense tier
		// writes a group's frames while others' pages are swapped out.
		if i%2 == 0 {
			h, b, err := allocOf(s, Long, size, uint32(n+i))
			if err != nil {
				t.Fatal(err)
			}
			fill(b, uint64(n+i))
			long = append(long, h)
		}
	}
	s.FreeBatch(short)
	st := s.Stats()
	data := int64(len(long)) * size
	slab := int64(s.geo[classOf(size)].pages) * pageSize
	if st.MemUsed > data+data/50+2*slab {
		t.Errorf("%d bytes held for %d bytes of long-lived allocations once the short-lived are freed: want within 2 %% and a slab", st.MemUsed, data)
	}
	for i, h := range long {
		check(t, s.Bytes(h, size), uint64(n+2*i), size)
	}
	if moved := s.Compact(func(uint32, Handle, Handle) bool { return true }); moved != 0 {
		t.Errorf("Compact moved %d allocations, want none", moved)
	}
	if _, _, err := s.AllocBatch(lifetimes, []int{1}, []uint32{1}, []Handle{0}, 0); !errors.Is(err, syscall.EINVAL) {
		t.Errorf("AllocBatch of lifetime %d: %v, want EINVAL", lifetimes, err)
	}
}

// TestDropCaches frees a lifetime's last allocation of a class, which
// leaves its slab cached, and has DropCaches give back that lifetime's
// cached slabs alone. LifetimeOf tells the two lifetimes' allocations
// apart.
func TestDropCaches(t *testing.T) {
	s := newStore(t, Config{ArenaSize: 1 << 20})
	hs := make([]Handle, lifetimes)
	for lt := range Lifetime(lifetimes) {
		h, b, err := allocOf(s, lt, 100, uint32(lt))
		if err != nil {
			t.Fatal(err)
		}
		fill(b, uint64(lt))
		if got := s.LifetimeOf(h); got != lt {
			t.Fatalf("LifetimeOf an allocation of lifetime %d: %d", lt, got)
		}
		hs[lt] = h
	}
	if got := s.LifetimeOf(1 << 40); got != Short {
		t.Errorf("LifetimeOf a handle of no slab: %d, want Short", got)
	}
	held := s.Stats().MemUsed
	s.Free(hs[Short])
	if st := s.Stats(); st.MemUsed != held {
		t.Fatalf("the slab the free emptied: %d bytes held, %d before; want it cached", st.MemUsed, held)
	}
	s.DropCaches(Long)
	if st := s.Stats(); st.MemUsed != held {
		t.Fatalf("DropCaches(Long) gave back a short-lived slab: %d bytes held, %d before", st.MemUsed, held)
	}
	s.DropCaches(Short)
	if st := s.Stats(); st.MemUsed != held-pageSize || st.Allocations != 1 {
		t.Fatalf("DropCaches(Short): %d bytes held in %d allocations, want %d in 1", st.MemUsed, st.Allocations, held-pageSize)
	}
	check(t, s.Bytes(hs[Long], 100), uint64(Long), 100)
}
