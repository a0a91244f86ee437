package pagestore

import (
	"errors"
	"math/rand/v2"
	"runtime"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestPrefaultKeepsPagesAheadAndContentsIntact: with Prefault set, pages
// past the carve point are resident before any allocation reaches them, across
// arena boundaries, and touching them never changes an allocation's bytes
// (writers fill allocations while the prefaulter runs).
func TestPrefaultKeepsPagesAheadAndContentsIntact(t *testing.T) {
	const arena = 4 << 20
	s := newStore(t, Config{ArenaSize: arena, Prefault: 2 << 20})
	waitPrefaulted(t, s, 2<<20)

	// Fill well past two arenas from several goroutines.
	const perWorker = 3000
	var wg sync.WaitGroup
	allocs := make([][]allocation, 4)
	for w := range allocs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(w), 1))
			for i := range perWorker {
				size := 1 + r.IntN(MaxAllocSize)
				h, b, err := s.Alloc(size, uint32(w*perWorker+i))
				if err != nil {
					t.Error(err)
					return
				}
				fill(b, uint64(w*perWorker+i))
				allocs[w] = append(allocs[w], allocation{h, size})
			}
		}()
	}
	wg.Wait()
	if n := len(*s.arenas.Load()); n < 3 {
		t.Fatalf("%d arenas used; the test meant to cross arena boundaries", n)
	}
	for w, list := range allocs {
		for i, o := range list {
			check(t, s.Bytes(o.h, o.size), uint64(w*perWorker+i), o.size)
		}
	}
	waitPrefaulted(t, s, 2<<20)
	if res := resident(t, s) * pageSize; res < s.Stats().MemUsed {
		t.Fatalf("resident %d below mem_used %d", res, s.Stats().MemUsed)
	}
}

// TestPrefaultShrinksWhenQuiet: once the store has carved nothing for
// PrefaultQuiet, the pages held ahead shrink to half of Prefault and go
// back to the kernel, without touching a stored byte; the next writes
// bring the whole of Prefault back.
func TestPrefaultShrinksWhenQuiet(t *testing.T) {
	const arena, prefault = 4 << 20, 2 << 20
	s := newStore(t, Config{ArenaSize: arena, Prefault: prefault, PrefaultQuiet: time.Second})
	var allocs []allocation
	store := func(n int) {
		for range n {
			size := 1000 + len(allocs)%3000
			h, b, err := s.Alloc(size, uint32(len(allocs)))
			if err != nil {
				t.Fatal(err)
			}
			fill(b, uint64(len(allocs)))
			allocs = append(allocs, allocation{h, size})
		}
	}
	// Past the first arena, so that the pages ahead span the last one's
	// tail and the spare.
	store(2500)
	// Half, the most kept between bursts, where the burst carved
	// Prefault/4 in 100 ms; a loaded machine may carve it more slowly.
	waitAhead(t, s, func(ahead int64) bool { return ahead > prefault/8 && ahead <= prefault/2 }, "between an eighth and half of Prefault")
	if n := len(*s.arenas.Load()); n < 2 {
		t.Fatalf("%d arenas used; the test meant to go past the first", n)
	}
	// What was held beyond went back: nothing past the pages ahead is
	// resident, in the last arena or the spare.
	s.mu.Lock()
	arenas := *s.arenas.Load()
	last, from := arenas[len(arenas)-1], max(s.pf.faultedTo, s.arenaNext)
	beyond := residentPages(t, last[from*pageSize:])
	if s.pf.spare != nil && s.pf.spareFaulted < len(s.pf.spare)/pageSize {
		beyond += residentPages(t, s.pf.spare[s.pf.spareFaulted*pageSize:])
	}
	s.mu.Unlock()
	if beyond != 0 {
		t.Errorf("%d pages resident beyond the %d KiB held ahead, want none", beyond, prefault/2>>10)
	}
	for i, o := range allocs {
		check(t, s.Bytes(o.h, o.size), uint64(i), o.size)
	}
	misses := s.Stats().PrefaultMisses
	store(100)
	waitAhead(t, s, func(ahead int64) bool { return ahead >= prefault }, "all of Prefault")
	if n := s.Stats().PrefaultMisses - misses; n != 0 {
		t.Errorf("%d pages carved before they were faulted in after the shrink, want 0", n)
	}
	for i, o := range allocs {
		check(t, s.Bytes(o.h, o.size), uint64(i), o.size)
	}
}

