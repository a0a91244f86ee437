// Package batchtest holds what the tests of batch compressors (the GPU,
// the router) share: varied pages, poisoned outputs, and the check that a
// batch's results decode to its pages, with gzramd's decoder and liblz4.
package batchtest

import (
	"bytes"
	"math/rand/v2"
	"testing"

	"github.com/gzramd/gzramd/internal/lz4oracle"
	"github.com/gzramd/gzramd/pkg/codec"
)

// Pages returns n pages mixing text-like, zero, patterned and random
// content.
func Pages(n int, seed uint64) []byte {
	r := rand.New(rand.NewPCG(seed, 1))
	words := []string{"page ", "swap ", "kernel ", "memory ", "gzramd ", "compress ", "0x7f3a ", "{\"id\": ", "null, "}
	out := make([]byte, 0, n*codec.PageSize)
	for i := range n {
		p := make([]byte, codec.PageSize)
		switch i % 5 {
		case 0:
			for j := 0; j < len(p); {
				j += copy(p[j:], words[r.IntN(len(words))])
			}
		case 1: // zeros
		case 2:
			for j := range p {
				p[j] = byte(j % 48)
			}
		case 3:
			for j := range p {
				p[j] = byte(r.Uint32())
			}
		case 4:
			p[r.IntN(len(p))] = byte(1 + r.IntN(255))
		}
		out = append(out, p...)
	}
	return out
}

// Verify checks that every page of b decodes (or is raw) to want,
// with the CPU codec's LZ4 decoder and, when the oracle is built in, with
// liblz4.
func Verify(t testing.TB, b *codec.Batch, want []byte) {
	t.Helper()
	VerifyWith(t, b, want, codec.NewLZ4())
	if !lz4oracle.Available {
		return
	}
	page := make([]byte, codec.PageSize)
	for i := range b.N {
		if c := b.Compressed(i); c != nil {
			orig := want[i*codec.PageSize : (i+1)*codec.PageSize]
			if err := lz4oracle.Decompress(page, c); err != nil || !bytes.Equal(page, orig) {
				t.Fatalf("page %d: does not decode with liblz4 (err %v)", i, err)
			}
		}
	}
}

// VerifyWith checks that every page of b decodes with dec (or is raw) to
// want.
func VerifyWith(t testing.TB, b *codec.Batch, want []byte, dec codec.Codec) {
	t.Helper()
	page := make([]byte, codec.PageSize)
	for i := range b.N {
		orig := want[i*codec.PageSize : (i+1)*codec.PageSize]
		c := b.Compressed(i)
		if c == nil {
			if !bytes.Equal(b.Page(i), orig) {
				t.Fatalf("page %d: raw page differs from the original", i)
			}
			continue
		}
		if len(c) >= codec.PageSize {
			t.Fatalf("page %d: compressed length %d not below a page", i, len(c))
		}
		if err := dec.Decompress(page, c); err != nil {
			t.Fatalf("page %d: %s: %v", i, dec.Name(), err)
		}
		if !bytes.Equal(page, orig) {
			t.Fatalf("page %d: %s round trip differs", i, dec.Name())
		}
	}
}

// Poison fills b's outputs with bytes no compressor writes, so that a
// result left unwritten shows.
func Poison(b *codec.Batch) {
	for i := range b.Out {
		b.Out[i] = 0xA5
	}
	for i := range b.Lens {
		b.Lens[i], b.Offsets[i] = 0xEEEEEEEE, 0xEEEEEEEE
	}
}

// BatchOf returns a batch (Go memory) holding pages.
func BatchOf(pages []byte) *codec.Batch {
	n := len(pages) / codec.PageSize
	b := codec.NewBatch(n)
	copy(b.Pages, pages)
	b.N = n
	return b
}
