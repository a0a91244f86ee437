// What the daemon holds ahead of need for swap safety, listed for the reports.

package serving

import "github.com/gzramd/gzramd/pkg/swapsafe"

// connBuffers is the payload buffer memory each NBD connection keeps
// resident (nbd.Options.ReserveBuffers) when the daemon is hardened for
// swap; no request waits for others (with the GPU, writes are staged), so
// requests finish one by one and 32 in flight per connection suffice.
func connBuffers(cfg *Config) int64 {
	if !cfg.Harden {
		return 0
	}
	return cfg.Plan.ConnBuffers
}

// holdings lists what the daemon holds ahead of need (docs/DESIGN.md,
// "Swap safety"): the data path's, the GPU's, the NBD server's, the ublk
// device's, and the hardening's.
func (rp reporter) holdings() []swapsafe.Holding {
	d := rp.d
	hs := d.pipe.Holdings()
	if g, _, _ := d.accel.current(); g != nil {
		hs = append(hs, swapsafe.Holding{Name: "gpu-slots", Bytes: g.BayBytes(),
			Why: "each GPU stream's metadata (the offsets and lengths the device writes back), pinned (--batch-inflight)"})
	}
	if n := connBuffers(d.cfg); n > 0 {
		hs = append(hs, swapsafe.Holding{Name: "nbd-buffers", Bytes: n,
			Why: "payload buffers each NBD connection keeps resident, written at its handshake, and as many workers: per connection"})
	}
	if u := d.ublk.current(); u != nil {
		hs = append(hs, swapsafe.Holding{Name: "ublk-buffers", Bytes: int64(u.dev.Queues) * int64(u.dev.MaxIOBytes),
			Why: "each ublk queue's data buffer, written before it serves: a queue serves one request at a time"})
	}
	if d.reserve != nil {
		why := "Go heap faulted in and kept, and locked with the rest of the heap by gzramd-heaplock"
		if !d.lockHeap {
			why = "Go heap faulted in and kept (not locked: mlockall did not take)"
		}
		hs = append(hs,
			swapsafe.Holding{Name: "heap-reserve", Bytes: d.reserve.Bytes(), Why: why},
			swapsafe.Holding{Name: "threads", Count: d.cfg.Plan.Threads,
				Why: "threads started before serving, each with its signal stack written"})
	}
	return hs
}

// logHoldings writes one line per holding and their total, at start.
func (rp reporter) logHoldings() {
	var total int64
	for _, h := range rp.holdings() {
		total += h.Bytes
		attrs := []any{"what", h.Name, "bytes", h.Bytes, "why", h.Why}
		if h.Count > 0 {
			attrs = []any{"what", h.Name, "count", h.Count, "why", h.Why}
		}
		rp.d.log.Info("holding for swap safety", attrs...)
	}
	rp.d.log.Info("held ahead of need in all", "bytes", total)
}
