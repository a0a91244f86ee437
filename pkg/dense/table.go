// The device's side of the tier: snapshot a group, commit its frames.

package dense

import "sync/atomic"

// Device is what the tier asks of the device whose groups it
// recompresses. The recompressor's goroutine alone calls it, one group at
// a time.
type Device interface {
	// Snapshot copies the entries of the first pages pages of group g
	// into snap and decodes its stored pages into raw (the others as
	// zeroes, which cost a zstd frame nothing), but for its compressed
	// pages where packed is not nil: those it copies there as they are
	// stored, for a GPU that decodes them itself;
	// all under the group's lock. It returns the stored pages and the
	// bytes they take in the store: 0 pages where the group is as dense
	// as it gets (all in dense objects, or in one zstd object over the
	// whole group, which recompressing would only make again), -1 where
	// a page is staged (its batch commits it soon).
	Snapshot(g uint32, pages int, snap *Snapshot, raw []byte, packed *PackedPages) (stored, before int, err error)
	// Commit stores frames, the pages of group g compressed again, as
	// the group's dense objects, if together they are smaller than the
	// before bytes its stored pages took and if, under the group's
	// lock, nothing wrote to the group since snap was taken (no entry
	// changed, no write counted in snap.Writes) and idle still holds age
	// (an access zeroes a group's age before it changes an entry). It
	// returns what came of it and, when Committed, the bytes the objects
	// take.
	Commit(g uint32, snap *Snapshot, frames []Frame, before int, idle *atomic.Uint32, age uint32) (Commit, int)
	// Swept is told, after a sweep over the groups, that the tier
	// committed or kept groups since it was last told: their pages have
	// left the slabs the device writes new pages to, and what it keeps
	// there for reuse may go back.
	Swept()
}

// Snapshot is a group's entries as Device.Snapshot found them.
type Snapshot struct {
	// Entries are the page table's, opaque to the tier.
	Entries [GroupPages]uint64
	// Stored has bit k set where page k is held in the store as data:
	// the pages a dense object takes in.
	Stored uint32
	// Writes is the device's count of writes to the group's pages (or
	// more) as it took the snapshot, opaque to the tier.
	Writes uint64
}

// PackedPages is where Device.Snapshot leaves a group's compressed pages
// (LZ4 blocks or zstd frames, as the device's codec writes them) as they
// are stored: packed from At, each page's offset and length (0 for a page
// it decoded).
type PackedPages struct {
	Packed        []byte
	At            int
	Offsets, Lens []uint32
}

// Commit is what came of Device.Commit.
type Commit int

const (
	// Committed: the frames replace the group's stored pages.
	Committed Commit = iota
	// Kept: the frames were not smaller, or could not be stored as
	// objects; the group stays as it is.
	Kept
	// Raced: the group was accessed meanwhile; the frames are dropped.
	Raced
	// Full: the store had no room; the group is tried again later.
	Full
)
