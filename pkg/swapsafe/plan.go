// What the daemon holds ahead of need so that serving swap never
// allocates or faults: sized here for the machine, listed as holdings.

package swapsafe

// Plan sizes what the daemon reserves at start, in one place: the memory
// and threads that the path storing a swapped-out page uses, made and
// written before the kernel can be short of memory.
type Plan struct {
	// HeapReserve is Go heap faulted in and kept (ReserveHeap): request
	// buffers, goroutine stacks and the runtime's own allocations come
	// from it instead of from fresh memory. It costs about twice its
	// size in all (the serving process keeps it free above the heap and
	// faults in the heap's free gaps; a standby gives its own back until
	// it takes over, HeapReserve.GiveBack).
	// 4 MiB. TestServingDoesNotFault (two connections, 32 requests in
	// flight each, beside two busy loops) once told sizes apart: 450
	// runs of 450 passed with 8 MiB, 99 of 100 with 4, 61 of 100 with 2.
	// Since TopUp faults in the heap's growth before its next collection
	// and keeps it released (c63ed8d), it passes with any: 180 of 180
	// with 4 MiB and 120 of 120 with 2 (with the zstd and takeover
	// variants), so the reserve is now only the room above the heap for
	// a span larger than its gaps, and 4 MiB is twice the largest
	// request buffer.
	HeapReserve int64
	// Threads is how many threads are started before serving
	// (ReserveThreads): enough for every request that can be in a
	// system call or in C at once, beside those running Go code.
	Threads int
	// ConnBuffers is the payload buffer memory each NBD connection keeps
	// resident (nbd.Options.ReserveBuffers): 32 requests of the largest
	// size the kernel device sends, which is also the bound the kernel
	// is held to (max_sectors_kb).
	ConnBuffers int64
	// Prefault is the default of --prefault: store memory faulted in
	// ahead of use, 16 MiB but at most 1/32 of RAM, where the memory held
	// ahead competes with the memory swap frees.
	Prefault int64
}

// PlanFor is the plan for a machine of ram bytes and cpus CPUs whose NBD
// requests are at most maxRequest bytes.
func PlanFor(ram int64, cpus int, maxRequest int64) Plan {
	p := Plan{
		HeapReserve: 4 << 20,
		Threads:     16 + 4*cpus,
		ConnBuffers: 32 * maxRequest,
		Prefault:    16 << 20,
	}
	if ram > 0 {
		p.Prefault = min(p.Prefault, ram/32&^(1<<20-1))
	}
	return p
}

// Holding is something the daemon holds ahead of need, for the reports
// (the start-up log, /status, gzramd_held_bytes): what, how much, and why.
type Holding struct {
	Name  string `json:"name"`
	Bytes int64  `json:"bytes"`
	Count int    `json:"count,omitempty"` // for threads
	Why   string `json:"why"`
}