// TestPrefaultFollowsTheWriteRate: a store whose writes come slowly
// holds an eighth of Prefault ahead once quiet, not the half a burst
// leaves (TestPrefaultShrinksWhenQuiet), and a burst after it misses
// no page: the writers wait for the thread instead.
func TestPrefaultFollowsTheWriteRate(t *testing.T) {
	const arena, prefault = 8 << 20, 8 << 20
	s := newStore(t, Config{ArenaSize: arena, Prefault: prefault, PrefaultQuiet: time.Second})
	var allocs []allocation
	alloc := func(size int) {
		h, b, err := s.Alloc(size, uint32(len(allocs)))
		if err != nil {
			t.Fatal(err)
		}
		fill(b, uint64(len(allocs)))
		allocs = append(allocs, allocation{h, size})
	}
	// A write every 20 ms, of one class: a slab carved now and then.
	for range 50 {
		alloc(1000)
		time.Sleep(20 * time.Millisecond)
	}
	waitAhead(t, s, func(ahead int64) bool { return ahead == prefault/8 }, "an eighth of Prefault")
	for i := range 3000 {
		alloc(1000 + i%3000)
	}
	for i, o := range allocs {
		check(t, s.Bytes(o.h, o.size), uint64(i), o.size)
	}
	t.Logf("%d allocations waited for the prefaulter after the quiet spell", s.Stats().PrefaultMisses)
	// More than the slow writer's eighth (half where the burst took
	// under 200 ms; a loaded machine may take longer).
	waitAhead(t, s, func(ahead int64) bool { return ahead > prefault/8 && ahead <= prefault/2 }, "more than an eighth of Prefault, after the burst")
	checkInvariants(t, s)
}

// TestPrefaultGivesBackTheTailsOfArenasLeft: where the next slab does
// not fit in the last arena, carve leaves the pages faulted ahead at its
// end; the prefaulter gives them back, and so does Recover for the tails
// a process left.
func TestPrefaultGivesBackTheTailsOfArenasLeft(t *testing.T) {
	const arena = 1 << 20
	files := newFiles(t)
	cfg := Config{ArenaSize: arena, Prefault: arena, Files: files}
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	m := newModel(4000)
	for o := range m.allocs {
		size := 1500 + 37*o%2500
		h, b, err := s.Alloc(size, uint32(o))
		if err != nil {
			t.Fatal(err)
		}
		fill(b, uint64(o)<<20|uint64(size))
		m.allocs[o] = allocation{h, size}
	}
	// The pages resident past each arena's last slab, but the last's.
	tails := func(s *Store) (resident, arenas int) {
		s.mu.Lock()
		defer s.mu.Unlock()
		all := *s.arenas.Load()
		ends := make([]int, len(all))
		for id := uint32(1); id < s.nslabs.Load(); id++ {
			r := s.rec(id)
			ends[r.arena] = max(ends[r.arena], int(r.page)+int(s.geo[r.class].pages))
		}
		for a, mem := range all[:len(all)-1] {
			resident += residentPages(t, mem[ends[a]*pageSize:])
		}
		return resident, len(all)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		n, arenas := tails(s)
		if arenas < 4 {
			t.Fatalf("%d arenas used; the test meant to fill several", arenas)
		}
		if n == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d pages resident at the ends of the %d arenas left, 5 s on", n, arenas-1)
		}
		time.Sleep(time.Millisecond)
	}
	checkModel(t, s, m)
	// A process that died before its prefaulter gave the tails back:
	// fault them in again (a hole reads as zero, and the write faults
	// it in) and take the store over.
	all := *s.arenas.Load()
	for _, mem := range all[:len(all)-1] {
		for i := len(mem) - pageSize; i >= 0 && residentPages(t, mem[i:i+pageSize]) == 0; i -= pageSize {
			mem[i] = 0
		}
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	r := recoverStore(t, cfg, m)
	checkModel(t, r, m)
	if n, arenas := tails(r); n != 0 {
		t.Errorf("%d pages resident at the ends of the %d arenas left after Recover", n, arenas-1)
	}
}

