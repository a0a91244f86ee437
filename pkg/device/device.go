// Package device is gzramd's block device: a table of 4 KiB pages, each
// empty, same-filled, compressed or stored raw, behind the nbd.Backend
// interface. Full-page writes go through the batcher; same-filled pages
// never reach a codec; partial writes, trims and write-zeroes read, modify
// and write their page under the page's lock.
package device

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/gzramd/gzramd/internal/freelist"
	"github.com/gzramd/gzramd/pkg/batch"
	"github.com/gzramd/gzramd/pkg/codec"
	"github.com/gzramd/gzramd/pkg/pagestore"
)

const pageSize = codec.PageSize

// DefaultHugeThreshold matches zram's huge_class_size for 4 KiB pages: a
// page whose compressed form is at least this long is stored raw, which
// costs little more memory and nothing to decode.
const DefaultHugeThreshold = 3264

// Config describes a device.
type Config struct {
	Size          int64 // bytes, a multiple of 4096
	Codec         codec.Codec
	Batcher       *batch.Batcher
	Store         *pagestore.Store
	HugeThreshold int // 0: DefaultHugeThreshold
	Logger        *slog.Logger
	// CorruptReads flips a byte in some pages served by reads. It exists
	// only so end-to-end tests can prove they notice corruption.
	CorruptReads bool
}

// nStripes trades lock memory for contention between unrelated pages.
const nStripes = 1024

type stripe struct {
	mu sync.RWMutex
	// pending tracks pages with batched writes in flight, so that a batch
	// finishing late never overwrites a newer write of the same page. A
	// stripe has a few at most (1024 stripes share the requests in
	// flight), and a short slice scanned is several times cheaper than a
	// map on every write's path.
	pending pendingList
	// fills holds the fill word of same-filled pages that are not zero.
	fills map[uint32]uint64
	// idle is signalled when a page's last batched write finishes, for a
	// read-modify-write waiting on it (L is mu).
	idle sync.Cond
}

type pendingWrite struct {
	idx       uint32
	inflight  uint32
	committed uint64 // sequence number of the write the page holds now
}

// pendingList is a stripe's pages with writes in flight, in no order.
type pendingList []pendingWrite

// find returns page idx's entry, or nil.
func (l pendingList) find(idx uint32) *pendingWrite {
	for i := range l {
		if l[i].idx == idx {
			return &l[i]
		}
	}
	return nil
}

// begin counts one more write of page idx in flight.
func (l *pendingList) begin(idx uint32) {
	if pw := l.find(idx); pw != nil {
		pw.inflight++
		return
	}
	*l = append(*l, pendingWrite{idx: idx, inflight: 1})
}

// remove drops pw, an entry of l.
func (l *pendingList) remove(pw *pendingWrite) {
	last := len(*l) - 1
	*pw = (*l)[last]
	*l = (*l)[:last]
}

// initialPending is each stripe's room for pages in flight before its
// list grows (and keeps what it grew to).
const initialPending = 4

// Device is safe for concurrent use.
type Device struct {
	cfg     Config
	log     *slog.Logger
	pages   uint32
	table   []entry // mmap'd: no pointers, no GC scanning, faulted in
	stripes []stripe
	seq     atomic.Uint64
	bufs    *freelist.List[*[pageSize]byte]

	storedPages, samePages, hugePages                atomic.Int64
	failedReads, failedWrites, invalidIO, notifyFree atomic.Uint64
	corruptCount                                     atomic.Uint64
}

// MaxSize is the largest device: the store tags objects with 32-bit page
// indexes up to pagestore.MaxOwner.
const MaxSize = int64(pagestore.MaxOwner+1) * pageSize

