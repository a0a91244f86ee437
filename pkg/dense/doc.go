// Package dense is the dense tier of a device: groups of pages left idle,
// recompressed as zstd frames.
//
// Pages the kernel swapped out and has not touched since are mostly never
// read again: they are worth their CPU once more, to be kept denser. The
// device sees every access and tells the tier (Tier.Touch), so the tier
// knows which groups of GroupPages pages have been idle for Config.After,
// and its recompressor (Tier.Run) decodes such a group and compresses it
// again with more effort, as frames of FramePages adjacent pages, each
// stored by the device as an object of several pages whose entries carry
// the dense bit. Pages compressed together gain what a larger window and
// one set of entropy tables find across them: on the shared corpus, zstd
// over 16 KiB at level 9 stores 17 % more than zstd -1 over single pages,
// and 69 % more than LZ4.
//
// A frame is small and one block, so that a read of a page idle this long
// (the one a user coming back faults on) decodes 16 KiB at most: the
// frames of 64 KiB this tier wrote first stored as much at level 3 but
// took twice as long to read, and their reads were 18x an LZ4 page's
// decode (bench/results/dense-frames-cpu-2026-11-28.md). The GPU still
// writes a frame a group (Tier.SetGPU), and objects of either shape are
// read alike, so a device written by an earlier build is taken over as
// it is.
//
// A page of the group written, trimmed or zeroed leaves its object as it
// leaves any object, into the fast tier; the object goes with its last
// page.
//
// Nothing of the tier is in the device's files beyond its objects and
// entries: idle ages start again at zero in a process that takes the
// device over, so a takeover delays recompression by one threshold.
//
// # Ownership
//
// A Tier owns the policy: which groups are idle (their ages), the CPU
// budget (Config.CPU), the GPU's batch and its queue, the frames' layout
// (FramePages) and their zstd level, and the tier's counters. The device
// owns the page table, its locks, the entries and the store: the tier
// reaches them only through Device, to snapshot a group and to commit its
// frames if the group is unchanged. The tier's memory (Tier.HeldBytes)
// is made with it, and its batch on the GPU with SetGPU.
//
// The files: tier.go the Tier, its ages and counters; run.go the
// recompressor's loop on the CPU; frames.go the frames' layout; gpu.go
// the GPU's batch; table.go the interface to the device.
package dense
