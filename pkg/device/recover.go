// Taking over a device whose files another process wrote.

package device

import (
	"errors"
	"fmt"

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
	var rep Recovered
	if cfg.Files == nil {
		return nil, nil, rep, errors.New("device: Recover needs Config.Files")
	}
	cfg.Store = nil
	d, err := open(cfg, false)
	if err != nil {
		return nil, nil, rep, err
	}
	stagingPages := len(d.staging) / pageSize
	lose := func(idx uint32) {
		d.table[idx] = entry(stateLost << stateShift)
		if rep.Lost == 0 {
			rep.FirstLost = idx
		}
		rep.Lost++
	}
	// Only Keep's bookkeeping, which Done alone writes back, changes
	// until every entry is known good.
	var bad int
	var firstBad error
	parts, dense := false, false
	var aliases []alias
	for i := range d.table {
		idx, e := uint32(i), d.table[i]
		var err error
		switch e.state() {
		case stateEmpty:
		case stateSame:
			if e != zeroEntry {
				err = fmt.Errorf("a same-filled entry %#x with stray bits", uint64(e))
			}
		case stateStored, stateHuge, stateFill:
			if !validLength(e) {
				err = fmt.Errorf("an object of %d bytes in state %d", e.length(), e.state())
			} else {
				err = rc.Keep(e.handle(), idx, e.length())
			}
		case stateStaged:
			if e.stagingPage() >= stagingPages {
				err = fmt.Errorf("staging page %d of %d", e.stagingPage(), stagingPages)
			}
		case stateLost: // lost in an earlier takeover, until written again
		case statePart:
			err = d.keepPart(rc, idx, e, &aliases)
			parts = true
			dense = dense || e.dense()
		default:
			err = fmt.Errorf("state %d, which no device writes", e.state())
		}
		if err != nil {
			if bad == 0 {
				firstBad = fmt.Errorf("page %d: %w", idx, err)
			}
			bad++
		}
	}
	if bad > 0 {
		d.unmap()
		return nil, nil, rep, fmt.Errorf("device: %d entries of the page table disagree with the store, the first at %w: %w",
			bad, firstBad, ErrCorrupt)
	}
	for _, a := range aliases {
		d.table[a.idx] = a.to
	}
	for _, e := range d.table {
		d.count(e, +1)
	}
	if parts && d.obj.scratches == nil {
		d.holdObjects() // the process before kept objects of several pages
	}
	if dense {
		if err := d.obj.holdZstd(); err != nil { // and some in the dense tier
			d.unmap()
			return nil, nil, rep, err
		}
	}
	store, err := rc.Done()
	if err != nil {
		d.unmap()
		return nil, nil, rep, err
	}
	d.cfg.Store, d.obj.store = store, store
	// Staged pages were acknowledged: store them whatever the limit says,
	// as the process that took them would have.
	limit := store.Stats().MemLimit
	store.SetMemLimit(0)
	for i := range d.table {
		idx, e := uint32(i), d.table[i]
		if e.state() != stateStaged {
			continue
		}
		page := d.staging[e.stagingPage()*pageSize:][:pageSize]
		if err := d.write(page, int64(idx)*pageSize); err != nil {
			d.log.Error("device: a staged page could not be stored while taking the device over; it is lost",
				"page", idx, "err", err)
			d.count(e, -1)
			lose(idx)
			d.count(d.table[idx], +1)
			continue
		}
		rep.Staged++
	}
	store.SetMemLimit(limit)
	rep.Stored, rep.Same = d.storedPages.Load(), d.samePages.Load()
	if err := d.startStaging(); err != nil {
		d.Close()
		store.Close()
		return nil, nil, rep, err
	}
	return d, store, rep, nil
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
func (d *Device) keepPart(rc *pagestore.Recovery, idx uint32, e entry, aliases *[]alias) error {
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
		f := d.table[i]
		if f.state() != statePart || f.handle() != e.handle() {
			continue
		}
		if f.partPages() != pages || f.length() != e.length() || i-uint32(f.partIndex()) != owner || f.dense() != e.dense() {
			return fmt.Errorf("page %d of object %#x, which page %d names otherwise", k, e.handle(), i)
		}
		for j := len(*aliases) - 1; j >= 0 && (*aliases)[j].idx >= lo; j-- {
			if a := (*aliases)[j]; a.idx == i { // a copy: pointed at the same object as page i
				*aliases = append(*aliases, alias{idx, e.withHandle(a.to.handle())})
			}
		}
		return nil
	}
	first := rc.Bytes(e.handle(), e.length())
	for i := lo; i < idx; i++ {
		f := d.table[i]
		if f.state() != statePart || f.handle() == e.handle() || f.partPages() != pages ||
			f.length() != e.length() || i-uint32(f.partIndex()) != owner || f.dense() != e.dense() {
			continue
		}
		if other := rc.Bytes(f.handle(), f.length()); other != nil && first != nil && string(other) == string(first) {
			*aliases = append(*aliases, alias{idx, e.withHandle(f.handle())})
			return nil
		}
	}
	if err := rc.Keep(e.handle(), owner, e.length()); err != nil {
		return err
	}
	l, err := d.obj.header(first, e)
	if err != nil {
		return fmt.Errorf("object %#x: %w", e.handle(), err)
	}
	for c := 1; c < l.chunks; c++ {
		if err := rc.Keep(chunkHandle(first, c), owner, l.chunkLen(c)); err != nil {
			return err
		}
	}
	d.obj.packedObjects.Add(1)
	d.obj.packedChunks.Add(int64(l.chunks))
	if e.dense() {
		d.obj.denseObjects.Add(1)
		d.obj.denseBytes.Add(int64(l.total))
	}
	return nil
}
