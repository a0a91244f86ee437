// The recompressor: the ager's loop, its CPU budget, a group on the CPU.

package dense

import (
	"context"
	"time"
)

// Run runs the tier's ager and recompressor until ctx is done; it returns
// at once for a nil Tier.
func (t *Tier) Run(ctx context.Context) {
	if t == nil {
		return
	}
	tick := max(t.cfg.After/idleTicks, 50*time.Microsecond)
	tk := time.NewTicker(tick)
	defer tk.Stop()
	var busy time.Duration
	var swept uint64 // groups committed or kept when the device was last told
	sweep := func() {
		if n := t.groups.Load() + t.kept.Load(); n != swept {
			swept = n
			t.dev.Swept()
		}
	}
	defer sweep()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tk.C:
		}
		for g := range t.ages {
			a := &t.ages[g]
			v := a.Load()
			if v&ageMask < ageMask {
				if !a.CompareAndSwap(v, v+1) {
					continue // accessed just now
				}
				v++
			}
			if v&settledBit != 0 || v&ageMask < idleTicks {
				continue
			}
			start := time.Now()
			var onGPU time.Duration // waiting for the GPU: not the budget's
			if q := t.gpu.Load(); q != nil && t.queue(q, uint32(g), v) {
				if len(q.queued) == cap(q.queued) {
					onGPU = t.flushGPU(ctx, q)
				}
			} else {
				settled, err := t.recompress(uint32(g), v)
				t.settle(uint32(g), v, settled, err)
			}
			took := time.Since(start) - onGPU
			t.busy.Add(int64(took))
			if busy += took; busy >= slice {
				pause := time.Duration(float64(busy) * (1 - t.cfg.CPU) / t.cfg.CPU)
				busy = 0
				select {
				case <-ctx.Done():
					return
				case <-time.After(pause):
				}
			}
		}
		if q := t.gpu.Load(); q != nil && len(q.queued) > 0 {
			start := time.Now()
			onGPU := t.flushGPU(ctx, q)
			t.busy.Add(int64(time.Since(start) - onGPU))
		}
		sweep()
	}
}

// settle marks group g, of age age, settled if it is (or its recompression
// failed: it is not tried again until it is accessed), unless it was
// accessed since.
func (t *Tier) settle(g, age uint32, settled bool, err error) {
	if err != nil {
		t.log.Error("dense tier: a group could not be recompressed", "page", g<<GroupShift, "err", err)
		settled = true
	}
	if settled {
		t.ages[g].CompareAndSwap(age, age|settledBit)
	}
}

// recompress moves group g, whose age was age, into the dense tier on the
// CPU: its stored pages decoded, compressed together, and committed if
// the group was not accessed meanwhile. It reports whether the group is
// settled (dense, or not worth it) rather than to be tried again.
func (t *Tier) recompress(g, age uint32) (settled bool, err error) {
	lo := g << GroupShift
	pages := int(min(GroupPages, t.pages-lo))
	if pages < 2 {
		return true, nil // an object has two pages at least
	}
	raw := t.raw[:pages*PageSize]
	stored, before, err := t.dev.Snapshot(g, pages, &t.snap, raw, nil)
	switch {
	case err != nil:
		return false, err
	case stored < 0: // a page is staged: its batch commits it soon
		return false, nil
	case stored == 0: // none, or as dense as it gets
		return true, nil
	}
	return t.commit(g, age, &t.snap, t.compress(raw, &t.snap, pages, before), before, stored)
}

// commit has the device store frames as group g's dense objects, if the
// group was not accessed since snap was taken at age age, and counts what
// came of it. It reports whether the group is settled.
func (t *Tier) commit(g, age uint32, snap *Snapshot, frames []Frame, before, stored int) (settled bool, err error) {
	c, total := t.dev.Commit(g, snap, frames, before, &t.ages[g], age)
	switch c {
	case Kept:
		t.kept.Add(1)
		return true, nil
	case Raced:
		t.raced.Add(1)
		return false, nil
	case Full:
		return false, nil
	}
	t.groups.Add(1)
	t.pagesIn.Add(uint64(stored))
	t.bytesIn.Add(uint64(before))
	t.bytesOut.Add(uint64(total))
	return true, nil
}
