// Fault injection points of the GPU path, for the GPU tests.

package gpu

import (
	"errors"
	"sync"
)

// FaultPoint names a step of the GPU path where a test can inject a
// failure.
type FaultPoint string

// The points at which Backend consults its FaultInjector.
const (
	FaultAlloc    FaultPoint = "alloc"    // buffer allocation (Open, NewBatch)
	FaultUpload   FaultPoint = "upload"   // host to device copy
	FaultKernel   FaultPoint = "kernel"   // kernel launch
	FaultDownload FaultPoint = "download" // device to host copy
	FaultSync     FaultPoint = "sync"     // waiting for the stream
	// FaultHang makes the stream really busy for Config.HangFor before
	// the compression kernel (a spinning kernel), so that a watchdog
	// deadline fires while the device still owns the slot.
	FaultHang FaultPoint = "hang"
)

// FaultInjector decides, at each FaultPoint, whether the step fails: a
// non-nil error is returned by the step as if the driver had failed.
type FaultInjector interface {
	Fault(p FaultPoint) error
}

// ErrInjected is the error FaultPlan injects.
var ErrInjected = errors.New("injected fault")

// FaultPlan is a FaultInjector that fails the n-th time (1-based) a point
// is reached, for each point given. It is safe for concurrent use.
type FaultPlan struct {
	mu    sync.Mutex
	at    map[FaultPoint]map[int]bool
	count map[FaultPoint]int
}

// NewFaultPlan returns a plan that fails point p on its calls listed in
// fails[p] (1-based).
func NewFaultPlan(fails map[FaultPoint][]int) *FaultPlan {
	f := &FaultPlan{at: map[FaultPoint]map[int]bool{}, count: map[FaultPoint]int{}}
	for p, ns := range fails {
		f.at[p] = map[int]bool{}
		for _, n := range ns {
			f.at[p][n] = true
		}
	}
	return f
}

// Fault implements FaultInjector.
func (f *FaultPlan) Fault(p FaultPoint) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.count[p]++
	if f.at[p][f.count[p]] {
		return ErrInjected
	}
	return nil
}

// Count returns how often point p was reached.
func (f *FaultPlan) Count(p FaultPoint) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.count[p]
}
