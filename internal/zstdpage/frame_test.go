package zstdpage

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"sort"
	"testing"

	kzstd "github.com/klauspost/compress/zstd"
)

// features lists the format paths a frame takes, read from its headers:
// block type, literals type and size format, Huffman tree description,
// sequence-count size and each symbol type's table mode.
func features(frame []byte) ([]string, error) {
	if len(frame) < 11 || !bytes.Equal(frame[:7], []byte{0x28, 0xB5, 0x2F, 0xFD, 0x60, 0x00, 0x0F}) {
		return nil, fmt.Errorf("bad frame header % x", frame[:min(len(frame), 7)])
	}
	bh := uint32(frame[7]) | uint32(frame[8])<<8 | uint32(frame[9])<<16
	if bh&1 == 0 {
		return nil, fmt.Errorf("block not last")
	}
	switch (bh >> 1) & 3 {
	case 1:
		return []string{"block:rle"}, nil
	case 2:
	default:
		return nil, fmt.Errorf("block type %d", (bh>>1)&3)
	}
	if int(bh>>3) != len(frame)-10 {
		return nil, fmt.Errorf("block size %d, frame %d", bh>>3, len(frame))
	}
	f := []string{"block:compressed"}
	b := frame[10:]
	lt, sf := b[0]&3, (b[0]>>2)&3
	var lsz int
	switch lt {
	case 0, 1:
		var n, h int
		switch sf {
		case 0, 2:
			n, h = int(b[0]>>3), 1
		case 1:
			n, h = int(b[0]>>4)|int(b[1])<<4, 2
		case 3:
			n, h = int(b[0]>>4)|int(b[1])<<4|int(b[2])<<12, 3
		}
		f = append(f, fmt.Sprintf("lit:%s-hdr%d", []string{"raw", "rle"}[lt], h))
		lsz = h + 1
		if lt == 0 {
			lsz = h + n
		}
	case 2:
		var h, comp int
		switch sf {
		case 0:
			h, comp = 3, int(uint32(b[0])|uint32(b[1])<<8|uint32(b[2])<<16)>>14
			f = append(f, "lit:huf-1stream")
		case 2:
			h, comp = 4, int((uint32(b[0])|uint32(b[1])<<8|uint32(b[2])<<16|uint32(b[3])<<24)>>18)
			f = append(f, "lit:huf-4streams")
		default:
			return nil, fmt.Errorf("literals size format %d", sf)
		}
		if b[h] < 128 {
			f = append(f, "huf:fse-weights")
		} else {
			f = append(f, "huf:direct-weights")
		}
		lsz = h + comp
	default:
		return nil, fmt.Errorf("literals type %d", lt)
	}
	s := b[lsz:]
	switch {
	case s[0] == 0:
		f = append(f, "seq:none")
		return f, nil
	case s[0] < 128:
		f = append(f, "seq:count1")
		s = s[1:]
	default:
		f = append(f, "seq:count2")
		s = s[2:]
	}
	for k, name := range []string{"ll", "of", "ml"} {
		f = append(f, name+":"+[]string{"predefined", "rle", "fse", "repeat"}[(s[0]>>(6-2*k))&3])
	}
	return f, nil
}

// decodeKlauspost decodes with a second, independent decoder.
func decodeKlauspost(frame []byte) ([]byte, error) {
	d, err := kzstd.NewReader(nil, kzstd.WithDecoderConcurrency(1))
	if err != nil {
		return nil, err
	}
	defer d.Close()
	return d.DecodeAll(frame, nil)
}

// TestPaths checks that the test pages take every path of the format the
// encoder can emit, and that a second decoder (klauspost/compress) also
// decodes each frame.
func TestPaths(t *testing.T) {
	seen := map[string]int{}
	pages := edgePages()
	var all [][]byte
	for _, name := range sortedNames(pages) {
		all = append(all, pages[name])
	}
	r := rand.New(rand.NewPCG(5, 6))
	for k := 0; k < 200; k++ {
		all = append(all, randomPage(r))
	}
	buf := make([]byte, PageSize)
	for _, page := range all {
		for _, opts := range variants {
			n := Compress(buf, page, opts)
			if n == 0 {
				seen["stored-raw"]++
				continue
			}
			fs, err := features(buf[:n])
			if err != nil {
				t.Fatalf("opts %+v: %v", opts, err)
			}
			for _, f := range fs {
				seen[f]++
			}
			got, err := decodeKlauspost(buf[:n])
			if err != nil || !bytes.Equal(got, page) {
				t.Fatalf("opts %+v: klauspost/compress does not decode the %d-byte frame to the page: %v", opts, n, err)
			}
		}
	}
	var keys []string
	for k := range seen {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		t.Logf("%-22s %d", k, seen[k])
	}
	// RLE literals never occur: a byte value first seen in a page is a
	// literal, so a page with literals of one value is one byte repeated,
	// an RLE block.
	for _, want := range []string{"stored-raw", "block:rle", "block:compressed", "lit:raw-hdr1", "lit:raw-hdr2",
		"lit:huf-1stream", "lit:huf-4streams", "huf:fse-weights", "huf:direct-weights", "seq:none", "seq:count1", "seq:count2",
		"ll:predefined", "ll:rle", "ll:fse", "of:predefined", "of:rle", "of:fse", "ml:predefined", "ml:rle", "ml:fse"} {
		if seen[want] == 0 {
			t.Errorf("no test page takes path %s", want)
		}
	}
}

