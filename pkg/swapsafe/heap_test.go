package swapsafe

import (
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"testing"
	"time"
)

// TestReserveHeapKeepsFreeMemory: after ReserveHeap, garbage churn and
// collections do not make the runtime give the reserve back (under
// mlockall that would replace it with pages that fault on next use), and
// GOGC is set so that the collector runs before the heap outgrows it.
func TestReserveHeapKeepsFreeMemory(t *testing.T) {
	t.Setenv("GOGC", "") // the test binary's environment must not override the pacing
	defer debug.SetGCPercent(debug.SetGCPercent(100))
	defer debug.SetMemoryLimit(debug.SetMemoryLimit(-1))
	const reserve = 16 << 20
	r, step := ReserveHeap(reserve)
	defer r.KeepAlive()
	if step.Err != nil {
		t.Fatal(step.Err)
	}
	t.Log(step.Done)
	if got := debug.SetGCPercent(gcPercentWithReserve); got != gcPercentWithReserve {
		t.Fatalf("GOGC %d after ReserveHeap, want %d", got, gcPercentWithReserve)
	}
	sample := []metrics.Sample{
		{Name: "/memory/classes/heap/released:bytes"},
		{Name: "/memory/classes/heap/free:bytes"},
	}
	metrics.Read(sample)
	released0 := sample[0].Value.Uint64()

	// Garbage of half the reserve per cycle, collected each time: the
	// daemon's own rate is far lower. Then time for the background
	// scavenger, which would give free memory above its goal back.
	var sink [][]byte
	for range 8 {
		for range reserve / 2 / (64 << 10) {
			sink = append(sink, make([]byte, 64<<10))
		}
		sink = nil
		runtime.GC()
		time.Sleep(10 * time.Millisecond)
	}
	runtime.KeepAlive(sink)
	runtime.GC()
	metrics.Read(sample)
	released, free := sample[0].Value.Uint64(), sample[1].Value.Uint64()
	t.Logf("heap released %d -> %d bytes, free %d", released0, released, free)
	if released > released0+reserve/8 {
		t.Errorf("the runtime gave back %d bytes of heap during the churn, want little (reserve %d)", released-released0, reserve)
	}
	if free < reserve/2 {
		t.Errorf("%d bytes of free heap kept, want about the reserve (%d)", free, reserve)
	}
}
