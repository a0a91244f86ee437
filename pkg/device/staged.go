// Write-behind: staging a run of pages, and flushing and committing a sealed batch.

package device

import (
	"context"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/gzramd/gzramd/pkg/codec"
	"github.com/gzramd/gzramd/pkg/pagestore"
	"github.com/gzramd/gzramd/pkg/route"
	"github.com/gzramd/gzramd/pkg/stage"
)

// stager is the device's write-behind (pkg/stage's area): it stages runs
// of pages, and writes received straight into its slots, and compresses
// and commits each sealed batch, where a newer write of a page always
// wins. It owns the area, the commits' scratch and the receipts. It is
// given the page table, whose locks it takes to install and commit pages,
// the objects and the store it commits them to, the router, which
// compresses its batches, the device's way of writing a same-filled page
// (Device.writeFilled: received pages that turn out so settle as written),
// and Config's object pages.
type stager struct {
	t           *pageTable
	obj         *objects
	store       *pagestore.Store
	router      *route.Router
	log         *slog.Logger
	writeFilled func(idx uint32, w uint64) error
	objectPages int

	area       *stage.Area
	batchPages int
	commits    []commitScratch // by batch
	receipts   chan *received  // free ones, for writes received into staging
	// closing tells a flush the store cannot take that no retry will
	// come: the device is closing.
	closing atomic.Bool

	stagedWrites, commitRetries, unusedSlots atomic.Uint64
}

// newStager starts the write-behind area of a device of cfg, in staging,
// if cfg has one (nil otherwise). Its memory is written first: nothing
// may be staged there then.
func newStager(cfg Config, t *pageTable, obj *objects, staging []byte, writeFilled func(uint32, uint64) error) (*stager, error) {
	if cfg.Staging.Batches == 0 {
		return nil, nil
	}
	sc := cfg.Staging
	sc.Limit = cfg.HugeThreshold - 1 // longer results are stored raw anyway
	s := &stager{
		t: t, obj: obj, store: cfg.Store, router: cfg.Router, log: cfg.Logger,
		writeFilled: writeFilled, objectPages: cfg.ObjectPages,
		batchPages: sc.BatchPages, commits: make([]commitScratch, sc.Batches),
	}
	for i := range s.commits {
		s.commits[i] = newCommitScratch(sc.BatchPages)
	}
	s.receipts = make(chan *received, maxReceived)
	for range maxReceived {
		s.receipts <- new(received)
	}
	next := staging
	take := func(pages int) ([]byte, error) {
		if len(next) < pages*pageSize {
			return nil, fmt.Errorf("device: staging file holds no %d pages more", pages)
		}
		mem := next[:pages*pageSize]
		next = next[pages*pageSize:]
		return mem, nil
	}
	var err error
	if s.area, err = stage.New(sc, take, s.flush); err != nil {
		return nil, fmt.Errorf("device: %w", err)
	}
	return s, nil
}

// close stops the area: a flush the store cannot take gives up.
func (s *stager) close() {
	s.closing.Store(true)
	s.area.Close()
}

// entryAt is the entry of a page staged in slot i of b.
func (s *stager) entryAt(b *stage.Batch, i int) entry {
	return stagedEntry(b.ID*s.batchPages + i)
}

// stageRun stages the first pages of a run of whole pages that are not
// same-filled, as many as the open staging batch takes, and returns how
// many it staged: 0 when staging is full or the memory limit leaves no
// room for them raw, and the caller compresses them inline.
//
// Each staged page is counted as 4 KiB of store memory (Reserve) until its
// batch is committed, so that a staged write can always be stored later:
// it is acknowledged already.
func (s *stager) stageRun(first uint32, pages []byte) int {
	n := len(pages) / pageSize
	if s.store.Reserve(int64(n)*pageSize) != nil {
		return 0 // inline writes count exactly what they need
	}
	b, at, k := s.area.Take(n)
	s.store.Unreserve(int64(n-k) * pageSize)
	if k == 0 {
		return 0
	}
	copy(b.Pages[at*pageSize:(at+k)*pageSize], pages[:k*pageSize])
	for j := range k {
		s.install(b, at+j, first+uint32(j))
	}
	s.area.Done(b)
	s.stagedWrites.Add(uint64(k))
	return k
}