// execute rebuilds a page from sequences and the page's literals as RFC
// 8878 3.1.2 executes them, repeat offsets included; it returns the
// offset-value kinds used.
func execute(t *testing.T, page []byte, seqs []sequence) map[string]int {
	t.Helper()
	kinds := map[string]int{}
	rep := [3]int{1, 4, 8}
	out := make([]byte, 0, PageSize)
	pos := 0
	for i, s := range seqs {
		if s.ml < 3 || s.of < 1 || pos+s.ll+s.ml > PageSize {
			t.Fatalf("sequence %d: %+v at %d", i, s, pos)
		}
		out = append(out, page[pos:pos+s.ll]...)
		pos += s.ll
		var off int
		switch {
		case s.of > 3:
			off = s.of - 3
			rep = [3]int{off, rep[0], rep[1]}
			kinds["offset"]++
		case s.ll > 0:
			off = rep[s.of-1]
			switch s.of {
			case 2:
				rep = [3]int{off, rep[0], rep[2]}
			case 3:
				rep = [3]int{off, rep[0], rep[1]}
			}
			kinds[fmt.Sprintf("rep%d", s.of)]++
		default:
			switch s.of {
			case 1:
				off = rep[1]
				rep = [3]int{off, rep[0], rep[2]}
			case 2:
				off = rep[2]
				rep = [3]int{off, rep[0], rep[1]}
			case 3:
				off = rep[0] - 1
				rep = [3]int{off, rep[0], rep[1]}
			}
			kinds[fmt.Sprintf("rep%d-ll0", s.of)]++
		}
		if off < 1 || off > len(out) {
			t.Fatalf("sequence %d: offset %d with %d bytes out", i, off, len(out))
		}
		for k := 0; k < s.ml; k++ {
			out = append(out, out[len(out)-off])
		}
		pos += s.ml
	}
	out = append(out, page[pos:]...)
	if !bytes.Equal(out, page) {
		t.Fatalf("sequences do not rebuild the page")
	}
	return kinds
}

// TestRepeatOffsets checks the parse against an independent sequence
// executor and that every kind of repeat code occurs (those after no
// literals included).
func TestRepeatOffsets(t *testing.T) {
	r := rand.New(rand.NewPCG(9, 10))
	pages := edgePages()
	var all [][]byte
	for _, name := range sortedNames(pages) {
		all = append(all, pages[name])
	}
	// Pages built to need each repeat code after no literals: runs of
	// copies at offsets d, d-1 (rep1 - 1), and two alternating offsets.
	for k := 0; k < 20; k++ {
		p := make([]byte, PageSize)
		for i := range p {
			p[i] = byte(r.Uint32())
		}
		for pos := 600; pos+64 < PageSize; pos += 200 {
			d := 100 + r.IntN(300)
			ds := []int{d, d - 1, d + 50, d, d + 50}
			q := pos
			for _, off := range ds {
				n := 8 + r.IntN(8)
				for i := 0; i < n; i++ {
					p[q+i] = p[q+i-off]
				}
				q += n
			}
		}
		all = append(all, p)
	}
	for k := 0; k < 200; k++ {
		all = append(all, randomPage(r))
	}
	total := map[string]int{}
	for _, page := range all {
		for _, opts := range variants {
			for k, v := range execute(t, page, parse(page, opts)) {
				total[k] += v
			}
		}
	}
	t.Logf("offset kinds: %v", total)
	for _, want := range []string{"offset", "rep1", "rep2", "rep3", "rep1-ll0", "rep2-ll0", "rep3-ll0"} {
		if total[want] == 0 {
			t.Errorf("no sequence uses %s", want)
		}
	}
}
