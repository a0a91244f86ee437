package gpu

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"testing"

	"github.com/gzramd/gzramd/internal/testneeds"
	"github.com/gzramd/gzramd/kernels"
)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

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
		testneeds.Machine(t, "no GPU, and one is present here: the no-GPU path is covered where there is none")
	}
	if !errors.Is(err, ErrUnavailable) {
		t.Fatalf("Open error %v does not wrap ErrUnavailable", err)
	}
	t.Logf("Open without a GPU: %v", err)
}

func TestOpenRejectsBadConfig(t *testing.T) {
	for _, c := range []Config{{Device: -1}, {Bays: -1}, {MaxBatchPages: 1 << 20}} {
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

// TestLaunchShapesMatchPTX: every kernel a batch launches is in its PTX,
// declared for the threads a block pkg/gpu launches it with (.maxntid,
// from __launch_bounds__): a block of another size would fail to launch,
// or leave pages without a warp.
func TestLaunchShapesMatchPTX(t *testing.T) {
	for _, batch := range batchKernels {
		for _, k := range batch.kernels {
			checkLaunchShape(t, batch.ptx, k.name, k.pagesPerBlock)
		}
	}
	checkLaunchShape(t, kernels.LZ4, "gz_lz4_compress_objects", lz4ObjectWarps)
	for _, k := range zstdObjectKernels {
		checkLaunchShape(t, kernels.Zstd, k.name, max(k.pagesPerBlock, 1))
	}
	checkLaunchShape(t, kernels.LZ4, pageDecoders["lz4"].name, pageDecoders["lz4"].pagesPerBlock)
	checkLaunchShape(t, kernels.ZstdDecode, pageDecoders["zstd"].name, pageDecoders["zstd"].pagesPerBlock)
}

// checkLaunchShape checks that kernel name of ptx is declared for warps
// warps a block.
func checkLaunchShape(t *testing.T, ptx []byte, name string, warps int) {
	t.Helper()
	_, rest, ok := strings.Cut(string(ptx), ".entry "+name+"(")
	if !ok {
		t.Errorf("the PTX has no entry %s", name)
		return
	}
	var x, y, z int
	_, decl, _ := strings.Cut(rest, ".maxntid ")
	if _, err := fmt.Sscanf(decl, "%d, %d, %d", &x, &y, &z); err != nil {
		t.Errorf("%s declares no .maxntid: %v", name, err)
		return
	}
	if x != 32*warps || y != 1 || z != 1 {
		t.Errorf("%s is declared for %dx%dx%d threads a block, launched with %d", name, x, y, z, 32*warps)
	}
}