// waitAhead waits up to 5 s for the bytes faulted ahead of carve to
// satisfy ok.
func waitAhead(t *testing.T, s *Store, ok func(int64) bool, what string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		s.mu.Lock()
		ahead := int64(0)
		if len(*s.arenas.Load()) > 0 {
			ahead = int64(max(s.pf.faultedTo-s.arenaNext, 0))
		}
		if s.pf.spare != nil {
			ahead += int64(s.pf.spareFaulted)
		}
		s.mu.Unlock()
		if ok(ahead * pageSize) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d KiB held ahead after 5 s, want %s", ahead*pageSize>>10, what)
		}
		time.Sleep(time.Millisecond)
	}
}

// TestPrefaultKeepsEmptiedSlabs: with Prefault set, a slab that empties
// keeps its pages and is reused as it is (a released one would fault on a
// writer's path); the writes after the trims need no new store memory and
// miss no prefaulted page.
func TestPrefaultKeepsEmptiedSlabs(t *testing.T) {
	s := newStore(t, Config{ArenaSize: 4 << 20, Prefault: 4 << 20})
	waitPrefaulted(t, s, 4<<20)
	const n = 3000 // many slabs of one class, far more than the cached one
	alloc := func() []Handle { return allocFilled(t, s, n, 1000) }
	for _, h := range alloc() {
		s.Free(h)
	}
	st := s.Stats()
	if st.Allocations != 0 || st.MemUsed == 0 {
		t.Fatalf("after freeing everything: %d allocations, mem_used %d; want 0 allocations and the slabs' memory kept", st.Allocations, st.MemUsed)
	}
	if rel := releasedSlabs(s); rel != 0 {
		t.Fatalf("%d emptied slabs gave their pages back", rel)
	}
	alloc()
	after := s.Stats()
	// The slabs are reused in another order, so the one left part full
	// may differ: at most one slab's pages more.
	if slab := int64(s.geo[classOf(1000)].pages) * pageSize; after.MemUsed > st.MemUsed+slab {
		t.Errorf("mem_used %d after writing the same again, want at most %d (emptied slabs reused)", after.MemUsed, st.MemUsed+slab)
	}
	if after.PrefaultMisses != 0 {
		t.Errorf("%d pages used before they were prefaulted", after.PrefaultMisses)
	}
}

// waitPrefaulted waits until the store has n bytes faulted in ahead.
func waitPrefaulted(t *testing.T, s *Store, n int64) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		s.mu.Lock()
		ahead := int64(s.pf.spareFaulted)
		if len(*s.arenas.Load()) > 0 {
			ahead = int64(s.pf.faultedTo - s.arenaNext)
			if s.pf.spare != nil {
				ahead += int64(s.pf.spareFaulted)
			}
		}
		s.mu.Unlock()
		if ahead*pageSize >= n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("only %d bytes prefaulted after 5 s, want %d", ahead*pageSize, n)
		}
		time.Sleep(time.Millisecond)
	}
}

// releasedSlabs counts empty slabs holding no pages.
func releasedSlabs(s *Store) int {
	n := 0
	for i := range s.classes {
		c := &s.classes[i]
		c.mu.Lock()
		for _, id := range c.empty {
			if s.rec(id).touched == 0 {
				n++
			}
		}
		c.mu.Unlock()
	}
	return n
}

// Emptied slabs stay resident only up to Prefault bytes: beyond that the
// memory swap gave up goes back, and is not stranded in one size class.
func TestPrefaultKeepsAtMostPrefaultOfEmptiedSlabs(t *testing.T) {
	const prefault = 1 << 20
	s := newStore(t, Config{ArenaSize: 4 << 20, Prefault: prefault})
	for _, h := range allocFilled(t, s, 8000, 1000) { // about 8 MB
		s.Free(h)
	}
	st := s.Stats()
	// The class's one cached slab may hold memory besides the kept ones.
	slab := int64(s.geo[classOf(1000)].pages) * pageSize
	if st.MemUsed > prefault+slab {
		t.Errorf("mem_used %d after freeing everything, want at most Prefault (%d) and one cached slab", st.MemUsed, prefault)
	}
	if got := s.keptEmpty.Load() * pageSize; got > prefault || got < prefault-slab {
		t.Errorf("%d bytes of emptied slabs kept, want about Prefault (%d)", got, prefault)
	}
}

