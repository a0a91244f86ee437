// The write path: same-filled pages, staged or inline runs, and read-modify-write of partial pages.

package device

import (
	"context"
	"fmt"

	"github.com/gzramd/gzramd/pkg/codec"
	"github.com/gzramd/gzramd/pkg/pagestore"
)

// inlinePages bounds the pages a write compresses in its own goroutine at
// a time, and so the scratch memory each such write holds.
const inlinePages = 32

// inlineWrite is the scratch of one write compressed in its own goroutine.
type inlineWrite struct {
	batch   *codec.Batch // outputs; Pages is the request's own buffer
	sizes   [inlinePages]int
	owners  [inlinePages]uint32
	handles [inlinePages]pagestore.Handle
	olds    [inlinePages]pagestore.Handle
}

func newInlineWrite(limit int) *inlineWrite {
	b := &codec.Batch{
		Out:     make([]byte, inlinePages*pageSize),
		Offsets: make([]uint32, inlinePages),
		Lens:    make([]uint32, inlinePages),
		Limit:   limit,
	}
	clear(b.Out) // written now, not first while serving
	return &inlineWrite{batch: b}
}

// WriteAt implements nbd.Backend. It returns once every page is held:
// committed, or staged.
func (d *Device) WriteAt(_ context.Context, p []byte, off int64, _ bool) error {
	if err := d.check(off, int64(len(p))); err != nil {
		return err
	}
	if len(p) == 0 {
		return nil
	}
	err := d.write(p, off)
	if err != nil {
		d.failedWrites.Add(1)
	}
	return err
}

func (d *Device) write(p []byte, off int64) error {
	// A partial first page.
	if in := int(off % pageSize); in != 0 || len(p) < pageSize {
		n := min(len(p), pageSize-in)
		if err := d.modify(uint32(off/pageSize), func(page []byte) { copy(page[in:], p[:n]) }); err != nil {
			return err
		}
		p, off = p[n:], off+int64(n)
	}
	// Whole pages: same-filled ones settle here, runs of the others are
	// staged or compressed together.
	idx := uint32(off / pageSize)
	full := len(p) / pageSize
	for i := 0; i < full; {
		if w, ok := fillWord(p[i*pageSize : (i+1)*pageSize]); ok {
			if err := d.writeFilled(idx+uint32(i), w); err != nil {
				return err
			}
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
		if err := d.writeRun(idx+uint32(i), p[i*pageSize:j*pageSize]); err != nil {
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

// writeFilled writes page idx filled with the word w.
func (d *Device) writeFilled(idx uint32, w uint64) error {
	e, err := d.fillEntry(idx, w)
	if err != nil {
		return err
	}
	s := d.stripe(idx)
	s.mu.Lock()
	old := d.swapLocked(s, idx, e)
	s.mu.Unlock()
	d.freeObject(old)
	return nil
}

// writeRun stores consecutive whole pages that are not same-filled: staged
// when the router says so and staging has room, else compressed inline.
func (d *Device) writeRun(first uint32, run []byte) error {
	n := len(run) / pageSize
	d.cfg.Router.Count(n)
	staging := d.stage != nil && d.cfg.Router.Stage(n)
	for done := 0; done < n; {
		if staging {
			if k := d.stageRun(first+uint32(done), run[done*pageSize:]); k > 0 {
				done += k
				continue
			}
		}
		k := min(n-done, inlinePages)
		if err := d.writeInline(first+uint32(done), run[done*pageSize:(done+k)*pageSize]); err != nil {
			return err
		}
		done += k
	}
	return nil
}

// writeInline compresses up to inlinePages whole pages in the caller's
// goroutine, stores them, and commits each. A write that the memory limit
// refuses changes nothing.
func (d *Device) writeInline(first uint32, pages []byte) error {
	w := <-d.inline
	defer func() { d.inline <- w }()
	n := len(pages) / pageSize
	// The tags of the objects these pages replace are read when they are
	// freed; they are cold (random pages of the store), so ask for them
	// now, to arrive while the pages compress.
	for j := range n {
		idx := first + uint32(j)
		s := d.stripe(idx)
		s.mu.RLock()
		old := d.table[idx]
		s.mu.RUnlock()
		if old.hasObject() {
			d.cfg.Store.Prefetch(old.handle())
		}
	}
	b := w.batch
	b.Pages, b.N = pages, n
	defer func() { b.Pages = nil }()
	d.cfg.Router.CompressInline(b)
	for j := range n {
		_, obj := d.object(b, j, pages[j*pageSize:(j+1)*pageSize])
		w.sizes[j], w.owners[j] = len(obj), first+uint32(j)
	}
	if k, _, err := d.cfg.Store.AllocBatch(w.sizes[:n], w.owners[:n], w.handles[:n], 0); err != nil {
		d.cfg.Store.FreeBatch(w.handles[:k])
		return fmt.Errorf("device: storing pages %d-%d: %w", first, first+uint32(n)-1, err)
	}
	for j := range n {
		state, obj := d.object(b, j, pages[j*pageSize:(j+1)*pageSize])
		copy(d.cfg.Store.Bytes(w.handles[j], len(obj)), obj)
		idx := first + uint32(j)
		s := d.stripe(idx)
		s.mu.Lock()
		old := d.swapLocked(s, idx, objectEntry(state, w.handles[j], len(obj)))
		s.mu.Unlock()
		w.olds[j] = 0
		if old.hasObject() {
			w.olds[j] = old.handle()
		}
	}
	d.cfg.Store.FreeBatch(w.olds[:n])
	return nil
}

// object returns how page i of b, whose raw bytes are raw, is stored: its
// compressed bytes, or raw when it did not compress below the huge
// threshold.
func (d *Device) object(b *codec.Batch, i int, raw []byte) (state int, obj []byte) {
	c := b.Compressed(i)
	if len(c) == 0 || len(c) >= d.cfg.HugeThreshold {
		return stateHuge, raw
	}
	return stateStored, c
}

// modify applies fn to page idx under its lock (read, modify, write) and
// compresses the result inline: partial writes are rare and must be atomic.
func (d *Device) modify(idx uint32, fn func(page []byte)) error {
	// The scratch before the lock: writers holding scratch take page
	// locks, and must not wait for one held by a writer waiting for
	// scratch.
	w := <-d.inline
	defer func() { d.inline <- w }()
	buf := d.bufs.Get()
	defer d.bufs.Put(buf)
	page := buf[:]
	s := d.stripe(idx)
	s.mu.Lock()
	if err := d.load(s, idx, page); err != nil {
		s.mu.Unlock()
		return err
	}
	fn(page)
	var e entry
	if fw, ok := fillWord(page); ok {
		var err error
		if e, err = d.fillEntry(idx, fw); err != nil {
			s.mu.Unlock()
			return err
		}
	} else {
		b := w.batch
		b.Pages, b.N = page, 1
		d.cfg.Router.CompressInline(b)
		state, obj := d.object(b, 0, page)
		b.Pages = nil
		h, dst, err := d.cfg.Store.Alloc(len(obj), idx)
		if err != nil {
			s.mu.Unlock()
			return fmt.Errorf("device: storing page %d: %w", idx, err)
		}
		copy(dst, obj)
		e = objectEntry(state, h, len(obj))
	}
	old := d.swapLocked(s, idx, e)
	s.mu.Unlock()
	d.freeObject(old)
	return nil
}
