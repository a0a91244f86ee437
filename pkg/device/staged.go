// Write-behind: staging a run of pages, and flushing and committing a sealed batch.

package device

import (
	"context"
	"fmt"
	"time"

	"github.com/gzramd/gzramd/pkg/pagestore"
	"github.com/gzramd/gzramd/pkg/stage"
)

// stageRun stages the first pages of a run of whole pages that are not
// same-filled, as many as the open staging batch takes, and returns how
// many it staged: 0 when staging is full or the memory limit leaves no
// room for them raw, and the caller compresses them inline.
//
// Each staged page is counted as 4 KiB of store memory (Reserve) until its
// batch is committed, so that a staged write can always be stored later:
// it is acknowledged already.
func (d *Device) stageRun(first uint32, pages []byte) int {
	n := len(pages) / pageSize
	if d.cfg.Store.Reserve(int64(n)*pageSize) != nil {
		return 0 // inline writes count exactly what they need
	}
	b, at, k := d.stage.Take(n)
	d.cfg.Store.Unreserve(int64(n-k) * pageSize)
	if k == 0 {
		return 0
	}
	copy(b.Pages[at*pageSize:(at+k)*pageSize], pages[:k*pageSize])
	for j := range k {
		d.installStaged(b, at+j, first+uint32(j))
	}
	d.stage.Done(b)
	d.stagedWrites.Add(uint64(k))
	return k
}

// flush compresses a sealed batch of staged pages and commits each page
// whose entry still points at its slot; pages written again since lose,
// and their objects are freed. It runs on a staging worker and returns
// only once every page of the batch is settled, as the area requires.
//
// The store takes the batch's objects from the 4 KiB each page reserved
// when it was staged, and asks the memory limit for more only where that
// falls short (pages that did not compress, in a new slab). When the limit
// has no room then, or the store cannot map memory, the pages not yet
// committed stay staged and readable, and flush tries again until it can,
// or the device closes: they are acknowledged.
func (d *Device) flush(b *stage.Batch) {
	d.cfg.Router.AttachOutputs(b.Batch)
	defer d.cfg.Router.ReleaseOutputs(b.Batch)
	d.cfg.Router.CompressBatch(b.Batch)
	cs := &d.commits[b.ID]
	cs.done, cs.credit = 0, 0
	for i := range b.N {
		if b.Owners[i] != unusedSlot {
			cs.credit += pageSize // each page reserved 4 KiB when it was staged
		}
	}
	for attempt := 0; ; attempt++ {
		err := d.commit(b, cs)
		if err == nil {
			d.cfg.Store.Unreserve(cs.credit)
			return
		}
		if d.closing.Load() {
			d.log.Error("device: closing with staged pages the store could not take; they are lost with the device",
				"pages", b.N-cs.done, "err", err)
			d.uncommitted(b, cs)
			return
		}
		d.commitRetries.Add(1)
		wait := min(time.Millisecond<<min(attempt, 10), time.Second)
		if attempt%10 == 0 {
			d.log.Warn("device: the store cannot take staged pages now; they stay staged and readable, retrying",
				"pages", b.N-cs.done, "attempt", attempt+1, "retry_in", wait, "err", err)
		}
		time.Sleep(wait)
	}
}

// Drain returns once no page is staged and no staged batch is compressing
// (the open batch seals at its deadline), or with ctx's error.
func (d *Device) Drain(ctx context.Context) error {
	if d.stage == nil {
		return nil
	}
	t := time.NewTicker(100 * time.Microsecond)
	defer t.Stop()
	for d.stagedPages.Load() != 0 || d.stage.Stats().Busy != 0 {
		select {
		case <-ctx.Done():
			return fmt.Errorf("device: %d pages still staged: %w", d.stagedPages.Load(), ctx.Err())
		case <-t.C:
		}
	}
	return nil
}

// commitScratch is one staging batch's commit state, made with the
// device so that commits allocate nothing.
type commitScratch struct {
	done   int   // slots of the batch committed (or lost) so far
	credit int64 // what is left of the pages' reservations
	// The slots from done on that hold a write, and their objects.
	slots   []int
	objs    [][]byte // in the batch's memory
	states  []int
	sizes   []int
	owners  []uint32
	handles []pagestore.Handle
	free    []pagestore.Handle
}

func newCommitScratch(pages int) commitScratch {
	return commitScratch{
		slots: make([]int, pages), objs: make([][]byte, pages), states: make([]int, pages),
		sizes: make([]int, pages), owners: make([]uint32, pages),
		handles: make([]pagestore.Handle, pages), free: make([]pagestore.Handle, 0, 2*pages+maxChunks),
	}
}

// commit stores the pages of b from cs.done on and installs them, as far
// as the store takes them.
func (d *Device) commit(b *stage.Batch, cs *commitScratch) error {
	m := 0
	for i := cs.done; i < b.N; i++ {
		if b.Owners[i] == unusedSlot {
			continue
		}
		state, obj := d.object(b.Batch, i, b.Page(i))
		cs.slots[m], cs.objs[m], cs.states[m], cs.sizes[m], cs.owners[m] = i, obj, state, len(obj), b.Owners[i]
		m++
	}
	k, credit, err := d.cfg.Store.AllocBatch(cs.sizes[:m], cs.owners[:m], cs.handles[:m], cs.credit)
	cs.credit = credit
	for j := range k {
		copy(d.cfg.Store.Bytes(cs.handles[j], cs.sizes[j]), cs.objs[j])
	}
	cs.free = cs.free[:0]
	for j := range k {
		i, idx := cs.slots[j], cs.owners[j]
		s := d.stripe(idx)
		s.mu.Lock()
		if d.table[idx] == d.stagedAt(b, i) {
			d.swapLocked(s, idx, objectEntry(cs.states[j], cs.handles[j], cs.sizes[j])) // a staged entry leaves nothing
		} else {
			cs.free = append(cs.free, cs.handles[j]) // written again since
		}
		s.mu.Unlock()
		cs.free = d.queueFree(cs.free, objectRef(b.Words[i]))
		b.Words[i] = 0
	}
	d.cfg.Store.FreeBatch(cs.free)
	if k < m {
		cs.done = cs.slots[k]
	} else {
		cs.done = b.N
	}
	return err
}

// uncommitted settles the pages of b the store never took, when the device
// closes: their entries go empty and their reservations back.
func (d *Device) uncommitted(b *stage.Batch, cs *commitScratch) {
	for i := cs.done; i < b.N; i++ {
		idx := b.Owners[i]
		if idx == unusedSlot {
			continue
		}
		s := d.stripe(idx)
		s.mu.Lock()
		if d.table[idx] == d.stagedAt(b, i) {
			d.swapLocked(s, idx, entry(stateEmpty))
		}
		s.mu.Unlock()
		d.freeRef(objectRef(b.Words[i]))
		b.Words[i] = 0
	}
	d.cfg.Store.Unreserve(cs.credit)
}