// allocFilled stores n allocations of size bytes, each filled from its
// index. Where the test stopped the store's prefaulter, an allocation
// that finds no memory ready runs the thread's work on this goroutine
// and tries again.
func allocFilled(t *testing.T, s *Store, n, size int) []Handle {
	t.Helper()
	hs := make([]Handle, n)
	for i := range hs {
		h, b, err := s.Alloc(size, uint32(i))
		if errors.Is(err, ErrNotPrefaulted) && s.pf.stopped {
			prefaultByHand(s)
			h, b, err = s.Alloc(size, uint32(i))
		}
		if err != nil {
			t.Fatal(err)
		}
		fill(b, uint64(i))
		hs[i] = h
	}
	return hs
}

// prefaultByHand does what a round of the stopped prefaulter would to
// make memory ready.
func prefaultByHand(s *Store) {
	s.pf.warmReleased()
	s.pf.prefaultAhead(int(s.pf.prefault / pageSize))
}

// With a prefaulter, a Free that empties a slab beyond what is kept leaves
// giving its pages back to that thread: under mlockall that takes the mmap
// lock for writing, which a writer storing a swapped page must never wait
// for. The slab returns to its class only once its pages are back.
func TestFreeLeavesReleasesToThePrefaulter(t *testing.T) {
	const prefault = 1 << 20
	s := newStore(t, Config{ArenaSize: 4 << 20, Prefault: prefault})
	// Stop the prefaulter, so that the queue stays as Free left it.
	s.pf.stop()

	hs := allocFilled(t, s, 8000, 1000) // about 8 MB
	before := resident(t, s)
	for _, h := range hs {
		s.Free(h)
	}
	queued := int64(0)
	for _, p := range s.pf.releases {
		queued += int64(p.pages)
	}
	if len(s.pf.releases) == 0 {
		t.Fatal("no slab queued for the prefaulter to release")
	}
	if n := releasedSlabs(s); n != 0 {
		t.Errorf("%d slabs released by Free itself, want none", n)
	}
	if got := resident(t, s); got < before {
		t.Errorf("resident pages fell from %d to %d before the prefaulter ran", before, got)
	}
	if st := s.Stats(); st.MemUsed > prefault+int64(s.geo[classOf(1000)].pages)*pageSize {
		t.Errorf("mem_used %d: queued slabs still counted", st.MemUsed)
	}

	nslabs := s.nslabs.Load()
	slabs := len(s.pf.releases)
	s.pf.releaseQueued()
	if got := resident(t, s); got > before-queued {
		t.Errorf("%d pages resident after the release, want at most %d", got, before-queued)
	}
	if n := releasedSlabs(s); n != slabs {
		t.Errorf("%d released slabs back with their classes, want %d", n, slabs)
	}
	// Released slabs are not taken on the writer's path, where their
	// pages would fault in: new slabs are carved from the pages faulted
	// ahead, and each asks the prefaulter to fault a released one in
	// again for the next.
	// (The slabs Free kept resident are taken first.)
	c := &s.classes[classOf(1000)]
	hs = allocFilled(t, s, residentEmpty(s, c)*int(s.geo[classOf(1000)].cells), 1000)
	s.pf.prefaultAhead(prefault / pageSize)
	aheadFrom, misses := s.nslabs.Load(), s.Stats().PrefaultMisses
	hs = append(hs, allocFilled(t, s, 400, 1000)...) // within the 1 MiB faulted ahead
	carved := int(s.nslabs.Load() - nslabs)
	if carved == 0 || c.wantWarm != carved {
		t.Fatalf("%d slabs carved allocating again, %d released slabs wanted warm: want the same, not 0", carved, c.wantWarm)
	}
	if got := s.Stats().PrefaultMisses - misses; got != 0 {
		t.Errorf("%d prefault misses carving within the pages faulted ahead", got)
	}
	// As many are warmed as the prefault allows, no more.
	for range 4 {
		s.pf.warmReleased()
	}
	slab := int64(s.geo[classOf(1000)].pages)
	if warm := s.warmEmpty.Load(); warm > prefault/pageSize+slab || warm < min(int64(carved)*slab, prefault/pageSize) {
		t.Errorf("%d pages of released slabs warmed for %d slabs carved: want as many, within %d", warm, carved, prefault/pageSize)
	}
	// Then they are reused, resident: no slab carved, no fault.
	for _, h := range hs {
		s.Free(h)
	}
	s.pf.releaseQueued()
	for range 4 {
		s.pf.warmReleased()
	}
	if warm := s.warmEmpty.Load(); warm > prefault/pageSize+slab {
		t.Errorf("%d pages of empty slabs warm, more than the prefault's %d", warm, prefault/pageSize)
	}
	nslabs, misses = s.nslabs.Load(), s.Stats().PrefaultMisses
	warm := residentEmpty(s, c)
	allocFilled(t, s, warm*int(s.geo[classOf(1000)].cells), 1000)
	if got := s.nslabs.Load(); got != nslabs {
		t.Errorf("%d slabs carved filling the %d warm ones", got-nslabs, warm)
	}
	if got := s.Stats().PrefaultMisses - misses; got != 0 {
		t.Errorf("%d prefault misses filling warm slabs", got)
	}
	// Past the pages faulted ahead, a writer maps and faults nothing
	// new: it neither carves nor takes a released slab, whose pages
	// would fault in, and fails (the prefaulter is stopped, so at once).
	misses = s.Stats().PrefaultMisses
	arenas := len(*s.arenas.Load())
	for i := range 4000 {
		if _, _, err := s.Alloc(1000, uint32(i)); err != nil {
			if !errors.Is(err, ErrNotPrefaulted) {
				t.Fatalf("Alloc past the pages faulted ahead: %v, want ErrNotPrefaulted", err)
			}
			break
		}
	}
	if got := int64(s.nslabs.Load()-aheadFrom) * slab; got > prefault/pageSize+prefaultStep {
		t.Errorf("%d pages of slabs carved, more than the %d faulted ahead", got, prefault/pageSize+prefaultStep)
	}
	if n := len(*s.arenas.Load()); n != arenas {
		t.Errorf("%d arenas mapped by writers", n-arenas)
	}
	if s.Stats().PrefaultMisses == misses {
		t.Error("no allocation found the memory faulted ahead spent")
	}
	if n := releasedSlabs(s); n == 0 {
		t.Error("no released slab left: a writer took one")
	}
}

