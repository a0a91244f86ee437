package zstdpage

import (
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/gzramd/gzramd/internal/testneeds"
)

// TestSweep measures the corpus ratio over match-finder settings; it runs
// only with ZSTDPAGE_SWEEP set ("1": the default grid; else a list of
// "mm,repmin,depth,lazy,hashbits" entries separated by spaces), on every
// ZSTDPAGE_SWEEP_STEP-th page. The compile-time constants (ZP_GAIN_BYTE,
// ZP_LAZY1, ...) can be varied with CGO_CFLAGS, e.g.
//
//	CGO_CFLAGS="-O2 -DZP_GAIN_BYTE=4" ZSTDPAGE_SWEEP="4,3,16,2,10" go test -run TestSweep -v ./internal/zstdpage
func TestSweep(t *testing.T) {
	spec := testneeds.Env(t, "ZSTDPAGE_SWEEP", `measures the corpus ratio over match-finder settings, "1" for the default grid`)
	pages := testneeds.Corpus(t)
	var idx []int
	step := 1
	if s := os.Getenv("ZSTDPAGE_SWEEP_STEP"); s != "" {
		step, _ = strconv.Atoi(s)
	}
	for i := 0; i < len(pages)/PageSize; i += step {
		if !isZero(pages[i*PageSize : (i+1)*PageSize]) {
			idx = append(idx, i)
		}
	}
	var grid []Options
	if spec == "1" {
		for _, mm := range []int{4, 5} {
			for _, depth := range []int{1, 4, 16, 64} {
				for _, lazy := range []int{-1, 1, 2} {
					grid = append(grid, Options{MinMatch: mm, Depth: depth, Lazy: lazy})
				}
			}
		}
	} else {
		for _, e := range strings.Fields(spec) {
			f := strings.Split(e, ",")
			v := make([]int, 5)
			for i := range f {
				v[i], _ = strconv.Atoi(f[i])
			}
			grid = append(grid, Options{MinMatch: v[0], RepMin: v[1], Depth: v[2], Lazy: v[3], HashBits: v[4]})
		}
	}
	ref, _ := ratioOf(t, pages, idx, zstdComp(1))
	t.Logf("libzstd -1: %.4f", ref)
	for _, o := range grid {
		r, _ := ratioOf(t, pages, idx, zpComp(o, false))
		t.Logf("%+v: %.4f", o, r)
	}
}

// TestLevels reports libzstd's ratio at several levels on the same pages
// as TestSweep (with ZSTDPAGE_SWEEP set).
func TestLevels(t *testing.T) {
	testneeds.Env(t, "ZSTDPAGE_SWEEP", "reports libzstd's corpus ratio at several levels, on TestSweep's pages")
	pages := testneeds.Corpus(t)
	step := 1
	if s := os.Getenv("ZSTDPAGE_SWEEP_STEP"); s != "" {
		step, _ = strconv.Atoi(s)
	}
	var idx []int
	for i := 0; i < len(pages)/PageSize; i += step {
		if !isZero(pages[i*PageSize : (i+1)*PageSize]) {
			idx = append(idx, i)
		}
	}
	for _, l := range []int{1, 3, 5, 9, 12, 16, 19} {
		r, _ := ratioOf(t, pages, idx, zstdComp(l))
		t.Logf("libzstd level %d: %.4f", l, r)
	}
}
