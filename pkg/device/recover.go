// Taking over a device whose files another process wrote.

package device

import (
	"errors"
	"fmt"
	"log/slog"

	"github.com/gzramd/gzramd/pkg/pagestore"
)

// ErrCorrupt: the files taken over hold a page table the store does not
// back; they are left as they were.
var ErrCorrupt = errors.New("the page table does not match the page store (the state is corrupt); it was left untouched")

// Recovered says what Recover found in the table.
type Recovered struct {
	Stored int64 // pages held compressed or raw in the store
	Same   int64 // same-filled pages
	Staged int64 // pages left staged, compressed and stored by Recover
	// Lost pages: staged pages Recover could not store (the store failed
	// to take them). Each reads as EIO until written again.
	Lost int64
	// FirstLost is the first lost page, for the log; valid when Lost > 0.
	FirstLost uint32
}

// Recover takes over the device in cfg.Files, written by a device of the
// same size whose store rc is recovering, after the process serving it
// died. Every object the table names is kept (rc.Keep) and the store
// rebuilt around them (rc.Done); pages left staged are compressed and
// stored from the staging file before staging starts again, as writes.
// Every write the dead process acknowledged was in the table or staged, so
// all of them read back.
//
// The table and the store must agree on every page: an entry naming a
// slot outside the arenas, an object tagged for another page or size, a
// staging page beyond the staging file, or a state no device writes means
// the files are not what a device of this layout left, and Recover refuses
// them (ErrCorrupt, naming the first such page and counting them) before
// anything in them changes, so they can be examined or tried again.
// cfg.Store is ignored: Recover returns the store it rebuilt, which the
// caller closes after the device.
func Recover(cfg Config, rc *pagestore.Recovery) (*Device, *pagestore.Store, Recovered, error) {
	if cfg.Files == nil {
		return nil, nil, Recovered{}, errors.New("device: Recover needs Config.Files")
	}
	cfg.Store = nil
	d, err := open(cfg, false)
	if err != nil {
		return nil, nil, Recovered{}, err
	}
	r := &recovery{t: &d.pageTable, obj: &d.obj, staging: d.staging, rc: rc, log: d.log}
	store, err := r.adopt(d.holdObjects)
	if err != nil {
		d.unmap()
		return nil, nil, r.rep, err
	}
	d.cfg.Store = store
	r.storeStaged(store, d.write)
	if d.stager, err = newStager(d.cfg, &d.pageTable, &d.obj, d.staging, d.writeFilled); err != nil {
		d.Close()
		store.Close()
		return nil, nil, r.rep, err
	}
	return d, store, r.rep, nil
}

// recovery is Recover's work on the table another process left: it checks
// every entry against the store being recovered, names the objects they
// keep to it, and stores the pages left staged. It lives for one Recover
// and owns what it finds (rep, aliases). It is given the page table, which
// no other goroutine uses yet, the objects, whose format it checks and
// which it points at the rebuilt store, the staging area, the store's
// recovery and the log; the two device operations it needs once
// (Device.holdObjects, Device.write) are passed to the steps that call them.
type recovery struct {
	t       *pageTable
	obj     *objects
	staging []byte
	rc      *pagestore.Recovery
	log     *slog.Logger
	rep     Recovered
	// aliases are entries rewritten once every entry is known good
	// (keepPart).
	aliases []alias
	// parts and dense say whether entries name objects of several
	// pages, and of the dense tier: the process before kept some.
	parts, dense bool
}

// adopt checks every entry of the table, and once all are known good,
// counts them, readies the device for the objects they name (holdObjects
// where there are objects of several pages) and rebuilds the store around
// those (rc.Done), which the objects are pointed at. Until then only
// Keep's bookkeeping, which Done alone writes back, changes.
func (r *recovery) adopt(holdObjects func()) (*pagestore.Store, error) {
	var bad int
	var firstBad error
	for i, e := range r.t.entries() {
		if err := r.check(i, e); err != nil {
			if bad == 0 {
				firstBad = fmt.Errorf("page %d: %w", i, err)
			}
			bad++
		}
	}
	if bad > 0 {
		return nil, fmt.Errorf("device: %d entries of the page table disagree with the store, the first at %w: %w",
			bad, firstBad, ErrCorrupt)
	}
	for _, a := range r.aliases {
		r.t.table[a.idx] = a.to
	}
	for _, e := range r.t.entries() {
		r.t.count(e, +1)
	}
	if r.parts && r.obj.scratches == nil {
		holdObjects()
	}
	if r.dense {
		if err := r.obj.holdZstd(); err != nil {
			return nil, err
		}
	}
	store, err := r.rc.Done()
	if err != nil {
		return nil, err
	}
	r.obj.store = store
	return store, nil
}

// check checks the entry e of page idx against the store, and keeps the
// object it names (rc.Keep).
func (r *recovery) check(idx uint32, e entry) error {
	switch e.state() {
	case stateEmpty:
	case stateSame:
		if e != zeroEntry {
			return fmt.Errorf("a same-filled entry %#x with stray bits", uint64(e))
		}
	case stateStored, stateHuge, stateFill:
		if !validLength(e) {
			return fmt.Errorf("an object of %d bytes in state %d", e.length(), e.state())
		}
		return r.rc.Keep(e.handle(), idx, e.length())
	case stateStaged:
		if n := len(r.staging) / pageSize; e.stagingPage() >= n {
			return fmt.Errorf("staging page %d of %d", e.stagingPage(), n)
		}
	case stateLost: // lost in an earlier takeover, until written again
	case statePart:
		r.parts = true
		r.dense = r.dense || e.dense()
		return r.keepPart(idx, e)
	default:
		return fmt.Errorf("state %d, which no device writes", e.state())
	}
	return nil
}