// residentEmpty counts class c's empty slabs whose pages are resident.
func residentEmpty(s *Store, c *class) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, id := range c.empty {
		if r := s.rec(id); r.touched > 0 || !r.cold {
			n++
		}
	}
	return n
}

// Once a class has no resident empty slab left, the prefaulter faults a
// released one in again, and the next slab the class needs is that one,
// without a fault on the writer's path.
func TestPrefaulterWarmsAReleasedSlab(t *testing.T) {
	s := newStore(t, Config{ArenaSize: 4 << 20, Prefault: pageSize})
	s.pf.stop()

	const size = 1000
	hs := allocFilled(t, s, 2000, size)
	for _, h := range hs {
		s.Free(h)
	}
	s.pf.releaseQueued()
	c := &s.classes[classOf(size)]
	s.pf.warmReleased()
	n := len(c.empty)
	if n == 0 || s.rec(c.empty[n-1]).cold {
		t.Fatal("no warm slab on top of the class's empty stack")
	}
	top := c.empty[n-1]
	vec := make([]byte, s.geo[classOf(size)].pages)
	if err := mincore(s.slabMem(s.rec(top), &s.geo[classOf(size)]), vec); err != nil {
		t.Fatal(err)
	}
	for i, v := range vec {
		if v&1 == 0 {
			t.Fatalf("page %d of the warm slab not resident", i)
		}
	}
	misses := s.Stats().PrefaultMisses
	h := allocFilled(t, s, 1, size)[0]
	if got := s.Stats().PrefaultMisses - misses; got != 0 {
		t.Errorf("%d prefault misses taking the warm slab", got)
	}
	if id, _, _, _, _ := s.lookup(h); id != top {
		t.Errorf("allocation in slab %d, want the warm slab %d", id, top)
	}
}

// With every slab record in use, a writer takes no released slab (its
// pages would fault in): it fails, and asks the prefaulter to fault one in
// again, which the next allocation takes.
func TestNoSlabRecordLeftWaitsForAReleasedSlabWarmed(t *testing.T) {
	s := newStore(t, Config{ArenaSize: 4 << 20, Prefault: pageSize}) // none kept
	s.pf.stop()
	hs := allocFilled(t, s, 2000, 1000)
	for _, h := range hs {
		s.Free(h)
	}
	s.pf.releaseQueued()
	n := s.nslabs.Load()
	s.nslabs.Store(maxSlabs) // as if every record were in use
	defer s.nslabs.Store(n)
	misses := s.Stats().PrefaultMisses
	if _, _, err := s.Alloc(1000, 1); !errors.Is(err, ErrNotPrefaulted) {
		t.Fatalf("Alloc with only released slabs and no record left: %v, want ErrNotPrefaulted", err)
	}
	if got := s.Stats().PrefaultMisses - misses; got != 1 {
		t.Errorf("%d prefault misses, want 1", got)
	}
	s.pf.warmReleased()
	c := &s.classes[classOf(1000)]
	top := c.empty[len(c.empty)-1]
	h, _, err := s.Alloc(1000, 1)
	if err != nil {
		t.Fatalf("Alloc once a released slab is warm: %v", err)
	}
	if id, _, _, _, _ := s.lookup(h); id != top {
		t.Errorf("allocation in slab %d, want the warmed slab %d", id, top)
	}
}

