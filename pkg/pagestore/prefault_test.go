package pagestore

import (
	"math/rand/v2"
	"sync"
	"testing"
	"time"
)

// TestPrefaultKeepsPagesAheadAndContentsIntact: with Prefault set, pages
// past the carve point are resident before any object reaches them, across
// arena boundaries, and touching them never changes an object's bytes
// (writers fill objects while the prefaulter runs).
func TestPrefaultKeepsPagesAheadAndContentsIntact(t *testing.T) {
	const arena = 4 << 20
	s := newStore(t, Config{ArenaSize: arena, Prefault: 2 << 20})
	waitResident := func(min int64) int64 {
		deadline := time.Now().Add(5 * time.Second)
		for {
			s.mu.Lock()
			n := int64(s.spareFaulted)
			if len(*s.arenas.Load()) > 0 {
				n = int64(s.faultedTo - s.arenaNext)
				if s.spare != nil {
					n += int64(s.spareFaulted)
				}
			}
			s.mu.Unlock()
			if n*pageSize >= min || time.Now().After(deadline) {
				return n * pageSize
			}
			time.Sleep(time.Millisecond)
		}
	}
	if got := waitResident(2 << 20); got < 2<<20 {
		t.Fatalf("only %d bytes prefaulted before the first Alloc, want 2 MiB", got)
	}

	// Fill well past two arenas from several goroutines.
	const perWorker = 3000
	var wg sync.WaitGroup
	objs := make([][]object, 4)
	for w := range objs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(w), 1))
			for i := range perWorker {
				size := 1 + r.IntN(MaxObjectSize)
				h, b, err := s.Alloc(size, uint32(w*perWorker+i))
				if err != nil {
					t.Error(err)
					return
				}
				fill(b, uint64(w*perWorker+i))
				objs[w] = append(objs[w], object{h, size})
			}
		}()
	}
	wg.Wait()
	if n := len(*s.arenas.Load()); n < 3 {
		t.Fatalf("%d arenas used; the test meant to cross arena boundaries", n)
	}
	for w, list := range objs {
		for i, o := range list {
			check(t, s.Bytes(o.h, o.size), uint64(w*perWorker+i), o.size)
		}
	}
	if got := waitResident(2 << 20); got < 2<<20 {
		t.Fatalf("only %d bytes prefaulted ahead after filling, want 2 MiB", got)
	}
	if res := resident(t, s) * pageSize; res < s.Stats().MemUsed {
		t.Fatalf("resident %d below mem_used %d", res, s.Stats().MemUsed)
	}
}
