// Compaction: objects moved out of sparse slabs, and the background
// compactor's policy.

package device

import (
	"context"
	"time"

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
}

// RunCompactor compacts the store whenever fragmentation passes the
// policy's bounds, until ctx is done. Like zram, compaction is otherwise
// only on request (Compact).
func (d *Device) RunCompactor(ctx context.Context, p CompactPolicy) { compactor{d}.run(ctx, p) }

// compactor moves the store's objects out of sparse slabs (pagestore's
// Compact) and points the page table at where they went, under the locks
// of their pages' groups; run does so whenever fragmentation passes a
// policy's bounds. The table and its locks are the device's.
type compactor struct{ d *Device }

// run compacts until ctx is done (Device.RunCompactor).
func (c compactor) run(ctx context.Context, p CompactPolicy) {
	d := c.d
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
	t := time.NewTicker(p.Interval)
	defer t.Stop()
	var compacted uint64 // the dense tier's groups at the last compaction
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		st := d.cfg.Store.Stats()
		groups := d.dense.Stats().Groups
		limit, why := p.MaxOverhead, "fragmented"
		if groups != compacted {
			limit, why = p.AfterDense, "the dense tier recompressed groups"
		}
		// Staged pages' reservations are not slab memory: compaction
		// cannot give them back.
		held := st.MemUsed - st.Reserved
		if waste := held - st.ComprDataSize; waste < p.MinWaste || float64(held) < limit*float64(st.ComprDataSize) {
			continue
		}
		start := time.Now()
		moved := c.compact()
		compacted = groups
		after := d.cfg.Store.Stats()
		d.log.Info("compacted the page store", "why", why, "moved", moved,
			"mem_used_before", st.MemUsed, "mem_used_after", after.MemUsed, "took", time.Since(start).Round(time.Millisecond))
	}
}

// compact moves objects out of sparse slabs (Device.Compact).
func (c compactor) compact() int { return c.d.cfg.Store.Compact(c.relocate) }

// relocate points the page table at new, where the store moved the object
// old, tagged with owner, under the lock of owner's group.
func (c compactor) relocate(owner uint32, old, new pagestore.Handle) bool {
	d := c.d
	if owner >= d.pages {
		return false
	}
	s := d.stripe(owner)
	s.mu.Lock()
	defer s.mu.Unlock()
	e := d.table[owner]
	if !e.hasObject() || e.handle() != old {
		return c.relocatePart(owner, old, new)
	}
	// The store copied the object before this lock was held, possibly
	// while a commit was still filling it; under the lock the committed
	// bytes are final, so copy again.
	copy(d.cfg.Store.Bytes(new, e.length()), d.cfg.Store.Bytes(old, e.length()))
	d.table[owner] = objectEntry(e.state(), new, e.length())
	return true
}

// relocatePart moves the chunk old of an object whose
// first page is owner to new. The caller holds owner's group lock.
func (c compactor) relocatePart(owner uint32, old, new pagestore.Handle) bool {
	d := c.d
	end := min(owner|(groupPages-1)+1, d.pages)
	for i := owner; i < end; i++ {
		e := d.table[i]
		if e.state() != statePart || i-uint32(e.partIndex()) != owner {
			continue
		}
		first := d.cfg.Store.Bytes(e.handle(), e.length())
		if e.handle() == old {
			// As for a page's own object: copied again under the lock.
			copy(d.cfg.Store.Bytes(new, e.length()), first)
			for j := i; j < end; j++ {
				if f := d.table[j]; f.state() == statePart && f.handle() == old {
					d.table[j] = f.withHandle(new)
				}
			}
			return true
		}
		l, err := objectHeader(first, e.partPages())
		if err != nil {
			continue
		}
		for c := 1; c < l.chunks; c++ {
			if chunkHandle(first, c) == old {
				copy(d.cfg.Store.Bytes(new, l.chunkLen(c)), d.cfg.Store.Bytes(old, l.chunkLen(c)))
				setChunkHandle(first, c, new)
				return true
			}
		}
	}
	return false
}
