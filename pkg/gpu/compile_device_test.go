//go:build gpu

package gpu

import (
	"bytes"
	"context"
	"testing"

	"github.com/gzramd/gzramd/internal/testneeds"
	"github.com/gzramd/gzramd/pkg/codec"
)

// TestCompiledImage: the kernels compiled ahead (Compile, what `gzramd
// gpu-compile` runs) load as Config.Image, and the dense tier's
// (CompileDeep) as Config.DeepImage, and write the same bytes as the
// embedded PTX compiled in the process, for each algorithm.
func TestCompiledImage(t *testing.T) {
	pages := testneeds.Corpus(t)
	pages = pages[:min(len(pages), 4096*codec.PageSize)]
	for alg, batch := range batchKernels {
		img, err := Compile(0, alg)
		if err != nil {
			t.Fatalf("Compile(%s): %v", alg, err)
		}
		deepImg, err := CompileDeep(0)
		if err != nil {
			t.Fatalf("CompileDeep: %v", err)
		}
		compiled := openPTX(t, Config{Logger: quiet, Algorithm: alg, Image: img, DeepImage: deepImg}, nil, nil)
		if !compiled.Info().Compiled {
			t.Errorf("%s: a Backend opened with an image reports its kernels compiled in the process", alg)
		}
		jit := openPTX(t, Config{Logger: quiet, Algorithm: alg}, batch.ptx, nil)
		if jit.Info().Compiled {
			t.Errorf("%s: a Backend opened on PTX reports its kernels compiled ahead", alg)
		}
		// The dense tier's kernel is compiled ahead too: compiling its
		// PTX here would map the driver's PTX compiler.
		for _, g := range []*Backend{compiled, jit} {
			deep, err := g.DeepGroups()
			if err != nil {
				t.Fatalf("%s: DeepGroups: %v", alg, err)
			}
			if want := g.cfg.DeepImage != nil; deep.Compiled() != want {
				t.Errorf("%s: DeepGroups compiled ahead %v, want %v", alg, deep.Compiled(), want)
			}
		}
		per := compiled.MaxBatchPages()
		a, err := compiled.NewBatch(per)
		if err != nil {
			t.Fatal(err)
		}
		b, err := jit.NewBatch(per)
		if err != nil {
			t.Fatal(err)
		}
		total := len(pages) / codec.PageSize
		for lo := 0; lo < total; lo += per {
			n := min(per, total-lo)
			for _, x := range []*codec.Batch{a, b} {
				copy(x.Pages, pages[lo*codec.PageSize:(lo+n)*codec.PageSize])
				x.N = n
			}
			if err := compiled.CompressBatch(context.Background(), a); err != nil {
				t.Fatalf("%s, compiled ahead: %v", alg, err)
			}
			if err := jit.CompressBatch(context.Background(), b); err != nil {
				t.Fatalf("%s, PTX: %v", alg, err)
			}
			for i := range n {
				if !bytes.Equal(a.Compressed(i), b.Compressed(i)) {
					t.Fatalf("%s: page %d: %d bytes compiled ahead, %d from the PTX", alg, lo+i, len(a.Compressed(i)), len(b.Compressed(i)))
				}
			}
		}
		t.Logf("%s: image of %d bytes, %d pages compressed alike", alg, len(img), total)
	}
}
