package gpu

import (
	"errors"
	"io"
	"log/slog"
	"testing"
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
