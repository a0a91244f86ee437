// Fault injection for the GPU tests: a cuda that fails or stalls chosen
// calls of the real driver, so that Backend needs no test hook.

package gpu

import (
	"errors"
	"sync"
	"time"
)

// FaultPoint names a kind of driver call a test can make fail.
type FaultPoint string

// The points faultyCUDA consults its plan at.
const (
	FaultAlloc    FaultPoint = "alloc"    // memAlloc, hostAlloc, hostRegister
	FaultUpload   FaultPoint = "upload"   // htod
	FaultKernel   FaultPoint = "kernel"   // a kernel launch
	FaultDownload FaultPoint = "download" // dtoh
	FaultSync     FaultPoint = "sync"     // streamSync
	// FaultHang stalls a stream at a compression kernel's launch: the
	// launch and everything queued after it on that stream reach the
	// device only after the hang, so a watchdog deadline fires while the
	// device still owns the bay and its copies land late.
	FaultHang FaultPoint = "hang"
)

// ErrInjected is the error FaultPlan injects.
var ErrInjected = errors.New("injected fault")

// FaultPlan fails the n-th time (1-based) a point is reached, for each
// point given. It is safe for concurrent use.
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

// Fault reports ErrInjected when this call of p is one to fail.
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

// faultyCUDA is the real driver with plan's faults injected.
type faultyCUDA struct {
	cuda
	plan    *FaultPlan
	hangFor time.Duration

	mu   sync.Mutex
	hung map[stream]*hang
}

// hang is a stalled stream's queue: calls issued to the driver in order
// once the hang ends, then done is closed.
type hang struct {
	queue []func() error
	err   error
	done  chan struct{}
}

// wrapFaults returns the wrap argument of open that injects plan's faults,
// hangs lasting hangFor.
func wrapFaults(plan *FaultPlan, hangFor time.Duration) func(cuda) cuda {
	return func(c cuda) cuda {
		return &faultyCUDA{cuda: c, plan: plan, hangFor: hangFor, hung: map[stream]*hang{}}
	}
}

// async runs call now, or queues it behind s's hang.
func (f *faultyCUDA) async(s stream, call func() error) error {
	f.mu.Lock()
	if h := f.hung[s]; h != nil {
		h.queue = append(h.queue, call)
		f.mu.Unlock()
		return nil
	}
	f.mu.Unlock()
	return call()
}

func (f *faultyCUDA) stall(s stream) {
	h := &hang{done: make(chan struct{})}
	f.mu.Lock()
	f.hung[s] = h
	f.mu.Unlock()
	go func() {
		time.Sleep(f.hangFor)
		f.mu.Lock()
		defer f.mu.Unlock()
		for _, call := range h.queue {
			if err := call(); err != nil && h.err == nil {
				h.err = err
			}
		}
		delete(f.hung, s)
		close(h.done)
	}()
}

func (f *faultyCUDA) memAlloc(n int) (devicePtr, error) {
	if err := f.plan.Fault(FaultAlloc); err != nil {
		return 0, err
	}
	return f.cuda.memAlloc(n)
}

func (f *faultyCUDA) hostAlloc(n int) ([]byte, error) {
	if err := f.plan.Fault(FaultAlloc); err != nil {
		return nil, err
	}
	return f.cuda.hostAlloc(n)
}

func (f *faultyCUDA) hostRegister(b []byte) error {
	if err := f.plan.Fault(FaultAlloc); err != nil {
		return err
	}
	return f.cuda.hostRegister(b)
}

func (f *faultyCUDA) htod(dst devicePtr, src []byte, s stream) error {
	if err := f.plan.Fault(FaultUpload); err != nil {
		return err
	}
	return f.async(s, func() error { return f.cuda.htod(dst, src, s) })
}

func (f *faultyCUDA) dtoh(dst []byte, src devicePtr, s stream) error {
	if err := f.plan.Fault(FaultDownload); err != nil {
		return err
	}
	return f.async(s, func() error { return f.cuda.dtoh(dst, src, s) })
}

func (f *faultyCUDA) memset32(dst devicePtr, v uint32, words int, s stream) error {
	return f.async(s, func() error { return f.cuda.memset32(dst, v, words, s) })
}

func (f *faultyCUDA) launchCompress(fn function, grid, block int, s stream, in devicePtr, n int,
	scratch, packed, packedSize, offsets, lens devicePtr) error {
	if f.plan.Fault(FaultHang) != nil {
		f.stall(s)
	}
	if err := f.plan.Fault(FaultKernel); err != nil {
		return err
	}
	return f.async(s, func() error {
		return f.cuda.launchCompress(fn, grid, block, s, in, n, scratch, packed, packedSize, offsets, lens)
	})
}

func (f *faultyCUDA) launchDecompress(fn function, grid, block int, s stream, in, offsets, lens devicePtr, n int,
	out, status devicePtr) error {
	if err := f.plan.Fault(FaultKernel); err != nil {
		return err
	}
	return f.async(s, func() error {
		return f.cuda.launchDecompress(fn, grid, block, s, in, offsets, lens, n, out, status)
	})
}

func (f *faultyCUDA) streamSync(s stream) error {
	if err := f.plan.Fault(FaultSync); err != nil {
		return err
	}
	f.mu.Lock()
	h := f.hung[s]
	f.mu.Unlock()
	if h != nil {
		<-h.done
		if h.err != nil {
			return h.err
		}
	}
	return f.cuda.streamSync(s)
}

func (f *faultyCUDA) streamQuery(s stream) error {
	f.mu.Lock()
	h := f.hung[s]
	f.mu.Unlock()
	if h != nil {
		return errNotReady
	}
	return f.cuda.streamQuery(s)
}
