// The Tier: its configuration, the groups' idle ages, its counters.

package dense

import (
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/gzramd/gzramd/pkg/codec"
)

// Config configures the dense tier.
type Config struct {
	// After is how long a group must go untouched (read or written)
	// before it is recompressed; 0 turns the tier off.
	After time.Duration
	// CPU is the share of one CPU the recompressor may use, from 0.01
	// to 1 (default 0.1): it sleeps in proportion to its work, as
	// zram's recompression is bounded by max_pages.
	CPU float64
	// Level is the frames' zstd level, 1 to 19 (default 5): higher
	// stores more for more of the recompressor's CPU, and reads cost
	// the same.
	Level int
}

const (
	// idleTicks is how many ticks of the ager (After/idleTicks) a group
	// must see without an access to be idle.
	idleTicks = 4
	// settledBit marks a group the recompressor has seen idle and left
	// as it is: dense already, or not worth it. An access clears it.
	settledBit = 1 << 31
	ageMask    = 0xff
	// slice is the work the recompressor does between two sleeps of its
	// budget.
	slice = 2 * time.Millisecond
)

// Tier is a device's dense tier: the groups' idle ages, which the
// device's reads and writes reset (Touch), and the recompressor (Run),
// with its memory, made with the tier and written by its goroutine alone.
// It owns no page: it reads and replaces a group's pages through its
// Device. A nil *Tier is a device without the tier: Touch, Run, SetGPU
// and Stats do nothing.
type Tier struct {
	cfg   Config
	dev   Device
	log   *slog.Logger
	pages uint32 // the device's
	codec string // the device's pages' codec, which a GPU may decode
	// ages holds, for each group, the ager's ticks since the group was
	// last accessed (ageMask bits) and settledBit.
	ages []atomic.Uint32
	comp *codec.ZstdObjects
	// Used by the recompressor's goroutine alone.
	raw    [GroupPages * PageSize]byte
	stream [GroupPages * PageSize]byte
	snap   Snapshot
	frames [MaxFrames]Frame

	// gpu, when set, recompresses groups in batches (SetGPU).
	gpu atomic.Pointer[gpuBatch]

	// The counters of Stats.
	groups, pagesIn, raced, kept atomic.Uint64
	bytesIn, bytesOut            atomic.Uint64
	onGPU, declined              atomic.Uint64
	busy, gpuTime                atomic.Int64 // nanoseconds
}

// New makes the dense tier of a device of pages pages, which it reaches
// through dev; pageCodec names the codec of the device's pages ("lz4",
// "zstd"), which a GPU that decodes it is given as stored. cfg.After must
// not be 0.
func New(cfg Config, pages uint32, pageCodec string, dev Device, log *slog.Logger) (*Tier, error) {
	if cfg.CPU == 0 {
		cfg.CPU = 0.1
	}
	if cfg.Level == 0 {
		cfg.Level = defaultLevel
	}
	switch {
	case cfg.After < 0:
		return nil, fmt.Errorf("device: dense tier after %v: want a duration above zero", cfg.After)
	case cfg.CPU < 0.01 || cfg.CPU > 1:
		return nil, fmt.Errorf("device: dense tier CPU share %v: want 0.01 to 1", cfg.CPU)
	case cfg.Level < 1 || cfg.Level > 19:
		return nil, fmt.Errorf("device: dense tier zstd level %d: want 1 to 19", cfg.Level)
	}
	comp, err := codec.NewZstdObjects(cfg.Level, FramePages*PageSize, FramePages*PageSize)
	if err != nil {
		return nil, fmt.Errorf("device: dense tier: %w", err)
	}
	t := &Tier{
		cfg:   cfg,
		dev:   dev,
		log:   log,
		pages: pages,
		codec: pageCodec,
		ages:  make([]atomic.Uint32, (pages+GroupPages-1)/GroupPages),
		comp:  comp,
	}
	// Written now, not first while serving: a fresh allocation's pages
	// are not faulted in until written, and every request touches its
	// group's age.
	for i := range t.ages {
		t.ages[i].Store(0)
	}
	clear(t.raw[:])
	clear(t.stream[:])
	return t, nil
}

// HeldBytes is the memory the tier holds: from the start, and its GPU
// batch once it has one.
func (t *Tier) HeldBytes() int64 {
	held := int64(len(t.ages))*4 + int64(len(t.raw)+len(t.stream)) + t.comp.HeldBytes()
	if q := t.gpu.Load(); q != nil {
		held += int64(len(q.b.Pages)+len(q.b.Out)) + int64(len(q.b.Offsets)+len(q.b.Lens)+len(q.packed.Offsets)+len(q.packed.Lens))*4 +
			int64(cap(q.snaps))*GroupPages*8
	}
	return held
}

// Touch marks the groups of [off, off+length), in bytes, accessed. The
// device calls it on every read and write, before it changes an entry.
func (t *Tier) Touch(off, length int64) {
	if t == nil || length <= 0 {
		return
	}
	first, last := off/PageSize>>GroupShift, (off+length-1)/PageSize>>GroupShift
	for g := first; g <= last; g++ {
		// Loaded first: a group read over and over is not written
		// over and over, nor its cache line taken from other cores.
		if a := &t.ages[g]; a.Load() != 0 {
			a.Store(0)
		}
	}
}

// Settled reports whether the recompressor has seen every group idle and
// left it settled, for tests and benchmarks that age a device.
func (t *Tier) Settled() bool {
	for i := range t.ages {
		if t.ages[i].Load()&settledBit == 0 {
			return false
		}
	}
	return true
}

// Stats are the dense tier's counters.
type Stats struct {
	// Groups recompressed, the pages they held, and the bytes those
	// took in the store before and after.
	Groups, Pages     uint64
	BytesIn, BytesOut uint64
	// Raced: groups written while being recompressed (the work is
	// dropped); Kept: groups that did not compress smaller.
	Raced, Kept uint64
	// Busy is the time the recompressor worked on the CPU.
	Busy time.Duration
	// OnGPU: groups compressed on the GPU (SetGPU); Declined: groups
	// the GPU gave back, compressed on the CPU; GPUTime: the time the
	// recompressor waited for the GPU.
	OnGPU, Declined uint64
	GPUTime         time.Duration
}

// Stats returns the tier's counters; zero for a nil Tier.
func (t *Tier) Stats() Stats {
	if t == nil {
		return Stats{}
	}
	return Stats{
		Groups: t.groups.Load(), Pages: t.pagesIn.Load(),
		BytesIn: t.bytesIn.Load(), BytesOut: t.bytesOut.Load(),
		Raced: t.raced.Load(), Kept: t.kept.Load(),
		Busy:  time.Duration(t.busy.Load()),
		OnGPU: t.onGPU.Load(), Declined: t.declined.Load(),
		GPUTime: time.Duration(t.gpuTime.Load()),
	}
}
