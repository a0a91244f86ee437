// The ublk device this process serves the kernel (--transport ublk).

package serving

import (
	"context"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/gzramd/gzramd/pkg/blockdev"
	"github.com/gzramd/gzramd/pkg/metrics"
	"github.com/gzramd/gzramd/pkg/ublk"
)

// ublkDevice is the ublk device the daemon serves the kernel
// (--transport ublk): ublk.Serve (or ublk.Recover, for one taken over)
// runs until stop, then removes it, or leaves it to the next serving
// process (ublk.ErrLeave).
type ublkDevice struct {
	dev     ublk.Device
	ctx     context.Context // Serve's: done once stop was called
	stop    context.CancelCauseFunc
	stopped chan struct{} // closed once Serve returned, err set
	err     error
}

// ublkServer owns the daemon's ublk device, from its creation or
// takeover (serve) to its removal (stop) or its handing to the next
// serving process (leave); /status and the metrics read it meanwhile
// (current). It is given the backend both transports serve, its queues'
// depth and whether they are the kernel's IO flushers (--harden), the
// counter of its requests and the log.
type ublkServer struct {
	backend   blockdev.Backend
	depth     int // each queue's (--ublk-depth; 0: ublk's default)
	ioFlusher bool
	requests  *metrics.Ublk // nil: not counted
	log       *slog.Logger
	dev       atomic.Pointer[ublkDevice] // nil until served
}

// current is the device being served, or nil.
func (s *ublkServer) current() *ublkDevice { return s.dev.Load() }

// serve creates the device, or takes over the one with id (taken) that the
// serving process before this one left, and returns once it is live.
func (s *ublkServer) serve(ctx context.Context, tag uint64, recoverable bool, id int, taken bool) (ublk.Device, error) {
	// Not ctx: the device must outlive a cancelled start until stop has
	// turned its swap off.
	sctx, cancel := context.WithCancelCause(context.WithoutCancel(ctx))
	u := &ublkDevice{ctx: sctx, stop: cancel, stopped: make(chan struct{})}
	ready := make(chan ublk.Device, 1)
	cfg := ublk.Config{
		// Serving swap: its queues' allocations must not wait for the
		// writes they would serve (the rest of swap safety is the
		// process's, pkg/swapsafe, as for NBD).
		Depth:       s.depth,
		IOFlusher:   s.ioFlusher,
		Recoverable: recoverable,
		Tag:         tag,
		Ready:       func(dev ublk.Device) { ready <- dev },
	}
	if s.requests != nil {
		cfg.Observer = s.requests
	}
	go func() {
		if taken {
			u.err = ublk.Recover(sctx, cfg, id, s.backend)
		} else {
			u.err = ublk.Serve(sctx, cfg, s.backend)
		}
		close(u.stopped)
	}()
	select {
	case u.dev = <-ready:
	case <-u.stopped:
		cancel(nil)
		if taken {
			return ublk.Device{}, fmt.Errorf("--transport ublk: taking over /dev/ublkb%d: %w", id, u.err)
		}
		return ublk.Device{}, fmt.Errorf("--transport ublk: %w", u.err)
	}
	s.dev.Store(u)
	go s.watch(u)
	return u.dev, nil
}

// MaxUblkDepth is the most requests a ublk queue may hold (--ublk-depth).
const MaxUblkDepth = ublk.MaxQueueDepth

// unsupervisedTag tags the ublk devices gzramd serves without a
// supervisor ("gzramd"): a device one of them left when it died is
// stopped by the driver and kept until deleted, and the next start
// deletes it (removeLeft).
const unsupervisedTag = 0x646d61727a67

// removeLeft deletes the ublk devices unsupervised gzramds left when
// they died: stopped, their disks and swap gone with them, kept by the
// driver until deleted.
func (s *ublkServer) removeLeft() {
	ids, err := ublk.RemoveLeft("", unsupervisedTag)
	for _, id := range ids {
		s.log.Warn("removed a ublk device a gzramd left when it died without a supervisor (what was swapped there was lost then)",
			"device", fmt.Sprintf("/dev/ublkb%d", id))
	}
	if err != nil {
		s.log.Warn("removing ublk devices left by dead gzramds", "err", err)
	}
}

// waiting finds the ublk device a serving process before this one left
// with the state this one took over, tagged tag, if one waits.
func (s *ublkServer) waiting(tag uint64) (int, bool) {
	id, quiesced, err := ublk.Find("", tag)
	if err != nil {
		s.log.Warn("no ublk device waits for this state; creating one afresh", "why", err)
		return 0, false
	}
	s.log.Info("taking over the ublk device the serving process before this one left", "device", fmt.Sprintf("/dev/ublkb%d", id), "quiesced", quiesced)
	return id, true
}

// watch logs the ublk device's end if it comes before stop asked for it:
// a queue failed, and the kernel device fails its I/O.
func (s *ublkServer) watch(u *ublkDevice) {
	<-u.stopped
	if u.ctx.Err() == nil {
		s.log.Error("the ublk device stopped serving on its own: its I/O fails from now on", "device", u.dev.Block, "err", u.err)
	}
}

// stop stops and removes the ublk device, once swap on it is off.
func (s *ublkServer) stop() {
	u := s.dev.Load()
	if u == nil {
		return
	}
	u.stop(nil)
	<-u.stopped
	if u.err != nil {
		s.log.Error("removing the ublk device", "device", u.dev.Block, "err", u.err)
		return
	}
	s.log.Info("kernel device removed", "transport", TransportUblk, "device", u.dev.Block)
}

// leave leaves the ublk device to the next serving process at a handover:
// the requests in hand are answered, and the kernel holds the rest for
// the next, which takes the device over. Swap stays on.
func (s *ublkServer) leave() {
	u := s.dev.Load()
	if u == nil {
		return
	}
	start := time.Now()
	u.stop(ublk.ErrLeave)
	<-u.stopped
	if u.err != nil {
		s.log.Error("leaving the ublk device to the next serving process", "device", u.dev.Block, "err", u.err)
		return
	}
	s.log.Info("ublk device left to the next serving process", "device", u.dev.Block, "took", time.Since(start).Round(time.Millisecond))
}
