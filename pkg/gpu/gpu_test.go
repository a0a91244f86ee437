package gpu

import (
	"bytes"
	"errors"
	"io"
	"log/slog"
	"math/rand/v2"
	"testing"

	"github.com/gzramd/gzramd/internal/lz4oracle"
	"github.com/gzramd/gzramd/pkg/codec"
)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// testPages returns n pages mixing text-like, zero, patterned and random
// content.
func testPages(n int, seed uint64) []byte {
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

// verifyBatch checks that every page of b decodes (or is raw) to want,
// with the CPU codec's decoder and, when the oracle is built in, with
// liblz4.
func verifyBatch(t *testing.T, b *codec.Batch, want []byte) {
	t.Helper()
	dec := codec.NewLZ4()
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
			t.Fatalf("page %d: %v", i, err)
		}
		if !bytes.Equal(page, orig) {
			t.Fatalf("page %d: round trip differs", i)
		}
		if lz4oracle.Available {
			clear(page)
			if err := lz4oracle.Decompress(page, c); err != nil || !bytes.Equal(page, orig) {
				t.Fatalf("page %d: does not decode with liblz4 (err %v)", i, err)
			}
		}
	}
}

func poison(b *codec.Batch) {
	for i := range b.Out {
		b.Out[i] = 0xA5
	}
	for i := range b.Lens {
		b.Lens[i], b.Offsets[i] = 0xEEEEEEEE, 0xEEEEEEEE
	}
}

func newBatchWith(pages []byte) *codec.Batch {
	n := len(pages) / codec.PageSize
	b := codec.NewBatch(n)
	copy(b.Pages, pages)
	b.N = n
	return b
}

func TestOpenReportsUnavailable(t *testing.T) {
	g, err := Open(Config{Device: 1 << 20, Logger: quiet})
	if err == nil {
		g.Close()
		t.Fatal("Open succeeded for a device index that cannot exist")
	}
	if !errors.Is(err, ErrUnavailable) {
		t.Fatalf("Open error %v does not wrap ErrUnavailable", err)
	}
	g, err = Open(Config{Logger: quiet})
	if err == nil {
		g.Close()
		t.Skip("a GPU is present; the no-GPU path is covered where there is none")
	}
	if !errors.Is(err, ErrUnavailable) {
		t.Fatalf("Open error %v does not wrap ErrUnavailable", err)
	}
	t.Logf("Open without a GPU: %v", err)
}

func TestOpenRejectsBadConfig(t *testing.T) {
	for _, c := range []Config{{Device: -1}, {Slots: -1}, {MaxBatchPages: 1 << 20}} {
		c.Logger = quiet
		if _, err := Open(c); err == nil || !errors.Is(err, ErrUnavailable) {
			t.Errorf("Open(%+v) = %v, want an ErrUnavailable error", c, err)
		}
	}
}

func TestMonitorUnavailable(t *testing.T) {
	m, err := OpenMonitor(1 << 20)
	if err == nil {
		m.Close()
		t.Fatal("OpenMonitor succeeded for a device index that cannot exist")
	}
	if !errors.Is(err, ErrUnavailable) {
		t.Fatalf("OpenMonitor error %v does not wrap ErrUnavailable", err)
	}
}

func TestFaultPlan(t *testing.T) {
	p := NewFaultPlan(map[FaultPoint][]int{FaultUpload: {2, 4}})
	var got []bool
	for range 5 {
		got = append(got, p.Fault(FaultUpload) != nil)
	}
	want := []bool{false, true, false, true, false}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("fault pattern %v, want %v", got, want)
		}
	}
	if p.Fault(FaultKernel) != nil || p.Count(FaultUpload) != 5 || p.Count(FaultKernel) != 1 {
		t.Fatal("FaultPlan counts wrong")
	}
}
