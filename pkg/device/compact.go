// Compaction: allocations moved out of sparse slabs, and the background
// compactor's policy.

package device

import (
	"context"
	"log/slog"
	"time"

	"github.com/gzramd/gzramd/pkg/dense"
	"github.com/gzramd/gzramd/pkg/pagestore"
)

// CompactPolicy says when the background compactor runs.
type CompactPolicy struct {
	// Interval between checks (default 10s).
	Interval time.Duration
	// MinWaste is the slab memory, in bytes, that must be held beyond the
	// compressed data before compaction is worth its copying (default 4 MiB).
	MinWaste int64
	// MaxOverhead is the ratio mem_used / compr_data above which the
	// store is compacted (default 1.15).
	MaxOverhead float64
	// AfterDense is the ratio above which it is compacted once the dense
	// tier has recompressed groups since the last compaction (default
	// 1.03): what recompression frees is spread over every slab the
	// groups' pages were in, and idle, so no write fills it soon.
	AfterDense float64
	// DenseInterval is how often it looks for groups the dense tier
	// recompressed (default 1s), and DenseWaste the slab memory beyond
	// the data from which it then compacts (default 1 MiB, or MinWaste
	// where that is less): so that what a pass freed goes back within a
	// second, on a device of any size. Writers do not fault in the slabs
	// it gives back while the store has pages faulted ahead to carve (the
	// store's prefaulter warms released ones for them).
	DenseInterval time.Duration
	DenseWaste    int64
}

// RunCompactor compacts the store whenever fragmentation passes the
// policy's bounds, until ctx is done. Like zram, compaction is otherwise
// only on request (Compact).
func (d *Device) RunCompactor(ctx context.Context, p CompactPolicy) { d.compactor().run(ctx, p) }

// compactor moves the store's allocations out of sparse slabs (pagestore's
// Compact) and points the page table at where they went, under the locks
// of their pages' groups; run does so whenever fragmentation passes a
// policy's bounds. It owns nothing, and is made for each call: it is
// given the table, the store, the dense tier, whose recompressed groups
// make compaction worth more, and the log.
type compactor struct {
	t     *pageTable
	store *pagestore.Store
	dense *dense.Tier // nil without the tier
	log   *slog.Logger
}

// compactor is d's, made now: Recover gives the device the store it
// rebuilt after open.
func (d *Device) compactor() compactor {
	return compactor{t: &d.pageTable, store: d.cfg.Store, dense: d.dense, log: d.log}
}

// run compacts until ctx is done (Device.RunCompactor).
func (c compactor) run(ctx context.Context, p CompactPolicy) {
	p = p.withDefaults()
	every := p.Interval
	if c.dense != nil {
		every = min(every, p.DenseInterval)
	}
	t := time.NewTicker(every)
	defer t.Stop()
	var compacted uint64 // the dense tier's groups at the last compaction
	// Fragmentation alone is looked at every Interval: every perLook
	// ticks, counted rather than timed, as a tick comes a little under
	// its period after the last look.
	perLook, ticks := max(int(p.Interval/every), 1), 0
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		st := c.store.Stats()
		groups := c.dense.Stats().Groups
		limit, minWaste, why := p.MaxOverhead, p.MinWaste, "fragmented"
		switch {
		case groups != compacted:
			limit, minWaste, why = p.AfterDense, p.DenseWaste, "the dense tier recompressed groups"
		case ticks+1 < perLook:
			ticks++
			continue
		}
		ticks = 0
		// Staged pages' reservations are not slab memory: compaction
		// cannot give them back.
		held := st.MemUsed - st.Reserved
		if waste := held - st.ComprDataSize; waste < minWaste || float64(held) < limit*float64(st.ComprDataSize) {
			continue
		}
		start := time.Now()
		moved := c.compact()
		compacted = groups
		after := c.store.Stats()
		c.log.Info("compacted the page store", "why", why, "moved", moved,
			"mem_used_before", st.MemUsed, "mem_used_after", after.MemUsed, "took", time.Since(start).Round(time.Millisecond))
	}
}

// withDefaults is p with its defaults where it leaves a bound unset.
func (p CompactPolicy) withDefaults() CompactPolicy {
	if p.Interval <= 0 {
		p.Interval = 10 * time.Second
	}
	if p.MinWaste <= 0 {
		p.MinWaste = 4 << 20
	}
	if p.MaxOverhead <= 1 {
		p.MaxOverhead = 1.15
	}
	if p.AfterDense <= 1 {
		p.AfterDense = 1.03
	}
	if p.DenseInterval <= 0 {
		p.DenseInterval = time.Second
	}
	if p.DenseWaste <= 0 {
		p.DenseWaste = min(p.MinWaste, 1<<20)
	}
	return p
}

// compact moves allocations out of sparse slabs (Device.Compact).
func (c compactor) compact() int { return c.store.Compact(c.relocate) }

// relocate points the page table at new, where the store moved the
// allocation old, tagged with owner, under the lock of owner's group.
func (c compactor) relocate(owner uint32, old, new pagestore.Handle) bool {
	if owner >= c.t.pages || !c.t.held(owner) {
		return false
	}
	s := c.t.stripe(owner)
	s.mu.Lock()
	defer s.mu.Unlock()
	e := c.t.table[owner]
	if !e.hasAllocation() || e.handle() != old {
		return c.relocatePart(owner, old, new)
	}
	// The store copied the allocation before this lock was held, possibly
	// while a commit was still filling it; under the lock the committed
	// bytes are final, so copy again.
	copy(c.store.Bytes(new, e.length()), c.store.Bytes(old, e.length()))
	c.t.table[owner] = handleEntry(e.state(), new, e.length())
	return true
}

// relocatePart moves the chunk old of an object whose
// first page is owner to new. The caller holds owner's group lock.
func (c compactor) relocatePart(owner uint32, old, new pagestore.Handle) bool {
	table := c.t.table
	end := min(owner|(groupPages-1)+1, c.t.pages)
	for i := owner; i < end; i++ {
		e := table[i]
		if e.state() != statePart || i-uint32(e.partIndex()) != owner {
			continue
		}
		first := c.store.Bytes(e.handle(), e.length())
		if e.handle() == old {
			// As for a page's own allocation: copied again under the lock.
			copy(c.store.Bytes(new, e.length()), first)
			c.t.moveObjectLocked(i, end, old, new)
			return true
		}
		l, err := objectHeader(first, e.partPages())
		if err != nil {
			continue
		}
		for k := 1; k < l.chunks; k++ {
			if chunkHandle(first, k) == old {
				copy(c.store.Bytes(new, l.chunkLen(k)), c.store.Bytes(old, l.chunkLen(k)))
				setChunkHandle(first, k, new)
				return true
			}
		}
	}
	return false
}
