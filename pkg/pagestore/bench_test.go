package pagestore

import (
	"math/rand/v2"
	"sync/atomic"
	"testing"
)

// benchSizes are compressed-page-like sizes: mostly 1-3 KiB, some raw pages.
func benchSizes() []int {
	rng := rand.New(rand.NewPCG(11, 12))
	sizes := make([]int, 1024)
	for i := range sizes {
		sizes[i] = 600 + rng.IntN(2600)
		if i%16 == 0 {
			sizes[i] = MaxAllocSize
		}
	}
	return sizes
}

// BenchmarkAllocFree measures one Alloc plus one Free in steady state: each
// goroutine keeps a ring of live allocations and replaces the oldest one.
func BenchmarkAllocFree(b *testing.B) {
	s := newStore(b, Config{})
	sizes := benchSizes()
	var goroutines atomic.Int64
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		ring := make([]Handle, 4096)
		// Goroutines start at different places in the size table, so
		// they do not go through the classes in lockstep.
		i := int(goroutines.Add(1)) * 317
		for pb.Next() {
			at := i & (len(ring) - 1)
			if ring[at] != 0 {
				s.Free(ring[at])
			}
			h, _, err := s.Alloc(sizes[i&(len(sizes)-1)], uint32(i))
			if err != nil {
				b.Error(err)
				return
			}
			ring[at] = h
			i++
		}
		for _, h := range ring {
			if h != 0 {
				s.Free(h)
			}
		}
	})
}

func BenchmarkBytes(b *testing.B) {
	s := newStore(b, Config{})
	sizes := benchSizes()
	handles := make([]Handle, len(sizes))
	for i, size := range sizes {
		h, _, err := s.Alloc(size, uint32(i))
		if err != nil {
			b.Fatal(err)
		}
		handles[i] = h
	}
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		i, n := 0, 0
		for pb.Next() {
			n += len(s.Bytes(handles[i&(len(handles)-1)], sizes[i&(len(sizes)-1)]))
			i++
		}
		_ = n
	})
}

// BenchmarkCompact measures moving allocations out of fragmented slabs, per
// allocation moved.
func BenchmarkCompact(b *testing.B) {
	sizes := benchSizes()
	const owners = 20000
	m := newModel(owners)
	rng := rand.New(rand.NewPCG(13, 14))
	var moved int
	for b.Loop() {
		b.StopTimer()
		s, err := New(Config{})
		if err != nil {
			b.Fatal(err)
		}
		for o := range uint32(owners) {
			h, buf, err := s.Alloc(sizes[o%uint32(len(sizes))], o)
			if err != nil {
				b.Fatal(err)
			}
			fill(buf, uint64(o))
			m.allocs[o] = allocation{h: h}
		}
		for o := range m.allocs {
			if rng.IntN(4) != 0 {
				s.Free(m.allocs[o].h)
			}
		}
		b.StartTimer()
		moved += s.Compact(m.relocate)
		b.StopTimer()
		s.Close()
		b.StartTimer()
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(max(moved, 1)), "ns/moved")
}

// BenchmarkAllocFreeLast allocates and frees a class's only allocation, which
// would release and fault in its slab each time without the class's
// cached slab.
func BenchmarkAllocFreeLast(b *testing.B) {
	s := newStore(b, Config{})
	b.ReportAllocs()
	for b.Loop() {
		h, buf, err := s.Alloc(1000, 1)
		if err != nil {
			b.Fatal(err)
		}
		buf[0] = 1
		s.Free(h)
	}
}

// BenchmarkOneClass measures storing and replacing allocations that all fall
// in one size class (fio's pages compress alike, and so do runs of a
// program's pages) from every CPU at once: one Alloc and one Free per
// allocation, against AllocBatch and FreeBatch over 32 allocations (a 128 KiB
// write), which take the class's lock once per batch.
func BenchmarkOneClass(b *testing.B) {
	const batch = 32
	for _, mode := range []string{"single", "batch"} {
		b.Run(mode, func(b *testing.B) {
			s := newStore(b, Config{})
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				sizes := make([]int, batch)
				owners := make([]uint32, batch)
				for i := range sizes {
					sizes[i] = 1700
				}
				live := make([]Handle, batch)
				next := make([]Handle, batch)
				for pb.Next() {
					if mode == "single" {
						for i := range live {
							h, _, err := s.Alloc(1700, 0)
							if err != nil {
								b.Error(err)
								return
							}
							if live[i] != 0 {
								s.Free(live[i])
							}
							live[i] = h
						}
						continue
					}
					if _, _, err := s.AllocBatch(Short, sizes, owners, next, 0); err != nil {
						b.Error(err)
						return
					}
					s.FreeBatch(live)
					live, next = next, live
				}
				s.FreeBatch(live)
			})
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*batch), "ns/allocation")
		})
	}
}