// flush compresses a sealed batch of staged pages and commits each page
// whose entry still points at its slot; pages written again since lose,
// and their objects are freed. It runs on a staging worker and returns
// only once every page of the batch is settled, as the area requires.
// Adjacent pages go together in objects of several pages where the fast
// tier makes them (objectsOf).
//
// The store takes the batch's objects from the 4 KiB each page reserved
// when it was staged, and asks the memory limit for more only where that
// falls short (pages that did not compress, in a new slab). When the limit
// has no room then, or the store cannot map memory, the pages not yet
// committed stay staged and readable, and flush tries again until it can,
// or the device closes: they are acknowledged.
func (s *stager) flush(b *stage.Batch) {
	cs := &s.commits[b.ID]
	b.Objects = s.objectsOf(b, cs.objects)
	defer func() { b.Objects = nil }()
	defer s.router.ReleaseOutputs(b.Batch)
	s.router.CompressBatch(b.Batch)
	cs.done, cs.credit = 0, 0
	for i := range b.N {
		if b.Owners[i] != unusedSlot {
			cs.credit += pageSize // each page reserved 4 KiB when it was staged
		}
	}
	for attempt := 0; ; attempt++ {
		err := s.commit(b, cs)
		if err == nil {
			s.store.Unreserve(cs.credit)
			return
		}
		if s.closing.Load() {
			s.log.Error("device: closing with staged pages the store could not take; they are lost with the device",
				"pages", b.N-cs.done, "err", err)
			s.uncommitted(b, cs)
			return
		}
		s.commitRetries.Add(1)
		wait := min(time.Millisecond<<min(attempt, 10), time.Second)
		if attempt%10 == 0 {
			s.log.Warn("device: the store cannot take staged pages now; they stay staged and readable, retrying",
				"pages", b.N-cs.done, "attempt", attempt+1, "retry_in", wait, "err", err)
		}
		time.Sleep(wait)
	}
}

// objectsOf marks, in objs, the objects of several pages b's pages make
// as an inline write's would: runs of slots that hold adjacent pages of
// the device, within one span of Config.ObjectPages pages. It returns
// nil where staged pages are kept alone (no Config.ObjectPages).
func (s *stager) objectsOf(b *stage.Batch, objs []uint8) []uint8 {
	per := uint32(s.objectPages)
	if per <= 1 {
		return nil
	}
	objs = objs[:b.N]
	start := 0
	for i := range b.N {
		idx, prev := b.Owners[i], uint32(unusedSlot)
		if i > 0 {
			prev = b.Owners[i-1]
		}
		if idx != unusedSlot && prev != unusedSlot && idx == prev+1 && idx%per != 0 {
			objs[i] = 0
			objs[start]++
			continue
		}
		objs[i], start = 1, i
	}
	return objs
}

// Drain returns once no page is staged and no staged batch is compressing
// (the open batch seals at its deadline), or with ctx's error.
func (d *Device) Drain(ctx context.Context) error {
	if d.stager == nil {
		return nil
	}
	return d.stager.drain(ctx)
}

// drain is Drain on a device that stages.
func (s *stager) drain(ctx context.Context) error {
	t := time.NewTicker(100 * time.Microsecond)
	defer t.Stop()
	for s.t.stagedPages.Load() != 0 || s.area.Stats().Busy != 0 {
		select {
		case <-ctx.Done():
			return fmt.Errorf("device: %d pages still staged: %w", s.t.stagedPages.Load(), ctx.Err())
		case <-t.C:
		}
	}
	return nil
}

// commitScratch is one staging batch's commit state, made with the
// device so that commits allocate nothing.
type commitScratch struct {
	done    int     // slots of the batch committed (or lost) so far
	credit  int64   // what is left of the pages' reservations
	objects []uint8 // the batch's objects (codec.Batch.Objects)
	// The units from done on, and their allocations: a page's object
	// (objs, in the batch's memory, and states), or an object's chunks.
	units   []commitUnit
	objs    [][]byte
	states  []int
	sizes   []int
	owners  []uint32
	handles []pagestore.Handle
	free    []pagestore.Handle
}

// commitUnit is what a commit stores as one: the write in a slot, or an
// object of several pages from a slot on, of chunks chunks. It is small:
// a commit scratch holds one a staged page.
type commitUnit struct {
	slot, alloc   int32 // its slot, and its first allocation
	pages, chunks uint8 // chunks 0: a page's object
}

// allocs is how many allocations the unit takes.
func (u *commitUnit) allocs() int { return max(int(u.chunks), 1) }

func newCommitScratch(pages int) commitScratch {
	return commitScratch{
		objects: make([]uint8, pages), units: make([]commitUnit, pages),
		objs: make([][]byte, pages), states: make([]int, pages), sizes: make([]int, pages),
		owners: make([]uint32, pages), handles: make([]pagestore.Handle, pages),
		free: make([]pagestore.Handle, 0, 2*pages+maxChunks),
	}
}

