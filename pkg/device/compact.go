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
	t := time.NewTicker(p.Interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		st := d.cfg.Store.Stats()
		// Staged pages' reservations are not slab memory: compaction
		// cannot give them back.
		held := st.MemUsed - st.Reserved
		if waste := held - st.ComprDataSize; waste < p.MinWaste || float64(held) < p.MaxOverhead*float64(st.ComprDataSize) {
			continue
		}
		start := time.Now()
		moved := d.Compact()
		after := d.cfg.Store.Stats()
		d.log.Info("compacted the page store", "moved", moved,
			"mem_used_before", st.MemUsed, "mem_used_after", after.MemUsed, "took", time.Since(start).Round(time.Millisecond))
	}
}
