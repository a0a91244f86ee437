// The frames' layout: which pages a frame takes, compressed on the CPU.

package dense

import "github.com/gzramd/gzramd/pkg/codec"

const (
	// GroupPages is the pages of a group, the unit the tier ages and
	// recompresses: the most pages of an object of several pages.
	GroupPages = 16
	// GroupShift is log2 of GroupPages.
	GroupShift = 4
	// PageSize is the device's page.
	PageSize = codec.PageSize
	// FramePages is the most pages of a frame the CPU writes: 16 KiB,
	// one block, the smallest frame that stores about what the 64 KiB
	// frames did with more effort
	// (bench/results/dense-frames-cpu-2026-11-28.md).
	FramePages = 4
	// MaxFrames is the most frames of a group.
	MaxFrames = GroupPages / FramePages
	// defaultLevel is the frames' zstd level by default. Over 16 KiB
	// frames of the shared corpus (same-filled pages in), level 5 stores
	// 4.03 at 137 MB/s of a core, 0.9 % less than level 3 stored over 64
	// KiB frames, at 2.6 times its CPU; 4 stores 1.7 % less than 5 at
	// 178 MB/s, 6 0.3 % more at 86 MB/s, and 9 1 % more at 31 MB/s
	// (--dense-level).
	defaultLevel = 5
)

var _ [GroupPages - 1<<GroupShift]struct{} // GroupShift is log2 of GroupPages
var _ [1<<GroupShift - GroupPages]struct{}

// Frame is one frame of a group's dense objects: its pages from the
// group's page First, and its bytes.
type Frame struct {
	First, Pages int
	Data         []byte
}

// compress compresses the group's pages pages in raw on the CPU, as frames
// of FramePages pages (framePages) into the tier's stream, and returns the
// frames, none for pages of which none is stored, or nil where they would
// not come out smaller than before bytes together.
func (t *Tier) compress(raw []byte, snap *Snapshot, pages, before int) []Frame {
	frames := t.frames[:0]
	end := min(len(t.stream), before)
	at := 0
	for first, n := 0, 0; first < pages; first += n {
		n = framePages(first, pages)
		if snap.Stored>>first&(1<<n-1) == 0 {
			continue
		}
		if at >= end {
			return nil
		}
		size := t.comp.Compress(t.stream[at:end], raw[first*PageSize:(first+n)*PageSize])
		if size <= 0 {
			return nil
		}
		frames = append(frames, Frame{First: first, Pages: n, Data: t.stream[at : at+size]})
		at += size
	}
	return frames
}

// framePages is the pages of the frame that begins at page first of a
// group of pages pages: FramePages, fewer at the group's end, and one
// fewer where a single page would be left after it (an object has two
// pages at least; a group of one page is not recompressed).
func framePages(first, pages int) int {
	n := min(FramePages, pages-first)
	if pages-first-n == 1 && n > 2 {
		n--
	}
	return n
}
