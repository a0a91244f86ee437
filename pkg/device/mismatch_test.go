package device

import (
	"bytes"
	"fmt"
	"hash/maphash"
	"strings"
)

// pageHistory keeps the last contents of each page of a worker's region,
// as hashes, so that a read that differs from the model can say what it
// read instead: an older version of the page, another page's, zeroes, or
// bytes the worker never wrote.
type pageHistory struct {
	seed     maphash.Seed
	versions [][historyDepth]pageVersion // by page of the region, newest first
}

const historyDepth = 8

type pageVersion struct {
	sum uint64
	op  int    // the op that left the page so; -1: before the first
	how string // what it did: "write", "trim" or "zeroes"
}

func newPageHistory(pages int) *pageHistory {
	h := &pageHistory{seed: maphash.MakeSeed(), versions: make([][historyDepth]pageVersion, pages)}
	zero := maphash.Bytes(h.seed, make([]byte, pageSize))
	for i := range h.versions {
		for k := range h.versions[i] {
			h.versions[i][k] = pageVersion{sum: zero, op: -1}
		}
	}
	return h
}

// record notes the model's pages touched by op, which did how, over
// [off, off+n) of the region, whose model is region.
func (h *pageHistory) record(region []byte, off, n int64, op int, how string) {
	for pg := off / pageSize; pg*pageSize < off+n; pg++ {
		v := &h.versions[pg]
		copy(v[1:], v[:historyDepth-1])
		v[0] = pageVersion{sum: maphash.Bytes(h.seed, region[pg*pageSize:(pg+1)*pageSize]), op: op, how: how}
	}
}

// describe says, for each page of a read of [off, off+len(got)) of the
// region whose model is region that differs from it, which bytes differ,
// the page's entry now, and what the bytes read are. base is the
// region's offset in the device.
func (h *pageHistory) describe(f *fixture, region, got []byte, base, off int64) string {
	var b strings.Builder
	for at := int64(0); at < int64(len(got)); {
		pg := (off + at) / pageSize
		end := min(int64(len(got)), (pg+1)*pageSize-off)
		g, w := got[at:end], region[off+at:off+end]
		at = end
		if bytes.Equal(g, w) {
			continue
		}
		first, n := -1, 0
		for i := range g {
			if g[i] != w[i] {
				n++
				if first < 0 {
					first = i
				}
			}
		}
		idx := uint32((base + pg*pageSize) / pageSize)
		fmt.Fprintf(&b, "\n\tpage %d (group %d, page %d of it): %d of %d bytes differ, the first at %d; entry %s; read %s; its last versions:",
			idx, idx>>groupShift, idx&(groupPages-1), n, len(g), int(off%pageSize)+first, f.dev.describeEntry(idx), h.identify(region, got, off, pg, g))
		for _, v := range h.versions[pg] {
			if v.op >= 0 {
				fmt.Fprintf(&b, " op %d %s;", v.op, v.how)
			}
		}
	}
	return b.String()
}

// identify says what g, the bytes read of page pg, are: for a whole
// page, the version of the page (or of another page of the region) they
// match, if any.
func (h *pageHistory) identify(region, got []byte, off, pg int64, g []byte) string {
	switch {
	case isFilled(g, 0):
		return "zeroes"
	case isFilled(g, 0xee):
		return "nothing (the buffer as it was)"
	case len(g) != pageSize:
		return "bytes of a partial page"
	}
	sum := maphash.Bytes(h.seed, g)
	for p := range h.versions {
		for k, v := range h.versions[p] {
			if v.sum != sum {
				continue
			}
			if int64(p) == pg {
				return fmt.Sprintf("the page as it was %d versions ago (op %d)", k, v.op)
			}
			return fmt.Sprintf("page %d of the region as it was %d versions ago (op %d)", p, k, v.op)
		}
	}
	return "bytes the page never held in its last versions"
}

func isFilled(p []byte, c byte) bool {
	return bytes.Count(p, []byte{c}) == len(p)
}

// describeEntry is page idx's entry, read under its lock, in words.
func (d *Device) describeEntry(idx uint32) string {
	s := d.stripe(idx)
	s.mu.RLock()
	e := d.table[idx]
	s.mu.RUnlock()
	names := [...]string{"empty", "same", "stored", "huge", "staged", "fill", "lost", "part"}
	desc := fmt.Sprintf("%s %#x", names[e.state()], uint64(e))
	switch e.state() {
	case statePart:
		desc += fmt.Sprintf(" (page %d of %d, object %#x, first chunk %d bytes, dense %t)",
			e.partIndex(), e.partPages(), e.handle(), e.length(), e.dense())
	case stateStored, stateHuge, stateFill:
		desc += fmt.Sprintf(" (object %#x of %d bytes)", e.handle(), e.length())
	}
	return desc
}
