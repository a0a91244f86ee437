// Package pagestore keeps allocations of up to one page (compressed pages)
// in slabs carved from large arenas outside the Go heap, so millions of
// stored pages cost the garbage collector nothing. Allocations are named by
// integer handles that pack slab and cell.
//
// The arenas and the slab records live in two memfds (Files), mapped
// shared: a process given them takes the store over with Recover, after
// the one that wrote them died.
//
// # Layout
//
// Allocations fall in 256 size classes 16 bytes apart; the last holds raw
// 4096-byte pages. Each Lifetime has classes of its own, so that
// allocations that live long (the dense tier's frames, AllocBatch(Long,
// ...)) never share a slab with pages as swapped out: a dense pass frees
// the pages it packed, and their slabs empty whole rather than stay pinned
// by the frames written among them (on the shared corpus aged on the CPU,
// the store held 36 % more than after Compact with one set of classes,
// and 6 % more with two; the dense tier moves the groups it keeps as they
// are into long-lived slabs too, and drops the short-lived classes'
// cached slabs after a pass, DropCaches, which leaves Compact nothing). A class's slabs are runs of 1 to 161 pages, the fewest
// that leave at most 0.5% of the slab unused at its tail, cut into cells of
// the class's size, one allocation each. A slab starts
// with a 5-byte tag per cell (the owner that Compact reports, and how far
// the allocation falls short of the class size, so that Free knows its size);
// a free cell's tag holds the next free cell instead, so the free list
// costs nothing. Each slab has a 32-byte record in the slab file.
// Metadata per allocation is thus the 5-byte tag plus
// a share of a slab record: 6 to 7 bytes for compressed pages.
//
// # Accounting
//
// Memory is counted as the kernel holds it: a slab's pages count from the
// first allocation that reaches into them (untouched pages cost nothing),
// or, with a prefaulter, all of them from its first allocation, for they
// were faulted in whole ahead of it, as zsmalloc's pages count whole in
// zram's mem_used_total; and an empty slab's pages go back by punching a
// hole in the arena file. So MemUsed is what zram calls mem_used_total and
// matches the resident pages of the arenas, less those faulted ahead.
// Arenas refuse transparent huge pages so that one touched allocation
// does not fault in 2 MiB. The only memory held beyond the allocations'
// pages is one emptied slab of at most two pages per class, kept so that
// a class whose last allocation comes and goes does not fault pages in and
// out each time; Compact, DropCaches and the memory limit take those back.
//
// The memory limit is checked whenever a slab reaches into a new page, so
// an Alloc that fails with ErrFull leaves everything as it was.
//
// # Compaction
//
// Compact picks in each class the sparsest slabs whose allocations fit in the
// free cells of the others, stops new allocations going into them, and moves
// their allocations out one at a time, asking the owner (through relocate,
// called with no lock held) to switch its reference. A slab is given back
// once empty. Then the sparsest slab left is packed: its top allocations move
// into the others' free cells and its own lowest ones, and the pages above
// them go back. What remains free is about two pages per class, so after
// trimming a random half of the shared corpus and compacting, the store
// holds 97% of what the codec's ratio allows.
//
// With a prefaulter, no allocation faults store memory in: a writer
// storing a swapped-out page must not wait on reclaim, which may wait on
// that very write. The pages a trim gave back are cold, so the slab takes
// allocations into its free cells only, and waits off the partial list
// when it has none. Nor does a writer take a slab given back whole: it
// carves a new one from the pages faulted ahead, and the prefaulter faults
// a released one in again for each, for the class's next (warmReleased),
// so that a compaction that gave many back costs the writers no fault. It
// never maps an arena. Past the pages faulted ahead it waits for the
// prefaulter, with its class's lock let go, and fails with
// ErrNotPrefaulted where the thread makes nothing ready within
// PrefaultWait (prefault.go).
//
// An owner that fills allocations after Alloc returns, outside the lock it
// takes in relocate, must copy the allocation again inside relocate (see
// Store.Compact).
package pagestore