// commit stores the pages of b from cs.done on and installs them, as far
// as the store takes them.
func (s *stager) commit(b *stage.Batch, cs *commitScratch) error {
	u, m := 0, 0
	for i := cs.done; i < b.N; {
		un := commitUnit{slot: int32(i), pages: 1, alloc: int32(m)}
		if p := int(objectPages(b.Batch, i)); p > 1 {
			if l, ok := s.obj.keep(int(b.Lens[i]), p); ok {
				un.pages, un.chunks = uint8(p), uint8(l.chunks)
				for c := range l.chunks {
					cs.objs[m], cs.sizes[m], cs.owners[m] = nil, l.chunkLen(c), b.Owners[i]
					m++
				}
				cs.units[u] = un
				u++
				i += p
				continue
			}
		}
		if b.Owners[i] != unusedSlot {
			cs.states[m], cs.objs[m] = s.stagedPage(b.Batch, i)
			cs.sizes[m], cs.owners[m] = len(cs.objs[m]), b.Owners[i]
			m++
			cs.units[u] = un
			u++
		}
		i++
	}
	k, credit, err := s.store.AllocBatch(pagestore.Short, cs.sizes[:m], cs.owners[:m], cs.handles[:m], cs.credit)
	cs.credit = credit
	whole := u
	for j := range u {
		if un := &cs.units[j]; int(un.alloc)+un.allocs() > k {
			// An object the store gave some of its chunks: they go
			// back, and it is tried again with the rest.
			whole = j
			s.store.FreeBatch(cs.handles[un.alloc:k])
			break
		}
	}
	cs.free = cs.free[:0]
	for j := range whole {
		un := &cs.units[j]
		if un.pages > 1 {
			s.commitObject(b, cs, un)
			continue
		}
		i, a := int(un.slot), int(un.alloc)
		copy(s.store.Bytes(cs.handles[a], cs.sizes[a]), cs.objs[a])
		idx := b.Owners[i]
		st := s.t.stripe(idx)
		st.mu.Lock()
		if s.t.table[idx] == s.entryAt(b, i) {
			s.t.swapLocked(st, idx, handleEntry(cs.states[a], cs.handles[a], cs.sizes[a])) // a staged entry leaves nothing
		} else {
			cs.free = append(cs.free, cs.handles[a]) // written again since
		}
		st.mu.Unlock()
		cs.free = s.obj.queueFree(cs.free, freeRef(b.Words[i]))
		b.Words[i] = 0
	}
	s.store.FreeBatch(cs.free)
	clear(cs.objs[:m]) // the batch's memory is not the scratch's
	if whole < u {
		cs.done = int(cs.units[whole].slot)
	} else {
		cs.done = b.N
	}
	return err
}

// objectPages is Objects[i] of b, 1 where b has no objects.
func objectPages(b *codec.Batch, i int) uint8 {
	if b.Objects == nil {
		return 1
	}
	return b.Objects[i]
}

// stagedPage returns how the page in slot i of b is stored, as objects.alone
// does; a page of an object of several pages that is not kept as one
// (it did not compress well enough) is stored raw.
func (s *stager) stagedPage(b *codec.Batch, i int) (state int, obj []byte) {
	if objectPages(b, i) != 1 {
		return stateHuge, b.Page(i)
	}
	return s.obj.alone(b, i, b.Page(i))
}

// commitObject fills the chunks the store gave an object of several pages
// of b and installs it for each of its pages still staged in its slot;
// an object no page takes any more is freed.
func (s *stager) commitObject(b *stage.Batch, cs *commitScratch, un *commitUnit) {
	slot, pages := int(un.slot), int(un.pages)
	stream := b.Compressed(slot)
	l, _ := s.obj.keep(len(stream), pages) // as commit found it
	hs := cs.handles[un.alloc : int(un.alloc)+l.chunks]
	s.obj.fill(hs, l, pages, stream)
	installed := 0
	st := s.t.stripe(b.Owners[slot]) // an object's pages share their group's
	st.mu.Lock()
	for j := range pages {
		i := slot + j
		if idx := b.Owners[i]; s.t.table[idx] == s.entryAt(b, i) {
			s.t.swapLocked(st, idx, partEntry(hs[0], j, pages, l.chunkLen(0)))
			installed++
		}
	}
	st.mu.Unlock()
	if installed == 0 {
		cs.free = s.obj.queueFree(cs.free, partRef|freeRef(hs[0]))
	}
	for i := slot; i < slot+pages; i++ {
		cs.free = s.obj.queueFree(cs.free, freeRef(b.Words[i]))
		b.Words[i] = 0
	}
}

// uncommitted settles the pages of b the store never took, when the device
// closes: their entries go empty and their reservations back.
func (s *stager) uncommitted(b *stage.Batch, cs *commitScratch) {
	for i := cs.done; i < b.N; i++ {
		idx := b.Owners[i]
		if idx == unusedSlot {
			continue
		}
		st := s.t.stripe(idx)
		st.mu.Lock()
		if s.t.table[idx] == s.entryAt(b, i) {
			s.t.swapLocked(st, idx, entry(stateEmpty))
		}
		st.mu.Unlock()
		s.obj.free(freeRef(b.Words[i]))
		b.Words[i] = 0
	}
	s.store.Unreserve(cs.credit)
}
