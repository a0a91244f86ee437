// The page table's memory: which of its pages are faulted in, and the
// thread that faults them in ahead of the writes that need them.

package device

import (
	"errors"
	"iter"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gzramd/gzramd/internal/memfd"
	"github.com/gzramd/gzramd/internal/osthread"
)

// entriesPerPage is the entries a page of table holds: a page of table
// covers 2 MiB of device.
const (
	entriesPerPage = pageSize / 8
	entryPageShift = 9
)

// tableAhead is the pages of table (2 MiB of device each) kept faulted in
// beyond the furthest a write has reached. The kernel hands swap out in
// clusters of 1 or 2 MiB, each CPU taking the next free one, and clusters
// freed go to the back of the free list: swap reaches the never-used part
// of the device in the free list's order. Since Linux 6.18 that is the
// device's order, and the table follows the part of the device swap has
// used. Before, swapon shuffled the list so that one free cluster is 64
// MiB after the one before (SWAP_CLUSTER_COLS): swap's first pass over
// the device then moves its reach 64 MiB a cluster, within the 128 MiB
// that 64 pages of table (256 KiB) keep ahead, and faults the whole table
// in once it has used one cluster in 64.
const tableAhead = 64

// tableRetry is how long the thread waits to try again after it failed to
// fault pages of table in (the kernel was out of memory).
const tableRetry = 100 * time.Millisecond

// backing says which pages of the table are faulted in, and has a thread
// (gzramd-table) fault in those ahead of the writes. A page of table
// reads as empty entries until it is: a read or a scan never faults one
// in. A write beyond what the thread faulted in faults its page in itself
// (late, counted): a swap-out into a part of the device swap never used
// must not need memory the kernel may be waiting on that very write to
// free, so the thread keeps tableAhead pages of table ahead of the writes.
//
// The table's pages are never given back while a process maps them:
// swap reuses the clusters it freed once it has used every other, and a
// write there would then fault. The table grows with the part of the
// device written, to 8 bytes per page of the device at most, as zram's is
// from the start.
type backing struct {
	mem   []byte          // the table's mapping
	pages uint32          // pages of table
	held  []atomic.Uint64 // a bit per page of table faulted in
	count atomic.Int64    // pages of table faulted in
	// front is the first page of table not faulted in: those below it
	// all are (the thread's progress).
	front atomic.Uint32
	// reach is one past the furthest page of table written within
	// tableAhead of front: the thread keeps front at reach+tableAhead.
	// Writes further out (late) do not move it, as a random write far
	// out would have the thread fault in the whole table.
	reach atomic.Uint32
	late  atomic.Uint64 // pages of table writes faulted in themselves

	wake, stop, done chan struct{}
}

// newBacking returns the backing of table, mapped at mem from the file f,
// which holds the pages of table written so far (none when fresh).
func newBacking(mem []byte, table []entry, f *memfd.File) (*backing, error) {
	b := &backing{mem: mem, pages: uint32((len(mem) + pageSize - 1) / pageSize)}
	b.held = make([]atomic.Uint64, (b.pages+63)/64)
	err := f.Extents(func(off, n int64) bool {
		for p := off / pageSize; p < min((off+n+pageSize-1)/pageSize, int64(b.pages)); p++ {
			b.mark(uint32(p))
		}
		return true
	})
	if err != nil {
		return nil, err
	}
	front := b.heldFrom(0)
	b.front.Store(front)
	// Where the last process's writes reached: the pages of table it
	// faulted in ahead of them hold only empty entries.
	reach := uint32(0)
	for i := min(len(table), int(front)*entriesPerPage) - 1; i >= 0; i-- {
		if table[i] != 0 {
			reach = uint32(i>>entryPageShift) + 1
			break
		}
	}
	b.reach.Store(reach)
	return b, nil
}

// heldFrom returns the first page of table from p on not faulted in (or
// the table's end).
func (b *backing) heldFrom(p uint32) uint32 {
	for p < b.pages && b.has(p) {
		p++
	}
	return p
}

// has reports whether page of table p is faulted in.
func (b *backing) has(p uint32) bool { return b.held[p/64].Load()&(1<<(p%64)) != 0 }

// mark records page of table p as faulted in, and reports whether it was
// not before.
func (b *backing) mark(p uint32) bool {
	bit := uint64(1) << (p % 64)
	if b.held[p/64].Or(bit)&bit != 0 {
		return false
	}
	b.count.Add(1)
	return true
}

// bytes is the memory of the table's pages faulted in.
func (b *backing) bytes() int64 { return b.count.Load() * pageSize }

// written records a write to page idx's entry, which the caller has just
// stored under the page's stripe lock, faulting its page of table in
// where that was not held before: such a page is late, and a write
// reaching further than any before wakes the thread.
func (b *backing) written(idx uint32, held bool) {
	p := idx >> entryPageShift
	if !held && b.mark(p) {
		b.late.Add(1)
	}
	front := b.front.Load()
	if p >= front+tableAhead {
		return // far out: not where swap goes next
	}
	for {
		r := b.reach.Load()
		if p < r {
			return
		}
		if b.reach.CompareAndSwap(r, p+1) {
			break
		}
	}
	select {
	case b.wake <- struct{}{}:
	default:
	}
}

// faultAhead faults in the pages of table between front and
// reach+tableAhead that are not yet, and moves front past them.
func (b *backing) faultAhead() error {
	want := min(b.reach.Load()+tableAhead, b.pages)
	for front := b.front.Load(); front < want; {
		end := min(front+16, want)
		lo, hi := int(front)*pageSize, min(int(end)*pageSize, len(b.mem))
		if err := populate(b.mem[lo:hi]); err != nil {
			return err
		}
		for p := front; p < end; p++ {
			b.mark(p)
		}
		front = b.heldFrom(end)
		b.front.Store(front)
	}
	return nil
}

// populate faults mem in for writing (which makes the kernel allocate its
// pages now, not at the first write), or reports why it could not.
func populate(mem []byte) error {
	err := unix.Madvise(mem, unix.MADV_POPULATE_WRITE)
	if errors.Is(err, unix.EINVAL) { // before Linux 5.14
		memfd.Populate(mem)
		return nil
	}
	return err
}

// start faults in the first pages of table ahead, then starts the thread
// that keeps them ahead.
func (b *backing) start() error {
	if err := b.faultAhead(); err != nil {
		return err
	}
	b.wake, b.stop, b.done = make(chan struct{}, 1), make(chan struct{}), make(chan struct{})
	go osthread.Run("gzramd-table", b.run)
	return nil
}

func (b *backing) run() {
	defer close(b.done)
	retry := time.NewTimer(0)
	retry.Stop()
	for {
		select {
		case <-b.stop:
			return
		case <-b.wake:
		case <-retry.C:
		}
		if err := b.faultAhead(); err != nil {
			retry.Reset(tableRetry)
		}
	}
}

// close stops the thread, if it was started, and waits for it: it touches
// the table, which is unmapped next.
func (b *backing) close() {
	if b.stop == nil {
		return
	}
	close(b.stop)
	<-b.done
	b.stop = nil
}

// runs yields the runs of entries [lo, hi) of a table of n entries whose
// pages are faulted in: the entries a scan reads, the rest being empty.
func (b *backing) runs(n uint32) iter.Seq2[uint32, uint32] {
	return func(yield func(uint32, uint32) bool) {
		for p := uint32(0); p < b.pages; p++ {
			if !b.has(p) {
				continue
			}
			end := b.heldFrom(p)
			if !yield(p*entriesPerPage, min(end*entriesPerPage, n)) {
				return
			}
			p = end
		}
	}
}