// storeStaged stores the pages left staged with write (the device's), as
// writes, whatever the memory limit says: they were acknowledged, and the
// process that took them would have. A page the store fails to take is
// lost.
func (r *recovery) storeStaged(store *pagestore.Store, write func(p []byte, off int64) error) {
	limit := store.Stats().MemLimit
	store.SetMemLimit(0)
	for idx, e := range r.t.entries() {
		if e.state() != stateStaged {
			continue
		}
		page := r.staging[e.stagingPage()*pageSize:][:pageSize]
		if err := write(page, int64(idx)*pageSize); err != nil {
			r.log.Error("device: a staged page could not be stored while taking the device over; it is lost",
				"page", idx, "err", err)
			r.lose(idx, e)
			continue
		}
		r.rep.Staged++
	}
	store.SetMemLimit(limit)
	r.rep.Stored, r.rep.Same = r.t.storedPages.Load(), r.t.samePages.Load()
}

// lose marks page idx, whose entry is e, lost: it reads as EIO until
// written again.
func (r *recovery) lose(idx uint32, e entry) {
	r.t.count(e, -1)
	r.t.table[idx] = entry(stateLost << stateShift)
	r.t.count(r.t.table[idx], +1)
	if r.rep.Lost == 0 {
		r.rep.FirstLost = idx
	}
	r.rep.Lost++
}

// validLength reports whether an object entry's length is one a device
// writes for its state (with any huge threshold: the last process may
// have had another).
func validLength(e entry) bool {
	switch e.state() {
	case stateStored:
		return e.length() >= 1 && e.length() < pageSize
	case stateHuge:
		return e.length() == pageSize
	case stateFill:
		return e.length() == fillLength
	}
	return false
}

// String summarises r for a log line.
func (r Recovered) String() string {
	s := fmt.Sprintf("%d pages stored, %d same-filled, %d staged (now stored)", r.Stored, r.Same, r.Staged)
	if r.Lost > 0 {
		s += fmt.Sprintf(", %d LOST (first: page %d)", r.Lost, r.FirstLost)
	}
	return s
}

// alias is an entry Recover rewrites once every entry is known good.
type alias struct {
	idx uint32
	to  entry
}

// keepPart checks the entry of page idx, part of an object of several
// pages, and names the object's chunks to rc, once: at the object's first
// page in the table.
//
// The compactor moves an object's first chunk by copying it and then
// pointing the object's pages at the copy, one entry at a time: a process
// killed in between leaves pages of one object naming two first chunks,
// alike byte for byte, that name the same other chunks. The copy that
// the later pages name is not kept: they are pointed at the other
// (aliases, applied once every entry is known good).
func (r *recovery) keepPart(idx uint32, e entry) error {
	rc, table := r.rc, r.t.table
	k, pages := e.partIndex(), e.partPages()
	if pages < 2 || k >= pages || e.length() < headerFixed || e.length() > chunkSize {
		return fmt.Errorf("page %d of an object of %d pages whose first chunk is %d bytes", k, pages, e.length())
	}
	owner := idx - uint32(k)
	lo := idx &^ (groupPages - 1)
	if owner < lo {
		return fmt.Errorf("page %d of an object of %d pages that would start in the group before", k, pages)
	}
	for i := lo; i < idx; i++ {
		f := table[i]
		if f.state() != statePart || f.handle() != e.handle() {
			continue
		}
		if f.partPages() != pages || f.length() != e.length() || i-uint32(f.partIndex()) != owner || f.dense() != e.dense() {
			return fmt.Errorf("page %d of object %#x, which page %d names otherwise", k, e.handle(), i)
		}
		for j := len(r.aliases) - 1; j >= 0 && r.aliases[j].idx >= lo; j-- {
			if a := r.aliases[j]; a.idx == i { // a copy: pointed at the same object as page i
				r.aliases = append(r.aliases, alias{idx, e.withHandle(a.to.handle())})
			}
		}
		return nil
	}
	first := rc.Bytes(e.handle(), e.length())
	for i := lo; i < idx; i++ {
		f := table[i]
		if f.state() != statePart || f.handle() == e.handle() || f.partPages() != pages ||
			f.length() != e.length() || i-uint32(f.partIndex()) != owner || f.dense() != e.dense() {
			continue
		}
		if other := rc.Bytes(f.handle(), f.length()); other != nil && first != nil && string(other) == string(first) {
			r.aliases = append(r.aliases, alias{idx, e.withHandle(f.handle())})
			return nil
		}
	}
	if err := rc.Keep(e.handle(), owner, e.length()); err != nil {
		return err
	}
	l, err := r.obj.header(first, e)
	if err != nil {
		return fmt.Errorf("object %#x: %w", e.handle(), err)
	}
	for c := 1; c < l.chunks; c++ {
		if err := rc.Keep(chunkHandle(first, c), owner, l.chunkLen(c)); err != nil {
			return err
		}
	}
	r.obj.packedObjects.Add(1)
	r.obj.packedChunks.Add(int64(l.chunks))
	if e.dense() {
		r.obj.denseObjects.Add(1)
		r.obj.denseBytes.Add(int64(l.total))
	}
	return nil
}