// Writers that outrun the prefaulter (a burst of fresh pages into a store
// that holds little ahead, as right after a restart) wait for it: none
// faults store memory in on its own thread, and none fails.
func TestAllocWaitsForThePrefaulter(t *testing.T) {
	s := newStore(t, Config{ArenaSize: 4 << 20, Prefault: 256 << 10})
	const writers, perWriter = 4, 3000
	faults := make([]int64, writers)
	var wg sync.WaitGroup
	for w := range writers {
		wg.Go(func() {
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			r := rand.New(rand.NewPCG(uint64(w), 2))
			var before, after unix.Rusage
			if err := unix.Getrusage(unix.RUSAGE_THREAD, &before); err != nil {
				t.Error(err)
				return
			}
			for i := range perWriter {
				size := 1000 + r.IntN(MaxAllocSize-1000)
				_, b, err := s.Alloc(size, uint32(w*perWriter+i))
				if err != nil {
					t.Errorf("writer %d, allocation %d: %v", w, i, err)
					return
				}
				fill(b, uint64(i))
			}
			if err := unix.Getrusage(unix.RUSAGE_THREAD, &after); err != nil {
				t.Error(err)
				return
			}
			faults[w] = after.Minflt + after.Majflt - before.Minflt - before.Majflt
		})
	}
	wg.Wait()
	t.Logf("%d allocations waited for the prefaulter; faults of each writer's thread: %v", s.Stats().PrefaultMisses, faults)
	if s.Stats().PrefaultMisses == 0 {
		t.Error("no writer outran the prefaulter: the test meant them to")
	}
	// A few, not zero: the runtime's own first touches of a test's Go
	// heap, which unlike the daemon's is not faulted in ahead (0-15 in
	// 30 runs). Faulting store memory is thousands: the writers store
	// about 8,000 pages' worth (1,450-1,970 each before writers waited).
	const allowed = 64
	for w, n := range faults {
		switch {
		case raceEnabled:
			// 7-193 under the race detector: not counted.
		case n > allowed:
			t.Errorf("writer %d faulted %d times storing (allowed %d)", w, n, allowed)
		}
	}
}

// Where a wait for the prefaulter runs out (the thread is waiting on
// reclaim), the allocations after it fail at once, until the thread makes
// memory ready again.
func TestAllocFailsAtOnceWhileThePrefaulterStalls(t *testing.T) {
	s := newStore(t, Config{ArenaSize: 4 << 20, Prefault: 256 << 10})
	waitPrefaulted(t, s, 256<<10)
	s.pf.stop()
	s.mu.Lock()
	s.pf.stopped = false // as if the thread were there, stuck
	s.mu.Unlock()
	var err error
	var first time.Duration
	for i := 0; err == nil; i++ {
		t0 := time.Now()
		_, _, err = s.Alloc(4000, uint32(i))
		first = time.Since(t0)
	}
	if !errors.Is(err, ErrNotPrefaulted) {
		t.Fatalf("storing past the memory prefaulted: %v, want ErrNotPrefaulted", err)
	}
	if first < PrefaultWait {
		t.Errorf("the first allocation past the memory prefaulted failed after %v, want a wait of %v", first, PrefaultWait)
	}
	t0 := time.Now()
	if _, _, err := s.Alloc(4000, 1); !errors.Is(err, ErrNotPrefaulted) {
		t.Fatalf("storing again: %v, want ErrNotPrefaulted", err)
	}
	if d := time.Since(t0); d >= PrefaultWait/2 {
		t.Errorf("the next allocation failed after %v: it waited for a stalled prefaulter", d)
	}
	prefaultByHand(s) // the thread makes memory ready again
	if _, _, err := s.Alloc(4000, 1); err != nil {
		t.Fatalf("storing once memory is ready: %v", err)
	}
}
