// The work done beside serving.

package serving

import (
	"context"
	"log/slog"
	"time"

	"github.com/gzramd/gzramd/pkg/pipeline"
	"github.com/gzramd/gzramd/pkg/swapsafe"
)

// background is the work done beside serving: compaction, the dense tier,
// keeping the heap locked, watching the prefault. It owns their
// goroutines, from start until the stop it returns.
type background struct {
	pipe     *pipeline.Pipeline
	reserve  *swapsafe.HeapReserve // nil unless hardened
	lockHeap bool                  // mlockall took, so the heap is kept locked too
	prefault Size
	log      *slog.Logger
}

// start starts the work. The func it returns stops it, and waits for the
// goroutines that use the store.
func (b *background) start() (stop func()) {
	// Trims and rewrites leave slabs sparse; give whole slabs back to the
	// OS when the waste is worth the copying.
	compactCtx, stopCompactor := context.WithCancel(context.Background())
	compactorDone := make(chan struct{})
	go func() {
		defer close(compactorDone)
		b.pipe.Device.RunCompactor(compactCtx, compactPolicy())
	}()
	// Groups of pages left idle go to the dense tier (--dense-after).
	denseDone := make(chan struct{})
	go func() {
		defer close(denseDone)
		b.pipe.Device.RunDense(compactCtx)
	}()

	stopLock := func() {}
	if b.reserve != nil && b.lockHeap {
		var lockCtx context.Context
		lockCtx, stopLock = context.WithCancel(context.Background())
		go b.reserve.KeepHeapLocked(lockCtx, 250*time.Millisecond, func(err error) {
			b.log.Warn("keeping the Go heap locked", "err", err)
		})
	}
	watchCtx, stopWatch := context.WithCancel(context.Background())
	go b.watchPrefault(watchCtx)
	return func() {
		stopWatch()
		stopLock()
		stopCompactor()
		<-compactorDone // before the daemon's close unmaps the store
		<-denseDone
	}
}

// watchPrefault logs when writers needed store memory before the
// prefaulter had faulted it in: they wait for it, and a write fails
// (ENOSPC: the kernel keeps the page) where it does not come within
// pagestore.PrefaultWait. Faulting it in themselves is how a freeze under
// memory pressure starts. It logs too when writes faulted in pages of the
// page table ahead of gzramd-table (writes far from the others: not swap's
// way).
func (b *background) watchPrefault(ctx context.Context) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	var seen int64
	var late uint64
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		st := b.pipe.Device.Stats()
		if n := st.PrefaultMisses; n > seen {
			b.log.Warn("writers waited for store memory to be prefaulted; raise --prefault if this repeats under load",
				"waits", n-seen, "total", n, "prefault", b.prefault.String())
			seen = n
		}
		if n := st.TableLate; n > late {
			b.log.Warn("writes faulted in pages of the page table themselves, beyond those faulted in ahead of the writes; under swap this is worth reporting",
				"pages", n-late, "total", n)
			late = n
		}
	}
}