// New creates an empty device: every page reads as zeroes.
func New(cfg Config) (*Device, error) {
	switch {
	case cfg.Size <= 0 || cfg.Size%pageSize != 0:
		return nil, fmt.Errorf("device: size %d is not a positive multiple of %d", cfg.Size, pageSize)
	case cfg.Size > MaxSize:
		return nil, fmt.Errorf("device: size %d above the maximum %d", cfg.Size, MaxSize)
	case cfg.Codec == nil || cfg.Batcher == nil || cfg.Store == nil:
		return nil, errors.New("device: codec, batcher and store are required")
	}
	if cfg.HugeThreshold == 0 {
		cfg.HugeThreshold = DefaultHugeThreshold
	}
	if cfg.HugeThreshold < 1 || cfg.HugeThreshold > pageSize {
		return nil, fmt.Errorf("device: huge threshold %d out of range [1, %d]", cfg.HugeThreshold, pageSize)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	pages := cfg.Size / pageSize
	mem, err := unix.Mmap(-1, 0, int(pages*8), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		return nil, fmt.Errorf("device: mapping a page table of %d entries: %w", pages, err)
	}
	// The table is faulted in now, as zram allocates its own up front (8
	// bytes per 4 KiB page, 0.2 % of the device): a swap-out that lands on
	// a never-used part of the device must not fault in a page of table
	// while the kernel is out of free memory. A write per page, because
	// MAP_POPULATE does nothing under mlockall(MCL_ONFAULT) and a read
	// would map the shared zero page.
	for i := 0; i < len(mem); i += pageSize {
		mem[i] = 0
	}
	d := &Device{
		cfg:     cfg,
		log:     cfg.Logger,
		pages:   uint32(pages),
		table:   unsafe.Slice((*entry)(unsafe.Pointer(&mem[0])), pages),
		stripes: make([]stripe, nStripes),
	}
	pending := make([]pendingWrite, nStripes*initialPending)
	for i := range d.stripes {
		d.stripes[i].idle.L = &d.stripes[i].mu
		d.stripes[i].pending = pending[i*initialPending : i*initialPending : (i+1)*initialPending]
	}
	// Kept across collections (see freelist): partial-page requests take
	// one or two each.
	d.bufs = freelist.New(64, func() *[pageSize]byte {
		b := new([pageSize]byte)
		clear(b[:]) // written now, not first while serving
		return b
	})
	d.bufs.Fill()
	return d, nil
}

// Close frees the page table and every stored object. The device must not
// be used afterwards.
func (d *Device) Close() error {
	for i := range d.table {
		if e := d.table[i]; e.hasObject() {
			d.cfg.Store.Free(e.handle())
		}
	}
	mem := unsafe.Slice((*byte)(unsafe.Pointer(&d.table[0])), len(d.table)*8)
	d.table = nil
	return unix.Munmap(mem)
}

// Size implements nbd.Backend.
func (d *Device) Size() int64 { return d.cfg.Size }

func (d *Device) stripe(idx uint32) *stripe { return &d.stripes[idx%nStripes] }

func (d *Device) check(off, length int64) error {
	if off < 0 || length < 0 || off > d.cfg.Size || length > d.cfg.Size-off {
		d.invalidIO.Add(1)
		return fmt.Errorf("device: range [%d, +%d) outside the device: %w", off, length, syscall.EINVAL)
	}
	return nil
}

// forPages splits [off, off+length) into per-page pieces.
func forPages(off, length int64, fn func(idx uint32, in, n int) error) error {
	for length > 0 {
		idx := uint32(off / pageSize)
		in := int(off % pageSize)
		n := int(min(int64(pageSize-in), length))
		if err := fn(idx, in, n); err != nil {
			return err
		}
		off += int64(n)
		length -= int64(n)
	}
	return nil
}

// ReadAt implements nbd.Backend.
func (d *Device) ReadAt(_ context.Context, p []byte, off int64) error {
	if err := d.check(off, int64(len(p))); err != nil {
		return err
	}
	err := forPages(off, int64(len(p)), func(idx uint32, in, n int) error {
		dst := p[:n]
		p = p[n:]
		if n == pageSize {
			return d.readPage(idx, dst)
		}
		buf := d.bufs.Get()
		defer d.bufs.Put(buf)
		if err := d.readPage(idx, buf[:]); err != nil {
			return err
		}
		copy(dst, buf[in:])
		return nil
	})
	if err != nil {
		d.failedReads.Add(1)
	}
	return err
}

func (d *Device) readPage(idx uint32, dst []byte) error {
	s := d.stripe(idx)
	s.mu.RLock()
	err := d.load(s, idx, dst)
	if err == nil && d.cfg.CorruptReads && d.table[idx].hasObject() && d.corruptCount.Add(1)%64 == 0 {
		dst[idx%pageSize] ^= 0x5a
	}
	s.mu.RUnlock()
	return err
}

// load decodes page idx into dst; the caller holds the page's stripe lock.
func (d *Device) load(s *stripe, idx uint32, dst []byte) error {
	e := d.table[idx]
	switch e.state() {
	case stateEmpty:
		clear(dst)
	case stateSame:
		var w uint64
		if e&sameInSide != 0 {
			w = s.fills[idx]
		}
		fill(dst, w)
	case stateStored:
		if err := d.cfg.Codec.Decompress(dst, d.cfg.Store.Bytes(e.handle(), e.length())); err != nil {
			d.log.Error("stored page does not decode", "page", idx, "length", e.length(), "err", err)
			return fmt.Errorf("device: page %d: %w: %w", idx, err, syscall.EIO)
		}
	case stateHuge:
		copy(dst, d.cfg.Store.Bytes(e.handle(), pageSize))
	}
	return nil
}

// WriteAt implements nbd.Backend. It returns once every page is committed.
func (d *Device) WriteAt(ctx context.Context, p []byte, off int64, _ bool) error {
	if err := d.check(off, int64(len(p))); err != nil {
		return err
	}
	if len(p) == 0 {
		return nil
	}
	err := d.write(ctx, p, off)
	if err != nil {
		d.failedWrites.Add(1)
	}
	return err
}

func (d *Device) write(ctx context.Context, p []byte, off int64) error {
	// A partial first page.
	if in := int(off % pageSize); in != 0 || len(p) < pageSize {
		n := min(len(p), pageSize-in)
		if err := d.modify(uint32(off/pageSize), func(page []byte) { copy(page[in:], p[:n]) }); err != nil {
			return err
		}
		p, off = p[n:], off+int64(n)
	}
	// Whole pages: same-filled ones settle here, runs of the others go to
	// the batcher together.
	idx := uint32(off / pageSize)
	full := len(p) / pageSize
	for i := 0; i < full; {
		if w, ok := fillWord(p[i*pageSize : (i+1)*pageSize]); ok {
			d.writeSame(idx+uint32(i), w)
			i++
			continue
		}
		j := i + 1
		for j < full {
			if _, ok := fillWord(p[j*pageSize : (j+1)*pageSize]); ok {
				break
			}
			j++
		}
		if err := d.writeRun(ctx, idx+uint32(i), p[i*pageSize:j*pageSize]); err != nil {
			return err
		}
		i = j
	}
	// A partial last page.
	if rest := p[full*pageSize:]; len(rest) > 0 {
		return d.modify(idx+uint32(full), func(page []byte) { copy(page, rest) })
	}
	return nil
}

func (d *Device) writeSame(idx uint32, w uint64) {
	s := d.stripe(idx)
	s.mu.Lock()
	old := d.commitLocked(s, idx, d.seq.Add(1), d.sameLocked(s, idx, w))
	s.mu.Unlock()
	d.freeObject(old)
}

// writeRun compresses consecutive whole pages through the batcher and
// commits each as its batch completes.
func (d *Device) writeRun(ctx context.Context, first uint32, run []byte) error {
	n := len(run) / pageSize
	seq := d.seq.Add(1)
	for k := range n {
		idx := first + uint32(k)
		s := d.stripe(idx)
		s.mu.Lock()
		s.pending.begin(idx)
		old := d.table[idx]
		s.mu.Unlock()
		if old.hasObject() {
			d.cfg.Store.Prefetch(old.handle())
		}
	}
	// Pages are committed in order; finished counts those whose pending
	// write is over, so that even a panic in a commit (recovered by the
	// NBD server) leaves no page waiting on a write that will never end.
	finished := 0
	defer func() {
		for k := finished; k < n; k++ {
			d.finishPending(first+uint32(k), 0, 0)
		}
	}()
	_, err := d.cfg.Batcher.Compress(ctx, run, func(k int, compressed []byte) error {
		err := d.commitBatched(first+uint32(k), seq, compressed, run[k*pageSize:(k+1)*pageSize])
		finished = k + 1
		return err
	})
	return err
}

// commitBatched stores a batch result for page idx and installs it unless
// a newer write of the page committed first.
func (d *Device) commitBatched(idx uint32, seq uint64, compressed, raw []byte) error {
	state, obj := stateStored, compressed
	if len(compressed) == 0 || len(compressed) >= d.cfg.HugeThreshold {
		state, obj = stateHuge, raw
	}
	h, buf, err := d.cfg.Store.Alloc(len(obj), idx)
	if err != nil {
		d.finishPending(idx, 0, 0)
		return fmt.Errorf("device: storing page %d: %w", idx, err)
	}
	copy(buf, obj)
	old, applied := d.finishPending(idx, seq, objectEntry(state, h, len(obj)))
	if !applied {
		d.cfg.Store.Free(h) // a newer write won
	}
	d.freeObject(old)
	return nil
}

// finishPending ends one batched write of page idx. With seq > 0 it also
// installs e if no newer write has committed, returning the entry it
// replaced.
func (d *Device) finishPending(idx uint32, seq uint64, e entry) (old entry, applied bool) {
	s := d.stripe(idx)
	s.mu.Lock()
	defer s.mu.Unlock()
	pw := s.pending.find(idx)
	if pw == nil {
		// Every caller began a write of idx; without one, a bug elsewhere
		// must not become a panic in the daemon.
		d.log.Error("device: finishing a write of a page with none in flight", "page", idx)
		return 0, false
	}
	pw.inflight--
	if seq > pw.committed {
		pw.committed = seq
		old, applied = d.swapLocked(s, idx, e), true
	}
	if pw.inflight == 0 {
		s.pending.remove(pw)
		s.idle.Broadcast()
	}
	return old, applied
}

// commitLocked installs e for page idx as the write numbered seq, which is
// newer than any in flight.
func (d *Device) commitLocked(s *stripe, idx uint32, seq uint64, e entry) entry {
	if pw := s.pending.find(idx); pw != nil {
		pw.committed = seq
	}
	return d.swapLocked(s, idx, e)
}

// sameLocked returns the entry for a page filled with w, recording w.
func (d *Device) sameLocked(s *stripe, idx uint32, w uint64) entry {
	if w == 0 {
		return sameEntry(false)
	}
	if s.fills == nil {
		s.fills = make(map[uint32]uint64)
	}
	s.fills[idx] = w
	return sameEntry(true)
}

// swapLocked replaces page idx's entry and keeps the counters; the caller
// frees the old object once it has released the lock.
func (d *Device) swapLocked(s *stripe, idx uint32, e entry) entry {
	old := d.table[idx]
	d.table[idx] = e
	d.count(old, -1)
	d.count(e, +1)
	if old.state() == stateSame && old&sameInSide != 0 && !(e.state() == stateSame && e&sameInSide != 0) {
		delete(s.fills, idx)
	}
	return old
}

func (d *Device) count(e entry, delta int64) {
	switch e.state() {
	case stateSame:
		d.samePages.Add(delta)
	case stateStored:
		d.storedPages.Add(delta)
	case stateHuge:
		d.storedPages.Add(delta)
		d.hugePages.Add(delta)
	}
}

func (d *Device) freeObject(e entry) {
	if e.hasObject() {
		d.cfg.Store.Free(e.handle())
	}
}

// modify applies fn to page idx under its lock (read, modify, write) and
// compresses the result inline: partial writes are rare and must be atomic.
func (d *Device) modify(idx uint32, fn func(page []byte)) error {
	buf := d.bufs.Get()
	defer d.bufs.Put(buf)
	page := buf[:]
	s := d.stripe(idx)
	s.mu.Lock()
	// A batched write of this page still in flight would lose to this one
	// (it is older), taking the bytes this one does not cover with it:
	// wait for it to land and modify its result.
	for s.pending.find(idx) != nil {
		s.idle.Wait()
	}
	if err := d.load(s, idx, page); err != nil {
		s.mu.Unlock()
		return err
	}
	fn(page)
	var e entry
	if w, ok := fillWord(page); ok {
		e = d.sameLocked(s, idx, w)
	} else {
		out := d.bufs.Get()
		defer d.bufs.Put(out)
		n := d.cfg.Codec.Compress(out[:d.cfg.HugeThreshold-1], page)
		state, obj := stateStored, out[:n]
		if n == 0 {
			state, obj = stateHuge, page
		}
		h, dst, err := d.cfg.Store.Alloc(len(obj), idx)
		if err != nil {
			s.mu.Unlock()
			return fmt.Errorf("device: storing page %d: %w", idx, err)
		}
		copy(dst, obj)
		e = objectEntry(state, h, len(obj))
	}
	old := d.commitLocked(s, idx, d.seq.Add(1), e)
	s.mu.Unlock()
	d.freeObject(old)
	return nil
}

// discard sets every whole page of the range to e (empty or zero-filled)
// and zeroes the partial pages at its ends.
func (d *Device) discard(off, length int64, e entry) error {
	return forPages(off, length, func(idx uint32, in, n int) error {
		if n < pageSize {
			return d.modify(idx, func(page []byte) { clear(page[in : in+n]) })
		}
		s := d.stripe(idx)
		s.mu.Lock()
		if s.pending.find(idx) == nil && d.table[idx] == e {
			// Already so: leave the table's page untouched, so discarding
			// a never-written device does not fault its table in.
			s.mu.Unlock()
			return nil
		}
		old := d.commitLocked(s, idx, d.seq.Add(1), e)
		s.mu.Unlock()
		d.freeObject(old)
		return nil
	})
}

// Trim implements nbd.Backend: whole pages are freed, like zram's discard.
func (d *Device) Trim(_ context.Context, off, length int64) error {
	if err := d.check(off, length); err != nil {
		return err
	}
	d.notifyFree.Add(uint64(length / pageSize))
	return d.discard(off, length, entry(stateEmpty))
}

// WriteZeroes implements nbd.Backend. Zero pages cost no memory either
// way; with noHole they are kept as same-filled pages rather than freed.
func (d *Device) WriteZeroes(_ context.Context, off, length int64, noHole bool) error {
	if err := d.check(off, length); err != nil {
		return err
	}
	e := entry(stateEmpty)
	if noHole {
		e = sameEntry(false)
	}
	if err := d.discard(off, length, e); err != nil {
		d.failedWrites.Add(1)
		return err
	}
	return nil
}

// Flush implements nbd.Backend: every acknowledged write is already held.
func (d *Device) Flush(context.Context) error { return nil }

// Compact moves objects out of sparse slabs so whole slabs go back to the
// OS, and returns how many it moved.
func (d *Device) Compact() int {
	return d.cfg.Store.Compact(func(owner uint32, old, new pagestore.Handle) bool {
		if owner >= d.pages {
			return false
		}
		s := d.stripe(owner)
		s.mu.Lock()
		defer s.mu.Unlock()
		e := d.table[owner]
		if !e.hasObject() || e.handle() != old {
			return false
		}
		// The store copied the object before this lock was held, possibly
		// while a batch commit was still filling it; under the lock the
		// committed bytes are final, so copy again.
		copy(d.cfg.Store.Bytes(new, e.length()), d.cfg.Store.Bytes(old, e.length()))
		d.table[owner] = objectEntry(e.state(), new, e.length())
		return true
	})
}

// Stats are zram's statistics for the device (see zram.rst) plus error
// counters.
type Stats struct {
	OrigDataSize   int64 // bytes of pages held as objects (same-filled pages excluded)
	ComprDataSize  int64
	MemUsedTotal   int64
	MemLimit       int64
	MemUsedMax     int64
	SamePages      int64
	PagesCompacted int64
	HugePages      int64
	StoredPages    int64
	FailedReads    uint64
	FailedWrites   uint64
	InvalidIO      uint64
	NotifyFree     uint64
	// PrefaultMisses is the store's count of slab pages handed out before
	// its prefaulter touched them (pagestore.Stats.PrefaultMisses).
	PrefaultMisses int64
}

// Stats returns a snapshot of the counters.
func (d *Device) Stats() Stats {
	st := d.cfg.Store.Stats()
	return Stats{
		OrigDataSize:   d.storedPages.Load() * pageSize,
		ComprDataSize:  st.ComprDataSize,
		MemUsedTotal:   st.MemUsed,
		MemLimit:       st.MemLimit,
		MemUsedMax:     st.MemUsedMax,
		SamePages:      d.samePages.Load(),
		PagesCompacted: st.PagesCompacted,
		HugePages:      d.hugePages.Load(),
		StoredPages:    d.storedPages.Load(),
		FailedReads:    d.failedReads.Load(),
		FailedWrites:   d.failedWrites.Load(),
		InvalidIO:      d.invalidIO.Load(),
		NotifyFree:     d.notifyFree.Load(),
		PrefaultMisses: st.PrefaultMisses,
	}
}

// fillWord reports whether page repeats one 8-byte word, and which.
func fillWord(page []byte) (uint64, bool) {
	words := unsafe.Slice((*uint64)(unsafe.Pointer(&page[0])), len(page)/8)
	w := words[0]
	for _, x := range words[1:] {
		if x != w {
			return 0, false
		}
	}
	return w, true
}

func fill(dst []byte, w uint64) {
	if w == 0 {
		clear(dst)
		return
	}
	words := unsafe.Slice((*uint64)(unsafe.Pointer(&dst[0])), len(dst)/8)
	for i := range words {
		words[i] = w
	}
}
