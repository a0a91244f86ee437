// The write path: same-filled pages, staged or inline runs, and read-modify-write of partial pages.

package device

import (
	"context"
	"fmt"
)

// WriteAt implements blockdev.Backend. It returns once every page is held:
// committed, or staged.
func (d *Device) WriteAt(_ context.Context, p []byte, off int64, _ bool) error {
	if err := d.check(off, int64(len(p))); err != nil {
		return err
	}
	if len(p) == 0 {
		return nil
	}
	d.dense.Touch(off, int64(len(p)))
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
	ref := d.swapLocked(s, idx, e)
	s.mu.Unlock()
	d.obj.free(ref)
	return nil
}

// writeRun stores consecutive whole pages that are not same-filled: staged
// when the router says so and staging has room, else compressed inline.
func (d *Device) writeRun(first uint32, run []byte) error {
	n := len(run) / pageSize
	d.cfg.Router.Count(n)
	staging := d.stager != nil && d.cfg.Router.Stage(n)
	for done := 0; done < n; {
		if staging {
			if k := d.stager.stageRun(first+uint32(done), run[done*pageSize:]); k > 0 {
				done += k
				continue
			}
		}
		k := min(n-done, inlinePages)
		if err := d.inline.write(first+uint32(done), run[done*pageSize:(done+k)*pageSize]); err != nil {
			return err
		}
		done += k
	}
	return nil
}

// modify applies fn to page idx under its lock (read, modify, write) and
// compresses the result inline: partial writes are rare and must be atomic.
func (d *Device) modify(idx uint32, fn func(page []byte)) error {
	// The scratch before the lock: writers holding scratch take page
	// locks, and must not wait for one held by a writer waiting for
	// scratch.
	w := <-d.inline.writes
	defer func() { d.inline.writes <- w }()
	sc := d.obj.scratch()
	defer d.obj.putScratch(sc)
	buf := d.bufs.Get()
	defer d.bufs.Put(buf)
	page := buf[:]
	s := d.stripe(idx)
	s.mu.Lock()
	if err := d.load(idx, page, sc, 0); err != nil {
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
		state, obj := d.obj.alone(b, 0, page)
		b.Pages = nil
		h, dst, err := d.cfg.Store.Alloc(len(obj), idx)
		if err != nil {
			s.mu.Unlock()
			return fmt.Errorf("device: storing page %d: %w", idx, err)
		}
		copy(dst, obj)
		e = handleEntry(state, h, len(obj))
	}
	ref := d.swapLocked(s, idx, e)
	s.mu.Unlock()
	d.obj.free(ref)
	return nil
}
