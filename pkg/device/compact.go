// The background compactor and its policy.

package device

import (
	"context"
	"time"
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
func (d *Device) RunCompactor(ctx context.Context, p CompactPolicy) {
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
		moved := d.Compact()
		compacted = groups
		after := d.cfg.Store.Stats()
		d.log.Info("compacted the page store", "why", why, "moved", moved,
			"mem_used_before", st.MemUsed, "mem_used_after", after.MemUsed, "took", time.Since(start).Round(time.Millisecond))
	}
}
